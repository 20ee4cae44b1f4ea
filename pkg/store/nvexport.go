package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// The way back to nv-ipam: the store's allocations written as nv-ipam's JSON
// store (version 1, the format import.go reads), so that nv-ipam's daemon,
// started over the file, knows every address hwipam handed out.

// HwipamBackupSuffix is appended to the store file's name for the hwipam store
// an in-place export keeps beside the nv-ipam file it puts at the path (its
// log keeps its own name with the same suffix: <store>.hwipam.wal).
const HwipamBackupSuffix = ".hwipam"

// ExportReport says what an export wrote and what nv-ipam's format had no
// place for.
type ExportReport struct {
	// Pools and Allocations are what the nv-ipam file holds.
	Pools       int
	Allocations int
	// WithNetwork counts allocations that recorded their CNI network, and
	// WithRail those whose pool was picked by a rail: nv-ipam's store keeps
	// neither, so the allocation is exported in its pool without it.
	WithNetwork int
	WithRail    int
	// Claims counts the DRA driver's allocations exported (ExportOptions.KeepClaims).
	Claims int
	// Backup is the hwipam store kept by an in-place export; empty otherwise.
	Backup string
}

// NVIPAMJSON encodes pools as nv-ipam's JSON store, with its checksum. Each
// allocation becomes the entry "<containerID>_<ifName>" of its pool key (an
// IPPool's name, "cidrpool/<name>" for a CIDRPool), with its address, pod
// name, namespace and UID, device ID and creation time; each pool keeps its
// last reserved address. What nv-ipam has no place for (the network, the rail,
// the pool's block) is left out and counted in the report. An allocation that
// cannot be written faithfully (no container ID, an address that does not
// parse, two allocations under one nv-ipam key) fails the whole encoding.
func NVIPAMJSON(pools map[string]*PoolState) ([]byte, ExportReport, error) {
	var rep ExportReport
	root := nvRoot{Version: 1, Pools: make(map[string]*nvPool, len(pools))}
	keys := make([]string, 0, len(pools))
	for k := range pools {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		st := pools[key]
		if key == "" || st == nil {
			continue
		}
		p := &nvPool{Name: strings.TrimPrefix(key, "cidrpool/"), Entries: make(map[string]*nvEntry, len(st.Allocations))}
		if st.Pool.LastReserved != "" {
			ip, err := parseExportIP(st.Pool.LastReserved)
			if err != nil {
				return nil, rep, fmt.Errorf("pool %s: last reserved address: %w", key, err)
			}
			p.LastReservedIP = ip
		}
		for i := range st.Allocations {
			a := &st.Allocations[i]
			if a.ContainerID == "" {
				return nil, rep, fmt.Errorf("pool %s: an allocation of %s has no container ID", key, a.IP)
			}
			ip, err := parseExportIP(a.IP)
			if err != nil {
				return nil, rep, fmt.Errorf("pool %s, container %s interface %s: %w", key, a.ContainerID, a.IfName, err)
			}
			entryKey := a.ContainerID + "_" + a.IfName
			if prev, dup := p.Entries[entryKey]; dup {
				return nil, rep, fmt.Errorf("pool %s: container %s interface %s and container %s interface %s are both %q "+
					"in nv-ipam's format, which cannot tell them apart", key, prev.ContainerID, prev.InterfaceName,
					a.ContainerID, a.IfName, entryKey)
			}
			created := ""
			if !a.CreateTime.IsZero() {
				created = a.CreateTime.UTC().Format(time.RFC3339Nano)
			}
			p.Entries[entryKey] = &nvEntry{ContainerID: a.ContainerID, InterfaceName: a.IfName, IPAddress: ip,
				Metadata: nvMetadata{CreateTime: created, PodUUID: a.PodUID, PodName: a.PodName,
					PodNamespace: a.PodNamespace, DeviceID: a.DeviceID}}
			rep.Allocations++
			if a.Network != "" {
				rep.WithNetwork++
			}
			if a.Rail != "" {
				rep.WithRail++
			}
			if isDRA(a) {
				rep.Claims++
			}
		}
		root.Pools[key] = p
		rep.Pools++
	}
	sum, err := nvChecksum(&root)
	if err != nil {
		return nil, rep, err
	}
	root.Checksum = sum
	data, err := json.Marshal(&root)
	if err != nil {
		return nil, rep, fmt.Errorf("encoding the nv-ipam store: %w", err)
	}
	return data, rep, nil
}

