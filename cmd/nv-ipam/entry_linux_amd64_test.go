package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hwipam/hwipam/test/harness"
)

// TestEntryStartsTheRuntimeOnOneCPU: the plugin, built as the Makefile builds it,
// starts the Go runtime on the one CPU it was exec'd on (the threads the runtime
// makes before main carry that CPU alone), and main gives its thread back the
// whole CPU set before it reads its config.
func TestEntryStartsTheRuntimeOnOneCPU(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: there is nothing to narrow")
	}
	makefile, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "-E main.entry") || !strings.Contains(string(makefile), "$(PLUGIN_LDFLAGS)") {
		t.Fatalf("the Makefile does not link the plugin with %q", harness.PluginEntryFlag)
	}
	cmd := exec.Command(harness.BuildBinary(t, "./cmd/nv-ipam"))
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=entry-test", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=net1", "CNI_PATH=/nonexistent"}
	stdin, err := cmd.StdinPipe() // held open: the plugin waits in its read of the config
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The main thread (its ID is the process's) in read(0, ...).
		if b, err := os.ReadFile(filepath.Join(proc, "syscall")); err == nil && strings.HasPrefix(string(b), "0 0x0 ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plugin never waited for its config on stdin")
		}
		time.Sleep(time.Millisecond)
	}
	if got, ours := readTrimmed(t, filepath.Join(proc, "timerslack_ns")), readTrimmed(t, "/proc/self/timerslack_ns"); got != ours {
		t.Errorf("the plugin's main thread has a timer slack of %s ns, want %s (what it was started with)", got, ours)
	}
	ours := cpusAllowed(t, "/proc/thread-self")
	if got := cpusAllowed(t, filepath.Join(proc, "task", strconv.Itoa(cmd.Process.Pid))); got != ours {
		t.Errorf("the plugin's main thread may run on CPUs %s, want %s (all of the CPUs it was started with)", got, ours)
	}
	tasks, err := os.ReadDir(filepath.Join(proc, "task"))
	if err != nil {
		t.Fatal(err)
	}
	narrowed := 0
	for _, task := range tasks {
		if got := cpusAllowed(t, filepath.Join(proc, "task", task.Name())); got != ours && !strings.ContainsAny(got, ",-") {
			narrowed++
		}
	}
	if narrowed == 0 {
		t.Errorf("none of the plugin's %d threads was made on one CPU: the runtime did not start on one", len(tasks))
	}
	t.Logf("%d threads, %d made on one CPU", len(tasks), narrowed)
}

func cpusAllowed(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in %s/status", dir)
	return ""
}

// TestEntryQuietsSysmon: the runtime's sysmon thread, which the entry point
// gives a 10 ms timer slack, does not wake every 20 µs while the plugin works.
// The plugin reads a 30 MB network config (from a file: it never waits for
// it) and parses it, tens of milliseconds of CPU, then fails to reach a daemon.
// Without the slack, sysmon sleeps 20 µs at a time for that work's first
// millisecond, then twice as long each time up to 10 ms: 60 and more
// voluntary context switches in all (measured: 69 and 70 for 80 ms of CPU);
// with it, about one per 10 ms and the few of the runtime's start-up (12 and 13).
func TestEntryQuietsSysmon(t *testing.T) {
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "big", "pad": %q, "ipam": {"type": "nv-ipam", "daemonSocket": "unix:///nonexistent/daemon.sock"}}`,
		strings.Repeat("a", 30<<20))
	stdin := filepath.Join(t.TempDir(), "conf.json")
	if err := os.WriteFile(stdin, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(harness.BuildBinary(t, "./cmd/nv-ipam"))
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=entry-test", "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=net1", "CNI_PATH=/nonexistent",
		"CNI_ARGS=K8S_POD_NAME=p;K8S_POD_NAMESPACE=default"}
	cmd.Stdin = f
	out, err := cmd.Output()
	if err == nil || !strings.Contains(string(out), "not reachable") {
		t.Fatalf("ADD without a daemon: %v, printed %s; want a failure to reach it", err, out)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	// One wake per 5 ms of CPU and 25 for start-up: twice what a quiet machine
	// shows (make test runs 4 packages at a time on 2 cores, measured 33 for
	// 95 ms of CPU), still well under what sysmon does without the slack.
	limit := 25 + int64(cpu/(5*time.Millisecond))
	t.Logf("%v of CPU, %d voluntary context switches (at most %d)", cpu, ru.Nvcsw, limit)
	if ru.Nvcsw > limit {
		t.Errorf("%d voluntary context switches in %v of CPU, want at most %d: sysmon wakes as often as without the entry point's timer slack",
			ru.Nvcsw, cpu, limit)
	}
}

func readTrimmed(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
