package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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
	bin := harness.BuildBinary(t, "./cmd/nv-ipam")
	cmd := exec.Command(bin)
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