// parseExportIP parses an address as the store keeps it (no prefix length).
func parseExportIP(s string) (net.IP, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return nil, fmt.Errorf("address %q is not an IP address", s)
	}
	return net.IP(a.AsSlice()), nil
}

// ErrDRAClaims is an export's refusal of a store that holds allocations of the
// DRA driver (nic.hwipam.io claims): their pods are to go first (docs/migration.md).
var ErrDRAClaims = errors.New("the store holds addresses of DRA claims")

// ExportOptions change what an export does with allocations nv-ipam has no
// counterpart for.
type ExportOptions struct {
	// KeepClaims exports the DRA driver's allocations as nv-ipam entries
	// (container ID the claim's UID, interface "nic:<device>", the pod the claim
	// was prepared for), which nv-ipam holds until that pod is gone. Without
	// it, a store that holds any is refused (ErrDRAClaims).
	KeepClaims bool
}

// isDRA tells an allocation of the DRA driver: its mark, or, from a version
// before the mark, the driver's network name.
func isDRA(a *Allocation) bool { return a.Owner == "dra" || a.Network == "nic.hwipam.io" }

// draClaims lists the DRA allocations of pools as "pod ns/name (claim UID,
// address)", sorted.
func draClaims(pools map[string]*PoolState) []string {
	var out []string
	for _, st := range pools {
		if st == nil {
			continue
		}
		for i := range st.Allocations {
			a := &st.Allocations[i]
			if isDRA(a) {
				out = append(out, fmt.Sprintf("pod %s/%s (claim UID %s, %s)", a.PodNamespace, a.PodName, a.ContainerID, a.IP))
			}
		}
	}
	sort.Strings(out)
	return out
}

// ExportNVIPAM is ExportNVIPAMWith without options: a store with DRA claims'
// allocations is refused.
func ExportNVIPAM(path, out string) (ExportReport, error) {
	return ExportNVIPAMWith(path, out, ExportOptions{})
}

