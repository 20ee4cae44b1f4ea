package fakesysfs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

// Functions behind bridges are nested as in real sysfs, the bus links resolve
// to the nested directories, and removing a switch takes what is behind it.
func TestBridgeHierarchy(t *testing.T) {
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bus := filepath.Join(tree.Root, "sys", "bus", "pci", "devices")
	for addr, want := range map[string]string{
		"0000:15:01.0": "../../../devices/pci0000:15/0000:15:01.0",
		"0000:18:00.0": "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
		"0000:19:00.0": "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0",
		"0000:e1:00.1": "../../../devices/pci0000:de/0000:de:01.0/0000:df:00.0/0000:e0:00.0/0000:e1:00.1",
	} {
		got, err := os.Readlink(filepath.Join(bus, addr))
		if err != nil || got != want {
			t.Errorf("%s links to %q (%v), want %q", addr, got, err, want)
		}
	}
	for file, want := range map[string]string{"class": "0x060400", "vendor": "0x1000", "device": "0xc030"} {
		if b, err := os.ReadFile(filepath.Join(bus, "0000:16:00.0", file)); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("switch upstream port %s = %q (%v), want %q", file, b, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(bus, "0000:19:00.0", "class")); err != nil || strings.TrimSpace(string(b)) != "0x030200" {
		t.Errorf("H100 class %q (%v)", b, err)
	}
	if err := tree.Remove("0000:16:00.0"); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{
		filepath.Join(bus, "0000:18:00.0"), filepath.Join(bus, "0000:19:00.0"), filepath.Join(bus, "0000:17:01.0"),
		filepath.Join(tree.Root, "sys", "class", "net", "ibp24s0"), filepath.Join(tree.Root, "sys", "class", "infiniband", "mlx5_0"),
	} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there after its switch was removed (%v)", gone, err)
		}
	}
	if _, err := os.Stat(filepath.Join(bus, "0000:15:01.0")); err != nil {
		t.Errorf("the root port went with the switch: %v", err)
	}
}

// A VF's directory is its PF's sibling; a function without a parent stays
// directly under the root complex named after its bus.
func TestVFBesideItsPF(t *testing.T) {
	tree, err := fakesysfs.SRIOV(t.TempDir(), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	bus := filepath.Join(tree.Root, "sys", "bus", "pci", "devices")
	for addr, want := range map[string]string{
		"0000:3b:00.0": "../../../devices/pci0000:3b/0000:3b:00.0",
		"0000:3c:00.0": "../../../devices/pci0000:3b/0000:3c:00.0",
	} {
		if got, err := os.Readlink(filepath.Join(bus, addr)); err != nil || got != want {
			t.Errorf("%s links to %q (%v), want %q", addr, got, err, want)
		}
	}
	if got, err := os.Readlink(filepath.Join(bus, "0000:3c:00.0", "physfn")); err != nil || got != "../0000:3b:00.0" {
		t.Errorf("physfn %q (%v)", got, err)
	}
}
