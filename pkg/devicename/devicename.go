// Package devicename checks the device names a network config gives (deviceID,
// pciBusID, master, device) against what each can be — a PCI address, an
// auxiliary device name, a netdev name — before anything builds a path from
// one. The node daemon (pkg/rails) and the CNI plugin check with it; it links
// nothing but fmt, so the plugin stays small.
package devicename

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is a value that is not a name of the kind its field holds.
var ErrInvalid = errors.New("not a device name")

// Kind is a set of kinds of device name.
type Kind uint8

const (
	// PCIAddress is a PCI function's address, domain:bus:device.function, as
	// sysfs names it under /sys/bus/pci/devices: 0000:3b:00.1.
	PCIAddress Kind = 1 << iota
	// AuxDevice is an auxiliary bus device, module.name.id, as sysfs names it
	// under /sys/bus/auxiliary/devices: mlx5_core.sf.4.
	AuxDevice
	// Netdev is a network interface name, by the kernel's rule (dev_valid_name):
	// 1 to 15 bytes, not "." or "..", no '/', ':' or whitespace; and no '%',
	// which the kernel reads as a pattern when it names a netdev ("net%d" becomes
	// net0, net1, ...), so that no netdev is ever called by a name with one.
	Netdev
)

// Longest names: a netdev's is IFNAMSIZ-1; an auxiliary device's is its
// module.name (AUXILIARY_NAME_SIZE, 40 with its NUL) and a decimal id; a PCI
// address's domain has at most 8 hex digits (sysfs prints it as %04x of a
// 32-bit number).
const (
	maxNetdev = 15
	maxAux    = 64
	maxPCI    = 8 + len(":00:00.0")
)

// Field is a network config field that names a device, and the kinds of name it
// can hold.
type Field struct {
	Name  string
	Kinds Kind
}

// The fields the rail of an attachment is found by (docs/rails.md).
var (
	// DeviceID is the top-level deviceID: a PCI function (a VF, as the SR-IOV
	// device plugin gives it) or an auxiliary device (a sub-function).
	DeviceID = Field{"deviceID", PCIAddress | AuxDevice}
	// RuntimeDeviceID is the deviceID capability, as Multus passes it.
	RuntimeDeviceID = Field{"runtimeConfig.deviceID", PCIAddress | AuxDevice}
	// PCIBusID is host-device's pciBusID.
	PCIBusID = Field{"pciBusID", PCIAddress}
	// Master is the parent netdev of macvlan, ipvlan and ipoib.
	Master = Field{"master", Netdev}
	// Device is host-device's device.
	Device = Field{"device", Netdev}
)

// Check returns nil when value is a name of one of f's kinds, else an error
// (errors.Is ErrInvalid) that says what is wrong and what a valid value looks like. It
// never looks at the file system.
func (f Field) Check(value string) error {
	if f.Kinds.Valid(value) {
		return nil
	}
	msg := fmt.Sprintf("%s %s is not %s", f.Name, quote(value), f.Kinds.describe())
	if why := problem(value, f.Kinds); why != "" {
		msg += ": " + why
	}
	return invalidError(msg)
}

// invalidError is Check's error: it is ErrInvalid.
type invalidError string

func (e invalidError) Error() string        { return string(e) }
func (e invalidError) Is(target error) bool { return target == ErrInvalid }

// Valid says whether s is a name of one of the kinds of k.
func (k Kind) Valid(s string) bool {
	return k&PCIAddress != 0 && validPCI(s) || k&AuxDevice != 0 && validAux(s) || k&Netdev != 0 && validNetdev(s)
}

