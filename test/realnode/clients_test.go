package realnode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Issue 46, item 4: controller-runtime prints "log.SetLogger(...) was never
// called" and a goroutine stack trace when its log is used 30 s after the
// process started without a logger set: the first client of `make demo` did,
// in the middle of its output. Client now sets one first (the node's
// logs/clients.log): in a process that makes a client, controller-runtime's log
// reaches that file, and nothing is printed.
func TestClientSetsControllerRuntimesLog(t *testing.T) {
	if dir := os.Getenv("HWIPAM_CLIENT_CHILD_DIR"); dir != "" {
		c := &Cluster{Dir: dir, Config: &rest.Config{Host: "http://127.0.0.1:1"}}
		if _, err := c.Client(); err != nil {
			os.Exit(3)
		}
		ctrllog.Log.WithName("probe").Info("controller-runtime's log has a sink")
		os.Exit(0)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClientSetsControllerRuntimesLog$")
	cmd.Env = append(os.Environ(), "HWIPAM_CLIENT_CHILD_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child: %v\n%s", err, out)
	}
	if len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("making a client printed:\n%s", out)
	}
	logged, err := os.ReadFile(filepath.Join(dir, "logs", "clients.log"))
	if err != nil || !strings.Contains(string(logged), "controller-runtime's log has a sink") {
		t.Errorf("controller-runtime's log did not reach logs/clients.log (%v): %q; without a logger it prints a stack "+
			"trace 30 s after start", err, logged)
	}
}
