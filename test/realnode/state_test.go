package realnode

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestOverrideArgs(t *testing.T) {
	got := overrideArgs([]string{"--a=1", "--b=2", "--v=1"}, []string{"--b=3", "--c=4"})
	want := []string{"--a=1", "--b=3", "--v=1", "--c=4"}
	if !slices.Equal(got, want) {
		t.Fatalf("overrideArgs = %q, want %q", got, want)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/plain`:         "/tmp/plain",
		`/tmp/with\040space`: "/tmp/with space",
		`/tmp/tab\011x`:      "/tmp/tab\tx",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// A process is recognised by PID and start time: a reaped one, or a PID now used by
// another process, is not alive.
func TestProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := Process{Name: "sleep", PID: cmd.Process.Pid, Start: procStart(cmd.Process.Pid)}
	if !p.alive() {
		t.Fatal("a running process is not alive")
	}
	if (Process{PID: p.PID, Start: p.Start + 1}).alive() {
		t.Fatal("a process with another start time is alive")
	}
	go func() { _ = cmd.Wait() }()
	p.stop(0)
	if p.alive() {
		t.Fatal("a stopped process is alive")
	}
}

// Teardown of a saved state: processes stopped, the run directory removed; loading it
// again afterwards fails with os.ErrNotExist.
func TestStateTeardown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	s := &State{Dir: dir, Processes: []Process{{Name: "sleep", PID: cmd.Process.Pid, Start: procStart(cmd.Process.Pid)}}}
	if err := s.save(); err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Running() {
		t.Fatal("the loaded state's process is not running")
	}
	if err := loaded.Teardown(false); err != nil {
		t.Fatal(err)
	}
	if loaded.Running() {
		t.Fatal("still running after Teardown")
	}
	if _, err := LoadState(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadState after Teardown: %v, want not found", err)
	}
}