// describe says what the kinds of k look like.
func (k Kind) describe() string {
	var parts []string
	if k&PCIAddress != 0 {
		parts = append(parts, "a PCI address (domain:bus:device.function, e.g. 0000:3b:00.1)")
	}
	if k&AuxDevice != 0 {
		parts = append(parts, "an auxiliary device name (module.name.id, e.g. mlx5_core.sf.4)")
	}
	if k&Netdev != 0 {
		parts = append(parts, fmt.Sprintf("a netdev name (1 to %d bytes, not \".\" or \"..\", without '/', ':', '%%' or whitespace, e.g. ens1f0np0)", maxNetdev))
	}
	return strings.Join(parts, " or ")
}

// problem names what makes s no name of any kind of k, where one thing does.
func problem(s string, k Kind) string {
	longest := 0
	for _, c := range []struct {
		kind Kind
		max  int
	}{{PCIAddress, maxPCI}, {AuxDevice, maxAux}, {Netdev, maxNetdev}} {
		if k&c.kind != 0 {
			longest = max(longest, c.max)
		}
	}
	switch {
	case s == "":
		return "it is empty"
	case strings.IndexByte(s, 0) >= 0:
		return "it contains a NUL byte"
	case strings.IndexByte(s, '/') >= 0:
		return "it contains '/'"
	case s == "." || s == "..":
		return "it is a directory reference"
	case len(s) > longest:
		return fmt.Sprintf("it is %d bytes long, longer than %d", len(s), longest)
	case strings.ContainsAny(s, " \t\n\v\f\r") || strings.IndexByte(s, 0xa0) >= 0:
		return "it contains whitespace"
	case k&Netdev == 0 && strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "it contains a control character"
	case k == Netdev && strings.IndexByte(s, ':') >= 0:
		return "it contains ':'"
	case strings.IndexByte(s, '%') >= 0:
		return "it contains '%' (the kernel reads a netdev name with '%' as a pattern: net%d names net0, net1, ...)"
	}
	return ""
}

// quote quotes s for an error message, the first 64 bytes of a longer one.
func quote(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
	}
	return fmt.Sprintf("%q", s)
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// validPCI: 4 to 8 hex digits, ':', 2 hex digits, ':', 2 hex digits up to 1f,
// '.', a digit 0-7.
func validPCI(s string) bool {
	dom := strings.IndexByte(s, ':')
	if dom < 4 || dom > 8 || len(s) != dom+len(":00:00.0") {
		return false
	}
	for i := range dom {
		if !isHex(s[i]) {
			return false
		}
	}
	r := s[dom:] // ":bb:dd.f"
	return r[0] == ':' && isHex(r[1]) && isHex(r[2]) && r[3] == ':' && r[4] >= '0' && r[4] <= '1' && isHex(r[5]) &&
		r[6] == '.' && r[7] >= '0' && r[7] <= '7'
}

// validAux: module.name.id, where module and name are letters, digits, '_' and
// '-' (a module's name has no '-', mlx5's device names do: eth-rep), and id is
// decimal.
func validAux(s string) bool {
	if len(s) > maxAux {
		return false
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return false
	}
	for i, p := range parts {
		if p == "" {
			return false
		}
		for j := range len(p) {
			c := p[j]
			digit := c >= '0' && c <= '9'
			word := digit || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-'
			if i < 2 && !word || i == 2 && !digit {
				return false
			}
		}
	}
	return true
}

// validNetdev is the kernel's dev_valid_name: not empty, shorter than
// IFNAMSIZ, not "." or "..", and no '/', ':' or whitespace (the kernel's
// isspace: \t \n \v \f \r, ' ' and 0xa0); and, a Go string being no C string, no
// NUL; and no '%': the kernel accepts it, but as a pattern (dev_alloc_name:
// "net%d" registers as net0), so a netdev's actual name never has one.
func validNetdev(s string) bool {
	if s == "" || len(s) > maxNetdev || s == "." || s == ".." {
		return false
	}
	for i := range len(s) {
		switch c := s[i]; c {
		case 0, '/', ':', '%', ' ', '\t', '\n', '\v', '\f', '\r', 0xa0:
			return false
		}
	}
	return true
}