// ExportNVIPAMWith writes the store at path as nv-ipam's JSON store. out names the
// file to write, which must not exist yet; out equal to path is the in-place
// export of a rollback: the nv-ipam file takes the store's place, and the
// hwipam store is kept as path+HwipamBackupSuffix (with its log as
// path+HwipamBackupSuffix+".wal").
//
// The store must not be in use: ExportNVIPAM takes the store's lock, and a
// running ipam-node holding it makes the export fail at once. (An export taken
// while the daemon runs would lack what it allocates afterwards, and nv-ipam
// would hand those addresses out again.) The store is read whole, with its
// log, and checked; anything it cannot read fails the export before a file is
// written. The file is written to a temporary name, synced, and renamed into
// place, so that out (or path) holds either the old content or the whole
// export, never a part. A store with allocations of the DRA driver is refused
// unless o.KeepClaims (ErrDRAClaims, naming them).
func ExportNVIPAMWith(path, out string, o ExportOptions) (ExportReport, error) {
	var rep ExportReport
	inPlace := filepath.Clean(out) == filepath.Clean(path)
	if ok, err := fileExists(path); err != nil {
		return rep, err
	} else if !ok {
		return rep, fmt.Errorf("no store at %s: give ipam-node's --store-file", path)
	}
	if isNV, err := looksLikeNVIPAMStore(path); err != nil {
		return rep, err
	} else if isNV {
		return rep, fmt.Errorf("%s is already an nv-ipam JSON store (exported before, or never imported by ipam-node): "+
			"there is nothing to export; nv-ipam reads it as it is", path)
	}
	if !inPlace {
		if _, err := os.Lstat(out); err == nil {
			return rep, fmt.Errorf("%s exists: the export does not overwrite a file; remove it or name another", out)
		} else if !errors.Is(err, os.ErrNotExist) {
			return rep, fmt.Errorf("export %s: %w", out, err)
		}
	}
	s, err := Open(path, Options{LockTimeout: time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return rep, fmt.Errorf("%w; stop ipam-node on this node first: an export taken while it runs would miss "+
				"what it allocates afterwards", err)
		}
		return rep, fmt.Errorf("the store cannot be read fully, nothing was exported: %w", err)
	}
	pools, err := s.Load()
	// Close applies the log to the bbolt file, so the file alone is the whole
	// store: the in-place export keeps it (and the log) as the backup.
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return rep, fmt.Errorf("the store cannot be read fully, nothing was exported: %w", err)
	}
	if claims := draClaims(pools); len(claims) > 0 && !o.KeepClaims {
		const maxListed = 5
		more := ""
		if len(claims) > maxListed {
			more = fmt.Sprintf(" and %d more", len(claims)-maxListed)
			claims = claims[:maxListed]
		}
		return rep, fmt.Errorf("%w, nothing was exported: %s%s. nv-ipam has no DRA driver: nobody would return these "+
			"pods' NIC ports to the host or release their addresses with their claims. Delete those pods (or move them to "+
			"NADs) while ipam-node runs with --dra, so that the kubelet unprepares their claims, and export again; or give "+
			"--keep-dra-claims to export them as nv-ipam entries, which nv-ipam holds until their pods are gone "+
			"(docs/migration.md)", ErrDRAClaims, strings.Join(claims, ", "), more)
	}
	data, rep, err := NVIPAMJSON(pools)
	if err != nil {
		return rep, fmt.Errorf("the store %s cannot be exported in nv-ipam's format, nothing was written: %w", path, err)
	}
	// Hold the store's lock (the one bbolt and ipam-node take) until the file
	// is in place, so that no ipam-node starts over the store meanwhile.
	unlock, err := lockFile(path)
	if err != nil {
		return rep, err
	}
	defer unlock()
	tmp := out + ".exporting"
	if err := writeSynced(tmp, data); err != nil {
		return rep, err
	}
	dir := filepath.Dir(out)
	if !inPlace {
		// A link does not replace a file that appeared meanwhile.
		err := os.Link(tmp, out)
		_ = os.Remove(tmp)
		if err != nil {
			return rep, fmt.Errorf("writing the export %s: %w", out, err)
		}
		return rep, syncDir(dir)
	}
	// In place: first the backup (links, so that a crash at any step leaves the
	// whole hwipam store at path), then the nv-ipam file over it.
	backup := path + HwipamBackupSuffix
	for _, pair := range [][2]string{{path, backup}, {path + ".wal", backup + ".wal"}} {
		_ = os.Remove(pair[1])
		err := os.Link(pair[0], pair[1])
		if errors.Is(err, os.ErrNotExist) && pair[0] != path {
			continue // no log beside the store: nothing to keep of it
		}
		if err != nil {
			_ = os.Remove(tmp)
			return rep, fmt.Errorf("keeping the hwipam store %s as %s: %w", pair[0], pair[1], err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return rep, fmt.Errorf("putting the export in place of %s: %w", path, err)
	}
	// The log belongs to the store now at backup; left at path+".wal" it would
	// never be replayed (it names that store's ID), but it would mislead.
	_ = os.Remove(path + ".wal")
	rep.Backup = backup
	return rep, syncDir(dir)
}

// writeSynced writes data to a new file at path and fsyncs it.
func writeSynced(path string, data []byte) error {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("writing the export: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("writing the export %s: %w", path, err)
	}
	return nil
}

// lockFile takes the lock bbolt takes on the store file (flock, exclusive),
// without waiting.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("store %s was opened by another process (ipam-node?) during the export: %w; "+
			"stop it and export again", path, err)
	}
	return func() { _ = f.Close() }, nil
}
