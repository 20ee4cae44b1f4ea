package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMain lets the test binary be the demo itself (HWIPAM_DEMO_AS_MAIN=1), so
// that TestDemoIsQuiet runs make demo's steps as separate processes.
func TestMain(m *testing.M) {
	if os.Getenv("HWIPAM_DEMO_AS_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// failureLike are what a newcomer reads as a failure in the demo's output: a
// goroutine stack (controller-runtime's "log.SetLogger(...) was never called"
// printed one), a panic, a klog error or warning line, or the words.
var failureLike = regexp.MustCompile(`goroutine \d+ \[|was never called|panic:|^\s*[EWF]\d{4} \d\d:\d\d:\d\d|(?i)\b(error|fail(ed|ure)?|warning)\b`)

// make demo's steps, up then down, as `make demo` and `make demo-down` run them
// (the repository as the working directory, the test assets in the
// environment), print nothing that looks like a failure when nothing failed
// (issue 46, item 4).
func TestDemoIsQuiet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the demo runs a real kubelet and containerd: run as root (make test does)")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal(`KUBEBUILDER_ASSETS is not set: eval "$(hack/test-assets.sh env)" (make test does)`)
	}
	dir, err := os.MkdirTemp("/tmp", "hwd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	run := func(step string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0], step)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "HWIPAM_DEMO_AS_MAIN=1", "HWIPAM_DEMO_DIR="+dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		t.Logf("demo %s:\n%s", step, out.String())
		if err != nil {
			t.Fatalf("demo %s: %v", step, err)
		}
		return out.String()
	}
	down := false
	t.Cleanup(func() {
		if !down {
			run("down")
		}
	})
	out := map[string]string{"up": run("up")}
	out["down"], down = run("down"), true
	if !strings.Contains(out["up"], "ready in") || !strings.Contains(out["up"], "== each pool's blocks") ||
		!strings.Contains(out["down"], "demo stopped") {
		t.Errorf("the demo printed neither its ready line, the pools' blocks, nor that it stopped")
	}
	for _, step := range []string{"up", "down"} {
		for _, l := range strings.Split(out[step], "\n") {
			if failureLike.MatchString(l) {
				t.Errorf("demo %s printed a line that reads as a failure: %q", step, l)
			}
		}
	}
}

// failureLike tells the demo's own lines from what reads as a failure: the
// message and stack controller-runtime printed in the middle of the demo, a
// klog error, a panic.
func TestFailureLikeLines(t *testing.T) {
	for line, want := range map[string]bool{
		"[controller-runtime] log.SetLogger(...) was never called; logs will not be displayed.": true,
		"\t>  goroutine 1 [running]:":                                                                                  true,
		`E1129 16:45:13.123456   12345 reflector.go:200] "Failed to watch"`:                                            true,
		"W1129 16:45:13.123456   12345 warnings.go:70] unknown field":                                                  true,
		"panic: runtime error: invalid memory address":                                                                 true,
		"[demo 16:45:51] ready in 38s":                                                                                 false,
		"[demo 16:45:41]   NIC labels published by ipam-node                                0.0s":                      false,
		"  net1   10.24.0.2/16       demo-ibp24s0":                                                                     false,
		"  # ipamctl in the ipam-node pod (it asks the daemon for its paths and its NIC view, the demo's sysfs tree):": false,
		"[demo 16:45:58] demo stopped; processes, mounts, links, iptables rules, cgroups and /tmp/x removed":           false,
		"demo: waiting for pods: context deadline exceeded (error)":                                                    true,
	} {
		if got := failureLike.MatchString(line); got != want {
			t.Errorf("failureLike(%q) = %v, want %v", line, got, want)
		}
	}
}
