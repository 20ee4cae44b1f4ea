package realnode_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClaimHostStateDir: the nicclusterpolicy specs take /var/lib/cni/nv-ipam only
// when nothing but an earlier test run's leftovers is there, and give back exactly
// what they took.
func TestClaimHostStateDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "cni", "nv-ipam")
	log := filepath.Join(root, "nv-ipam-cni.log")

	release, err := claimHostStateDir(dir, log, filepath.Join(root, "gone-run"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(log, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "store"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Dir(dir), log} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after release: %v", p, err)
		}
	}

	// A leftover claim of a run that is no longer running is taken over.
	if _, err := claimHostStateDir(dir, log, filepath.Join(root, "gone-run")); err != nil {
		t.Fatal(err)
	}
	if _, err := claimHostStateDir(dir, log, filepath.Join(root, "next-run")); err != nil {
		t.Errorf("a dead run's claim was not taken over: %v", err)
	}

	// Someone else's state is refused, and left as it is.
	foreign := filepath.Join(root, "foreign")
	if err := os.MkdirAll(foreign, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, "store"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = claimHostStateDir(foreign, log, filepath.Join(root, "run"))
	if err == nil || !strings.Contains(err.Error(), "refusing to run") {
		t.Errorf("claiming a directory with foreign state: %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Join(foreign, "store")); err != nil {
		t.Errorf("the foreign state was touched: %v", err)
	}
}
