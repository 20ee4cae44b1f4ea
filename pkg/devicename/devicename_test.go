package devicename_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/pkg/devicename"
)

func TestValidNames(t *testing.T) {
	for kind, names := range map[devicename.Kind][]string{
		devicename.PCIAddress: {"0000:3b:00.1", "0000:00:1f.7", "10000:e1:00.0", "ffffffff:ff:1f.7", "0000:AF:00.0"},
		devicename.AuxDevice:  {"mlx5_core.sf.4", "mlx5_core.eth-rep.0", "mlx5_core.rdma.12", "ice.roce.0"},
		devicename.Netdev: {"ens1f0np0", "ibp24s0.8001", "eth0", "a", "123456789012345", "bonding_masters", "..a", "...",
			"v@x"},
	} {
		for _, n := range names {
			if !kind.Valid(n) {
				t.Errorf("%q is not a valid name of kind %d, want valid", n, kind)
			}
		}
	}
}

// TestHostileValues: every field refuses what a path could be built from
// (traversal, absolute paths, NUL, overlong values, ...), saying what was wrong
// and what a valid value looks like.
func TestHostileValues(t *testing.T) {
	fields := []devicename.Field{devicename.DeviceID, devicename.RuntimeDeviceID, devicename.PCIBusID, devicename.Master,
		devicename.Device}
	for _, c := range []struct{ value, why string }{
		{"../../../../etc/x", "it contains '/'"},
		{"/etc/passwd", "it contains '/'"},
		{"..", "directory reference"},
		{".", "directory reference"},
		{"", "it is empty"},
		{"eth0\x00", "NUL"},
		{"mlx5_core.sf.4\x00/../../x", "NUL"},
		{strings.Repeat("a", 4096), "bytes long"},
		{"eth 0", "whitespace"},
		{"eth0\n", "whitespace"},
		{"\xa0eth0", "whitespace"},
		{"net%d", "it contains '%'"},
		{"eth%", "it contains '%'"},
	} {
		for _, f := range fields {
			err := f.Check(c.value)
			if !errors.Is(err, devicename.ErrInvalid) || !strings.Contains(err.Error(), c.why) ||
				!strings.HasPrefix(err.Error(), f.Name+" ") || !strings.Contains(err.Error(), "e.g.") {
				t.Errorf("%s %q: %v, want refused saying %q and what a valid one looks like", f.Name, c.value, err, c.why)
			}
			if len(err.Error()) > 600 {
				t.Errorf("%s of %d bytes: the error is %d bytes long", f.Name, len(c.value), len(err.Error()))
			}
		}
	}
	for _, c := range []struct {
		f     devicename.Field
		value string
	}{
		{devicename.PCIBusID, "3b:00.0"}, {devicename.PCIBusID, "0000:3b:20.0"}, {devicename.PCIBusID, "0000:3b:00.8"},
		{devicename.PCIBusID, "mlx5_core.sf.4"}, {devicename.PCIBusID, "0000:3b:00.1x"}, {devicename.PCIBusID, "000000000:3b:00.1"},
		{devicename.DeviceID, "mlx5_core.sf"}, {devicename.DeviceID, "mlx5_core.sf.x"}, {devicename.DeviceID, "mlx5_core..4"},
		{devicename.DeviceID, "a.b.c.4"}, {devicename.DeviceID, "ens1f0np0"}, {devicename.DeviceID, "mlx5:core.sf.4"},
		{devicename.Master, "eth0:1"}, {devicename.Master, "1234567890123456"}, {devicename.Device, "0000:3b:00.1"},
	} {
		if err := c.f.Check(c.value); !errors.Is(err, devicename.ErrInvalid) {
			t.Errorf("%s %q: %v, want refused", c.f.Name, c.value, err)
		}
	}
	err := devicename.Master.Check("eth0:1")
	if err == nil || !strings.Contains(err.Error(), "it contains ':'") || !strings.Contains(err.Error(), "e.g. ens1f0np0") {
		t.Errorf("master with ':': %v", err)
	}
	err = devicename.DeviceID.Check("../x")
	if err == nil || !strings.Contains(err.Error(), "0000:3b:00.1") || !strings.Contains(err.Error(), "mlx5_core.sf.4") {
		t.Errorf("deviceID: %v, want both forms named", err)
	}
}

// FuzzField: a name any field accepts is one directory entry: joined under a
// directory, it names a child of that directory and nothing else.
func FuzzField(f *testing.F) {
	for _, s := range []string{"0000:3b:00.1", "mlx5_core.sf.4", "ens1f0np0", "..", "../x", "a/b", "\x00", "eth0:1",
		"mlx5_core.eth-rep.0", "10000:e1:00.0", "a\xa0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, fl := range []devicename.Field{devicename.DeviceID, devicename.PCIBusID, devicename.Master} {
			err := fl.Check(s)
			if err != nil {
				if !errors.Is(err, devicename.ErrInvalid) || !strings.Contains(err.Error(), "e.g.") {
					t.Fatalf("%s %q: %v", fl.Name, s, err)
				}
				continue
			}
			dir := "/sys/class/net"
			if p := filepath.Join(dir, s); filepath.Dir(p) != dir || filepath.Base(p) != s || strings.ContainsAny(s, "\x00/") {
				t.Fatalf("%s %q is accepted but joined under %s gives %s", fl.Name, s, dir, p)
			}
			if len(s) > 64 {
				t.Fatalf("%s %q is accepted at %d bytes", fl.Name, s, len(s))
			}
		}
	})
}

// A netdev name with '%' is refused: the kernel takes it as a pattern
// ("net%d" registers as net0, net1, ...), so no netdev is ever called by it,
// and a name asked for with one is not the name the netdev gets.
func TestNetdevRefusesPercent(t *testing.T) {
	for _, name := range []string{"net%d", "%d", "eth%", "a%s", "%%"} {
		t.Run(name, func(t *testing.T) {
			if devicename.Netdev.Valid(name) {
				t.Errorf("%q is a valid netdev name, want refused", name)
			}
			err := devicename.Device.Check(name)
			if !errors.Is(err, devicename.ErrInvalid) || !strings.Contains(err.Error(), "it contains '%'") ||
				!strings.Contains(err.Error(), "pattern") || strings.Contains(err.Error(), "%!") {
				t.Errorf("device %q: %v, want refused saying it contains '%%' (a pattern)", name, err)
			}
		})
	}
}
