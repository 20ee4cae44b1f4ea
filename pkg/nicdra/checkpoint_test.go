package nicdra_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// A checkpoint saved is read back the same, by a new CheckpointFile as a
// restarted driver has it; a missing one is empty; nothing but it is left in
// its directory.
func TestCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	f := nicdra.CheckpointFile{Path: filepath.Join(dir, "checkpoint.json")}
	empty, err := f.Load()
	if err != nil || len(empty.Claims) != 0 {
		t.Fatalf("missing checkpoint: %+v %v", empty, err)
	}
	c := &nicdra.Checkpoint{BootID: "b1", Claims: map[types.UID]nicdra.PreparedClaim{
		"uid-1": {Namespace: "default", Name: "nic", State: nicdra.PrepareCompleted, Devices: []nicdra.PreparedDevice{{
			Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", HostNetdev: "ibp24s0", MTU: 4092,
			InterfaceName: "net1", Pools: []string{"rail0"}, PoolType: "ippool", Rail: "ibp24s0",
			Addresses: []string{"10.24.0.3/16"}, Gateway: "10.24.0.1", Routes: []string{"10.0.0.0/8"}, MAC: "00:11:22:33:44:55"}}},
		"uid-2": {Namespace: "ml", Name: "pair", State: nicdra.PrepareStarted},
	}}
	for range 2 { // the second save replaces the first
		if err := f.Save(c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := nicdra.CheckpointFile{Path: f.Path}.Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Version = 2; !reflect.DeepEqual(got, c) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, c)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d files, want only the checkpoint", len(entries))
	}
}

// A damaged checkpoint, or one of another format, is an error that names the
// file and says what to do; it is never taken for an empty one.
func TestCheckpointRefused(t *testing.T) {
	for _, c := range []struct{ content, want string }{
		{`{"version": 1, "claims": {`, "is damaged"},
		{`{"version": 4, "claims": {}}`, "has format version 4"},
		{`{"version": 0, "claims": {}}`, "has format version 0"},
	} {
		path := filepath.Join(t.TempDir(), "checkpoint.json")
		if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := nicdra.CheckpointFile{Path: path}.Load()
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file and saying %q", c.content, err, c.want)
		}
	}
	// A directory that cannot be written: the save fails and says where.
	err := nicdra.CheckpointFile{Path: filepath.Join(t.TempDir(), "missing", "checkpoint.json")}.Save(&nicdra.Checkpoint{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("save into a missing directory: %v", err)
	}
}

// A checkpoint an earlier ipam-node wrote (version 1) is read, and written
// back as version 2, which that ipam-node refuses rather than misreads
// (issue 45).
func TestCheckpointOfAnEarlierVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	v1 := `{"version": 1, "bootID": "b1", "claims": {"uid-1": {"namespace": "ml", "name": "nic", "state": "PrepareStarted"}}}`
	if err := os.WriteFile(path, []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	f := nicdra.CheckpointFile{Path: path}
	c, err := f.Load()
	if err != nil {
		t.Fatalf("a version 1 checkpoint: %v", err)
	}
	if pc := c.Claims["uid-1"]; pc.Name != "nic" || pc.State != nicdra.PrepareStarted {
		t.Fatalf("read %+v", c.Claims)
	}
	if err := f.Save(c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"version":2`) {
		t.Errorf("written back as %s, want version 2", b)
	}
}

func TestBootID(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "proc", "sys", "kernel", "random")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte("0f1e2d3c\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	if id, err := nicdra.BootID(root); err != nil || id != "0f1e2d3c" {
		t.Errorf("boot ID %q %v", id, err)
	}
	if id, err := nicdra.BootID("/"); err != nil || len(id) < 8 {
		t.Errorf("this node's boot ID %q %v", id, err)
	}
}
