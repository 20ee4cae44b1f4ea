package nicdiscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/jaypipes/ghw"
	"github.com/jaypipes/ghw/pkg/pci"
	"golang.org/x/sys/unix"
)

// pciFunction is one PCI function as ghw enumerated it.
type pciFunction struct {
	address  string
	vendorID uint16
	deviceID uint16
	classID  uint32 // class, subclass, programming interface: 0x028000
}

// ghwMu serialises ghw's PCI enumeration: ghw v0.26 loads its PCI ID database only
// from $PCIDB_PATH or the host's well-known paths (it ignores both its chroot and
// its WithPCIDB option for this), and fails outright when there is none.
var ghwMu sync.Mutex

// pciIDs holds the built-in table in pci.ids format in an anonymous memory file
// for ghw, for the life of the process: nothing is written to disk (the node
// daemon runs with a read-only root filesystem).
var pciIDs struct {
	sync.Mutex
	path string
}

func pciIDsPath() (string, error) {
	pciIDs.Lock()
	defer pciIDs.Unlock()
	if pciIDs.path != "" {
		return pciIDs.path, nil
	}
	fd, err := unix.MemfdCreate("hwipam-pci.ids", unix.MFD_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("creating the in-memory PCI ID table ghw needs: %w", err)
	}
	b := pciIDsFile()
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			_ = unix.Close(fd)
			return "", fmt.Errorf("writing the in-memory PCI ID table ghw needs: %w", err)
		}
		b = b[n:]
	}
	pciIDs.path = fmt.Sprintf("/proc/self/fd/%d", fd)
	return pciIDs.path, nil
}

// enumerate lists the PCI functions under root/sys with ghw. ghw resolves names
// against the small built-in table (names from pci.ids are looked up separately,
// and only for devices the table does not know), which keeps a scan cheap.
func enumerate(ctx context.Context, root string, log logr.Logger) ([]pciFunction, error) {
	devDir := filepath.Join(root, "sys", "bus", "pci", "devices")
	entries, err := os.ReadDir(devDir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w; the root (--sysfs-root) must be a directory that contains sys/", devDir, err)
	}
	dbPath, err := pciIDsPath()
	if err != nil {
		return nil, err
	}
	ghwMu.Lock()
	info, err := func() (*pci.Info, error) {
		defer ghwMu.Unlock()
		old, had := os.LookupEnv("PCIDB_PATH")
		if err := os.Setenv("PCIDB_PATH", dbPath); err != nil {
			return nil, err
		}
		defer func() {
			if had {
				_ = os.Setenv("PCIDB_PATH", old)
			} else {
				_ = os.Unsetenv("PCIDB_PATH")
			}
		}()
		return ghw.PCI(ctx, ghw.WithChroot(root), ghw.WithDisableTopology(), ghw.WithDisableTools(),
			ghw.WithLogger(slog.New(&ghwLog{log: log})))
	}()
	if err != nil {
		return nil, fmt.Errorf("enumerating PCI devices under %s with ghw: %w", devDir, err)
	}
	if len(info.Devices) == 0 && len(entries) > 0 {
		return nil, fmt.Errorf("ghw found none of the %d PCI devices under %s: a device there has no readable modalias (see the warnings above)",
			len(entries), devDir)
	}
	out := make([]pciFunction, 0, len(info.Devices))
	for _, d := range info.Devices {
		f := pciFunction{address: d.Address}
		if d.Vendor == nil || d.Product == nil || d.Class == nil || d.Subclass == nil || d.ProgrammingInterface == nil {
			continue
		}
		v, err1 := strconv.ParseUint(d.Vendor.ID, 16, 16)
		p, err2 := strconv.ParseUint(d.Product.ID, 16, 16)
		c, err3 := strconv.ParseUint(d.Class.ID+d.Subclass.ID+d.ProgrammingInterface.ID, 16, 32)
		if err := errors.Join(err1, err2, err3); err != nil {
			log.Info("warning: skipping a PCI device whose IDs do not parse", "address", d.Address, "error", err.Error())
			continue
		}
		f.vendorID, f.deviceID, f.classID = uint16(v), uint16(p), uint32(c)
		out = append(out, f)
	}
	return out, nil
}

// ghwLog routes ghw's slog output to our logger: warnings as Info lines with a
// "ghw: " prefix, the rest at V(1). ghw's note that topology detection is off (we
// turn it off: NUMA nodes are read per device) is dropped.
type ghwLog struct {
	log   logr.Logger
	attrs []any
}

func (h *ghwLog) Enabled(_ context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.log.V(1).Enabled()
}

func (h *ghwLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "topology detection disabled") {
		return nil
	}
	kv := append([]any(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		kv = append(kv, a.Key, a.Value.Any())
		return true
	})
	if r.Level >= slog.LevelWarn {
		h.log.Info("warning: ghw: "+r.Message, kv...)
	} else {
		h.log.V(1).Info("ghw: "+r.Message, kv...)
	}
	return nil
}

func (h *ghwLog) WithAttrs(as []slog.Attr) slog.Handler {
	n := &ghwLog{log: h.log, attrs: append([]any(nil), h.attrs...)}
	for _, a := range as {
		n.attrs = append(n.attrs, a.Key, a.Value.Any())
	}
	return n
}

func (h *ghwLog) WithGroup(string) slog.Handler { return h }
