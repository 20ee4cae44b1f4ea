package nicdra

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// CharDevice is a character device given to a pod's containers: its path in
// the container (the same as on the host), its numbers, and its mode.
type CharDevice struct {
	Path  string
	Major int64
	Minor int64
	Mode  fs.FileMode
}

// RDMACharDevices returns the RDMA character devices of the NIC function at
// pciAddress, as the sysfs tree under root (the directory holding sys/) shows
// them, with the numbers read from their dev files:
//   - /dev/infiniband/uverbsN, the user verbs device of each of its RDMA
//     devices (sys/bus/pci/devices/<pci>/infiniband_verbs/uverbsN/dev), mode
//     0666 as rdma-core's udev rules make it;
//   - /dev/infiniband/umadN, the management datagram device of each port
//     that has one (infiniband_mad/umadN/dev), mode 0600 as on the host; the
//     issmN devices (which make the port claim to be a subnet manager) are
//     not handed out;
//   - /dev/infiniband/rdma_cm, the RDMA connection manager, when the node has
//     it (sys/class/misc/rdma_cm/dev: the rdma_ucm module), mode 0666.
//
// A function without an RDMA device has none, and no error. One whose RDMA
// device has no user verbs device, or one whose dev file cannot be read, is an
// error that names the file and what to do: the numbers are never guessed.
func RDMACharDevices(root, pciAddress string) ([]CharDevice, error) {
	dir := filepath.Join(root, "sys", "bus", "pci", "devices", pciAddress)
	rdma, err := rdmaEntries(filepath.Join(dir, "infiniband"), "")
	if err != nil {
		return nil, err
	}
	if len(rdma) == 0 {
		return nil, nil
	}
	verbs, err := rdmaEntries(filepath.Join(dir, "infiniband_verbs"), "uverbs")
	if err != nil {
		return nil, err
	}
	if len(verbs) == 0 {
		return nil, fmt.Errorf("NIC function %s has RDMA device %s but no user verbs device (nothing in %s): "+
			"load the ib_uverbs module (modprobe ib_uverbs) so that its pods can use RDMA",
			pciAddress, strings.Join(rdma, ", "), filepath.Join(dir, "infiniband_verbs"))
	}
	var out []CharDevice
	add := func(devFile, name string, mode fs.FileMode) error {
		major, minor, err := readDevNumbers(devFile)
		if err != nil {
			return err
		}
		out = append(out, CharDevice{Path: "/dev/infiniband/" + name, Major: major, Minor: minor, Mode: mode})
		return nil
	}
	for _, v := range verbs {
		if err := add(filepath.Join(dir, "infiniband_verbs", v, "dev"), v, 0o666); err != nil {
			return nil, err
		}
	}
	mads, err := rdmaEntries(filepath.Join(dir, "infiniband_mad"), "umad")
	if err != nil {
		return nil, err
	}
	for _, m := range mads {
		if err := add(filepath.Join(dir, "infiniband_mad", m, "dev"), m, 0o600); err != nil {
			return nil, err
		}
	}
	cm := filepath.Join(root, "sys", "class", "misc", "rdma_cm", "dev")
	if _, err := os.Stat(cm); err == nil {
		if err := add(cm, "rdma_cm", 0o666); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", cm, err)
	}
	return out, nil
}

// rdmaEntries lists the entries of dir whose name starts with prefix, in the order
// of their number (uverbs2 before uverbs10); a missing dir has none.
func rdmaEntries(dir, prefix string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	num := func(s string) int {
		n, _ := strconv.Atoi(strings.TrimLeft(s, "abcdefghijklmnopqrstuvwxyz_"))
		return n
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := num(a) - num(b); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return out, nil
}

// readDevNumbers reads a sysfs dev file, "major:minor".
func readDevNumbers(path string) (major, minor int64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the device numbers of %s: %w (is the sysfs tree complete?)", filepath.Dir(path), err)
	}
	s := strings.TrimSpace(string(b))
	ma, mi, ok := strings.Cut(s, ":")
	if ok {
		if major, err = strconv.ParseInt(ma, 10, 64); err == nil {
			minor, err = strconv.ParseInt(mi, 10, 64)
		}
	}
	if !ok || err != nil || major < 0 || minor < 0 {
		return 0, 0, fmt.Errorf("%s holds %q, not the major:minor of a device", path, s)
	}
	return major, minor, nil
}
