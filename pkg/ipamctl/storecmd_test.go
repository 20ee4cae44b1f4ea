package ipamctl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/pkg/ipamctl"
	"github.com/hwipam/hwipam/pkg/store"
)

// TestStoreExport: the rollback's command exports in place, keeps the hwipam
// store, and says what nv-ipam's format does not keep; mistakes are usage
// errors (exit 2) that say what to give.
func TestStoreExport(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "store")
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit([]store.Put{{PoolKey: "cidrpool/c1", Allocation: store.Allocation{ContainerID: "c1", IfName: "net1",
		IP: "10.4.0.2", PodName: "p", PodNamespace: "ns", Network: "n1", Rail: "r1", CreateTime: time.Now()}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"store", "export", "--store-file", path, "--in-place"},
		{"store", "export", "--format", "json", "--store-file", path, "--in-place"},
		{"store", "export", "--format", "nv-ipam", "--store-file", path},
		{"store", "export", "--format", "nv-ipam", "--store-file", path, "--in-place", "-o", "x"},
		{"store", "export", "--format", "nv-ipam", "--store-file", path, "-o", path},
	} {
		_, err := run(t, args...)
		if !ipamctl.IsUsageError(err) || ipamctl.ExitCode(err) != ipamctl.ExitUsage {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	out, err := run(t, "store", "export", "--format", "nv-ipam", "--store-file", path, "--in-place")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exported 1 allocation(s) in 1 pool(s)", "kept as " + path + ".hwipam", "CNI network", "rail"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"cidrpool/c1":{"name":"c1"`) {
		t.Errorf("the store is now %s (%v)", data, err)
	}
	if _, err := os.Stat(path + ".hwipam"); err != nil {
		t.Error(err)
	}
	_, err = run(t, "store", "export", "--format", "nv-ipam", "--store-file", path, "--in-place")
	if err == nil || !strings.Contains(err.Error(), "already an nv-ipam JSON store") || ipamctl.ExitCode(err) != ipamctl.ExitProblems {
		t.Errorf("a second export: %v", err)
	}
}
