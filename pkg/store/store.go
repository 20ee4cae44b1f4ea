// Package store keeps a node's allocations durably on the host, in one bbolt
// database file (--store-file) and its write-ahead log beside it
// (<store-file>.wal, see wal.go). Every allocation and release is written to the
// log before Commit returns (so it survives a crash of the daemon), and flushed
// to the disk in the background, one device flush shared by the commits made
// meanwhile, where a bbolt transaction takes two per commit. The log is applied
// to the bbolt file in the background, many commits per transaction, and
// replayed on open. A file that is not a
// usable store stops the daemon with an error that says what to do; the daemon
// never starts empty over a broken file. An nv-ipam JSON store found at the path
// is imported on first open and kept beside it as a backup (see import.go).
//
// Layout (bucket / key → value, values JSON):
//
//	meta        / "schema"                  → "1"
//	pools       / <poolKey>                 → Pool (last known block, cursor)
//	allocations / <poolKey> / <cid>\x00<if> → Allocation
//
// A poolKey is the pool name for an IPPool and "cidrpool/<name>" for a CIDRPool,
// as in nv-ipam's store.
//
// Schema 1 grows only by optional fields, which older ipam-node versions ignore,
// so a rollback keeps working. Allocation.Network is one: records written before
// it, and allocations imported from nv-ipam, have none, which reads as "network
// not known" (CNI GC never releases them); there is nothing to rewrite.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

const schemaVersion = "1"

var (
	bucketMeta        = []byte("meta")
	bucketPools       = []byte("pools")
	bucketAllocations = []byte("allocations")
	keySchema         = []byte("schema")
)

// ErrCorrupt is returned (wrapped, with what to do) when the store file cannot be
// used.
var ErrCorrupt = errors.New("store file is corrupt or not a hwipam store")

// Allocation is one address held by one (containerID, ifName) in one pool.
type Allocation struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// IP is the address without prefix length.
	IP string `json:"ip"`
	// Pod metadata from the CNI args; empty for allocations made without them,
	// which the stale-allocation cleaner then never touches.
	PodName      string `json:"podName,omitempty"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodUID       string `json:"podUID,omitempty"`
	DeviceID     string `json:"deviceID,omitempty"`
	// Rail is the rail the allocation's pool was picked by (docs/rails.md); empty
	// for pools named outright.
	Rail       string    `json:"rail,omitempty"`
	CreateTime time.Time `json:"createTime"`
	// Network is the name of the CNI network that made the allocation; empty when
	// not known (see the package comment).
	Network string `json:"network,omitempty"`
	// Owner marks an allocation made by the DRA driver ("dra", set only by the
	// daemon itself, never from a CNI request): the claim garbage collection
	// releases only those, the stale-allocation cleaner never does. Empty for
	// every CNI allocation.
	Owner string `json:"owner,omitempty"`
	// Port is the PCI address of the NIC function the attachment uses (a VF or
	// PF by deviceID or pciBusID, a macvlan/ipvlan master's or host-device
	// device's function), as the daemon resolved it at allocation; empty when
	// the request named no device of this node. The DRA driver does not hand
	// out a port a CNI allocation uses.
	Port string `json:"port,omitempty"`
	// Ports are every PCI function the attachment uses when there are more
	// than one (Port is the first): a master that is a bond of ports, or a
	// VLAN on one. Empty otherwise.
	Ports []string `json:"ports,omitempty"`
}

// UsedPorts returns the PCI functions the allocation's attachment uses
// (Ports, else Port): none when it named no device of this node.
func (a Allocation) UsedPorts() []string {
	if len(a.Ports) > 0 {
		return a.Ports
	}
	if a.Port != "" {
		return []string{a.Port}
	}
	return nil
}

// Pool is what the store remembers of a pool besides its allocations: the last
// block learned from the API server, so the daemon can allocate after a restart
// without it, and the round-robin cursor.
type Pool struct {
	// Key is the poolKey.
	Key string `json:"key"`
	// Block is the node's block as the API server last gave it, in the daemon's own
	// encoding; the store does not interpret it.
	Block json.RawMessage `json:"block,omitempty"`
	// LastReserved is the last address handed out.
	LastReserved string `json:"lastReserved,omitempty"`
	// Inactive is set when the API server took Block away from the node: it still
	// describes the node's old allocations, but must not hand out new ones after a
	// restart, even while the API server is unreachable.
	Inactive bool `json:"inactive,omitempty"`
}

// PoolState is a pool with its allocations, as Load returns them.
type PoolState struct {
	Pool        Pool
	Allocations []Allocation
}

// Store is an open store. Its methods are safe for concurrent use.
type Store struct {
	db   *bolt.DB
	path string

	// checked is closed when Open's consistency check has finished, with its
	// verdict in checkErr; nothing is written before.
	checked  chan struct{}
	checkErr error

	commits      atomic.Uint64 // Commit calls that succeeded
	commitFails  atomic.Uint64 // Commit calls whose log write failed
	commitNanos  atomic.Uint64 // time Commit calls that succeeded spent writing the log
	transactions atomic.Uint64 // flushes of the log they shared
	checkpoints  atomic.Uint64 // bbolt transactions that applied the log
	lastUnmap    atomic.Int64  // when unmapNowAndThen last ran, Unix nanoseconds

	// wal is the write-ahead log (wal.go). Lock order: wal.syncMu, wal.ckMu,
	// wal.mu.
	wal *wal
}

// Stats reports how many Commit calls succeeded and how many flushes of the log
// to the disk (fdatasync) they shared.
func (s *Store) Stats() (commits, transactions uint64) {
	return s.commits.Load(), s.transactions.Load()
}

// CommitStats reports how many Commit calls failed to write the log (a full
// or failing disk: nothing of them was recorded), and the seconds the
// successful ones spent writing it, in all.
func (s *Store) CommitStats() (failures uint64, seconds float64) {
	return s.commitFails.Load(), float64(s.commitNanos.Load()) / 1e9
}

// Checkpoints reports how many bbolt transactions have applied the log to the
// bbolt file (each writes the pages it changed and flushes the device twice).
func (s *Store) Checkpoints() uint64 { return s.checkpoints.Load() }

// Options tunes Open.
type Options struct {
	// LockTimeout bounds the wait for another process holding the file; 0 means 10s.
	LockTimeout time.Duration
	// MaxBatchDelay is how long a pool record's write waits for others to share
	// its transaction; 0 means 2ms.
	MaxBatchDelay time.Duration
	// WALSize is the size of the write-ahead log; 0 means DefaultWALSize.
	WALSize int64
}

// Open opens the store at path, creating it when missing and importing an nv-ipam
// JSON store found there. It checks the whole file's consistency: a new file
// before Open returns, an existing one in the background, whose verdict every
// later read or write of the store waits for (a damaged file fails them all with
// ErrCorrupt), so that the daemon's start-up Scan runs beside the check.
func Open(path string, opts Options) (*Store, error) {
	if opts.LockTimeout == 0 {
		opts.LockTimeout = 10 * time.Second
	}
	if opts.MaxBatchDelay == 0 {
		opts.MaxBatchDelay = 2 * time.Millisecond
	}
	if opts.WALSize == 0 {
		opts.WALSize = DefaultWALSize
	}
	if isNVIPAM, err := looksLikeNVIPAMStore(path); err != nil {
		return nil, err
	} else if isNVIPAM {
		if err := importNVIPAM(path, opts); err != nil {
			return nil, err
		}
	}
	existed, err := fileExists(path)
	if err != nil {
		return nil, err
	}
	db, err := openBolt(path, opts)
	if err != nil {
		return nil, err
	}
	if !existed {
		// A new file's directory entry must be durable before its first commit is
		// acknowledged.
		if err := syncDir(filepath.Dir(path)); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	s := &Store{db: db, path: path, checked: make(chan struct{})}
	if err := s.init(); err != nil {
		if cerr := s.waitChecked(); cerr != nil {
			err = cerr // a damaged file can fail init in other ways; say what is wrong
		}
		_ = db.Close()
		return nil, err
	}
	if err := s.openWAL(opts.WALSize); err != nil {
		if cerr := s.waitChecked(); cerr != nil {
			err = cerr
		}
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// check verifies the whole file, as a goroutine started by init; see checked.
func (s *Store) check() {
	defer close(s.checked)
	err := s.db.View(func(tx *bolt.Tx) error {
		var first error
		for e := range tx.Check() { // drain: the checker goroutine uses tx until it closes the channel
			if first == nil {
				first = e
			}
		}
		return first
	})
	if err != nil {
		s.checkErr = corrupt(s.path, err)
	}
}

// waitChecked waits for Open's consistency check and returns its verdict.
func (s *Store) waitChecked() error {
	<-s.checked
	return s.checkErr
}

func corrupt(path string, cause error) error {
	return fmt.Errorf("%w: %s: %w; the daemon will not start over it. Restore the file from a backup, or move it "+
		"away (allocations held on this node are then forgotten and may be handed out again) and restart", ErrCorrupt, path, cause)
}

// openBolt opens the bbolt file, turning bbolt's panics on garbage into errors.
// A panic leaves the file open, mapped and locked inside bbolt: it is unlocked
// and closed here (the map is left to the process's end), so
// that the process can open the path again (ipamctl's export reports the
// damage, not a lock held by itself).
func openBolt(path string, opts Options) (db *bolt.DB, err error) {
	var file *os.File
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				// bbolt's map still refers to the file, so closing it alone
				// would keep the lock.
				_ = unix.Flock(int(file.Fd()), unix.LOCK_UN)
				_ = file.Close()
			}
			db, err = nil, corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout,
		OpenFile: func(name string, flag int, mode os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, mode)
			file = f
			return f, err
		}})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("store %s is locked by another process (is another ipam-node running?): %w", path, err)
		}
		if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrChecksum) || errors.Is(err, berrors.ErrVersionMismatch) {
			return nil, corrupt(path, err)
		}
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	db.MaxBatchDelay = opts.MaxBatchDelay
	return db, nil
}

// init starts the consistency check of the whole file, which reads every page
// (tens of milliseconds for 100,000 allocations): the first write, and the end
// of Scan, wait for its verdict, so that the daemon's start-up scan runs beside
// it. Then init makes sure of the schema marker and the buckets; a store that
// needs them written (a new one) waits for the check first.
func (s *Store) init() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(s.path, fmt.Errorf("%v", r))
		}
	}()
	go s.check()
	ready := false
	if err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return nil
		}
		if v := meta.Get(keySchema); v != nil && !bytes.Equal(v, []byte(schemaVersion)) {
			return fmt.Errorf("store %s has schema %q, this ipam-node knows %q: run the ipam-node version that wrote it",
				s.path, v, schemaVersion)
		}
		ready = meta.Get(keySchema) != nil && tx.Bucket(bucketPools) != nil && tx.Bucket(bucketAllocations) != nil
		return nil
	}); err != nil {
		return err
	}
	if ready {
		return nil
	}
	if err := s.waitChecked(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch v := meta.Get(keySchema); {
		case v == nil: // a new store: it gets its log ID with its schema (see openWAL)
			if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
				return err
			}
			if err := putStoreID(meta); err != nil {
				return err
			}
		case !bytes.Equal(v, []byte(schemaVersion)):
			return fmt.Errorf("store %s has schema %q, this ipam-node knows %q: run the ipam-node version that wrote it",
				s.path, v, schemaVersion)
		}
		for _, b := range [][]byte{bucketPools, bucketAllocations} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close closes the store.
func (s *Store) Close() error {
	<-s.checked
	werr := s.closeWAL()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing store %s: %w", s.path, err)
	}
	return werr
}

// Path is the store file.
func (s *Store) Path() string { return s.path }

// Put is one allocation to record.
type Put struct {
	PoolKey    string
	Allocation Allocation
	// LastReserved, when set, updates the pool's round-robin cursor.
	LastReserved string
}

// Commit records the puts and deletes, all or none, and returns once they are
// in the log, as one record written to its file (shared with concurrent
// callers): from then on they survive a crash of the daemon. The flusher puts
// them on the disk within a few milliseconds, the checkpointer into the bbolt
// file soon after (see wal.go).
func (s *Store) Commit(puts []Put, deletes []Key) error {
	if err := s.waitChecked(); err != nil {
		return err
	}
	ops := make([]walOp, 0, len(puts)+len(deletes))
	for i := range puts {
		p := &puts[i]
		v, err := json.Marshal(p.Allocation)
		if err != nil {
			return fmt.Errorf("writing store %s: %w", s.path, err)
		}
		ops = append(ops, walOp{kind: opPut, pool: p.PoolKey, key: RecordKey(p.Allocation.ContainerID, p.Allocation.IfName),
			value: v, lastReserved: p.LastReserved})
	}
	for _, d := range deletes {
		ops = append(ops, walOp{kind: opDel, pool: d.PoolKey, key: RecordKey(d.ContainerID, d.IfName)})
	}
	// What bbolt would refuse is refused here, before it is in the log.
	for _, o := range ops {
		if err := validOp(o); err != nil {
			return fmt.Errorf("writing store %s: %w", s.path, err)
		}
	}
	start := time.Now()
	if err := s.log(ops); err != nil {
		s.commitFails.Add(1)
		return fmt.Errorf("writing store %s: %w", s.path, err)
	}
	s.commitNanos.Add(uint64(time.Since(start)))
	s.commits.Add(1)
	return nil
}

func validOp(o walOp) error {
	switch {
	case o.pool == "":
		return errors.New("an allocation without a pool key")
	case len(o.pool) > bolt.MaxKeySize || len(o.key) > bolt.MaxKeySize:
		return fmt.Errorf("pool key or record key longer than %d bytes", bolt.MaxKeySize)
	case len(o.value) > bolt.MaxValueSize:
		return fmt.Errorf("a record longer than %d bytes", bolt.MaxValueSize)
	}
	return nil
}

// unmapInterval is how often, at most, a commit drops the pages the daemon has
// read through bbolt's map since the last time (see unmapRead). Once commits
// no longer waited for the disk, filling 100,000 allocations went faster and
// touched more of the file between two drops: at one second, the daemon's
// peak RSS rose from 63 to 65-67 MiB; at a quarter second it is 59-61 MiB.
const unmapInterval = 250 * time.Millisecond

// unmapNowAndThen runs unmapRead in the background at most once per
// unmapInterval. Every write reads its path through the B+tree from the map,
// and copy-on-write puts each new version of a leaf on another page, so without
// this the pages mapped grow toward the whole file (37 MiB at 100,000
// allocations) between bbolt's remaps, which happen only when the file grows.
// What a commit needs again (the root and branch pages, a few leaves) comes
// back with a minor fault from the page cache.
func (s *Store) unmapNowAndThen() {
	now := time.Now().UnixNano()
	last := s.lastUnmap.Load()
	if now-last < int64(unmapInterval) || !s.lastUnmap.CompareAndSwap(last, now) {
		return
	}
	go s.unmapRead()
}

// Key names one allocation.
type Key struct {
	PoolKey, ContainerID, IfName string
}

// SavePool records a pool's last known block.
func (s *Store) SavePool(key string, block json.RawMessage) error {
	if err := s.waitChecked(); err != nil {
		return err
	}
	err := s.db.Batch(func(tx *bolt.Tx) error {
		return updatePool(tx, key, func(p *Pool) { p.Block, p.Inactive = block, false })
	})
	if err != nil {
		return fmt.Errorf("writing pool %s to store %s: %w", key, s.path, err)
	}
	return nil
}

// DeactivatePool records that the pool's block is no longer the node's: it is
// kept for the allocations made in it, but marked Inactive.
func (s *Store) DeactivatePool(key string) error {
	if err := s.waitChecked(); err != nil {
		return err
	}
	err := s.db.Batch(func(tx *bolt.Tx) error {
		return updatePool(tx, key, func(p *Pool) { p.Inactive = true })
	})
	if err != nil {
		return fmt.Errorf("marking pool %s inactive in store %s: %w", key, s.path, err)
	}
	return nil
}

// ErrPoolInUse is returned (wrapped) by DropPool for a pool that still holds
// allocations.
var ErrPoolInUse = errors.New("the pool still holds allocations")

// DropPool forgets a pool that holds no allocation: its record (last block,
// cursor) and its empty allocations bucket go, as if the pool had never been
// on this node. The caller makes sure nothing commits to the pool meanwhile
// (the daemon holds the pool's lock with nothing in flight): every commit
// acknowledged before is applied to the file first, so that no cursor update
// still in the log brings the record back. A pool that still holds an
// allocation is left as it is, with ErrPoolInUse.
func (s *Store) DropPool(key string) error {
	if err := s.waitChecked(); err != nil {
		return err
	}
	if err := s.settle(); err != nil {
		return fmt.Errorf("dropping pool %s from store %s: %w", key, s.path, err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		allocs := tx.Bucket(bucketAllocations)
		if b := allocs.Bucket([]byte(key)); b != nil {
			if k, _ := b.Cursor().First(); k != nil {
				return ErrPoolInUse
			}
			if err := allocs.DeleteBucket([]byte(key)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketPools).Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("dropping pool %s from store %s: %w", key, s.path, err)
	}
	return nil
}

func updatePool(tx *bolt.Tx, key string, mod func(*Pool)) error {
	b := tx.Bucket(bucketPools)
	p := Pool{Key: key}
	if v := b.Get([]byte(key)); v != nil {
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("pool %s: %w", key, err)
		}
	}
	mod(&p)
	v, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), v)
}

// Load returns every pool and allocation in the store, by pool key. A pool with
// allocations but no pool record is returned with an empty Pool.
func (s *Store) Load() (map[string]*PoolState, error) {
	if err := s.waitChecked(); err != nil {
		return nil, err
	}
	if err := s.settle(); err != nil {
		return nil, err
	}
	out := map[string]*PoolState{}
	get := func(key string) *PoolState {
		st, ok := out[key]
		if !ok {
			st = &PoolState{Pool: Pool{Key: key}}
			out[key] = st
		}
		return st
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketPools).ForEach(func(k, v []byte) error {
			st := get(string(k))
			if err := json.Unmarshal(v, &st.Pool); err != nil {
				return fmt.Errorf("pool %s: %w", k, err)
			}
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketAllocations).ForEachBucket(func(pk []byte) error {
			st := get(string(pk))
			return tx.Bucket(bucketAllocations).Bucket(pk).ForEach(func(k, v []byte) error {
				var a Allocation
				if err := json.Unmarshal(v, &a); err != nil {
					return fmt.Errorf("allocation %q in pool %s: %w", k, pk, err)
				}
				st.Allocations = append(st.Allocations, a)
				return nil
			})
		})
	})
	if err != nil {
		return nil, corrupt(s.path, err)
	}
	return out, nil
}

// fileExists reports whether path exists and is non-empty.
func fileExists(path string) (bool, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store %s: %w", path, err)
	}
	return st.Size() > 0, nil
}

// Snapshot reads the store at path without opening it for writing and without
// waiting for the lock the running daemon holds: it copies the file into memory,
// then checks and loads the copy, and adds what the log holds beyond it. For
// `ipamctl check`. An nv-ipam JSON store that was never imported is reported as
// such.
//
// bbolt's meta pages are checksummed, so a copy taken while one commit writes
// opens at the last complete transaction; but a copy that spans two commits
// can hold pages the second one reused, which the check finds. Such a copy is
// taken again, up to snapshotTries times in all: a file that is really broken
// fails every time.
func Snapshot(path string) (map[string]*PoolState, error) {
	if isNVIPAM, err := looksLikeNVIPAMStore(path); err != nil {
		return nil, err
	} else if isNVIPAM {
		return nil, fmt.Errorf("%s is an nv-ipam JSON store that ipam-node has not imported yet (it does on its next start)", path)
	}
	for try := 1; ; try++ {
		pools, err := snapshotOnce(path)
		if err == nil || !errors.Is(err, ErrCorrupt) || try == snapshotTries {
			return pools, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const snapshotTries = 5

func snapshotOnce(path string) (map[string]*PoolState, error) {
	// The log first: what the checkpointer moves from it into the file after
	// this read is in the copy below; what the copy lacks is in this read.
	logData, err := readWALFile(path + ".wal")
	if err != nil {
		return nil, err
	}
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the store: %w", err)
	}
	defer src.Close()
	// The copy lives in memory (a memfd), so that this works on a read-only root
	// file system such as the ipam-node container's.
	fd, err := unix.MemfdCreate("hwipam-store-snapshot", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("copying the store: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "hwipam-store-snapshot")
	defer mem.Close()
	if _, err := io.Copy(mem, src); err != nil {
		return nil, fmt.Errorf("copying the store %s: %w", path, err)
	}
	db, err := openSnapshot(fmt.Sprintf("/proc/self/fd/%d", mem.Fd()), path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	checked := make(chan struct{})
	close(checked) // below, before Load
	s := &Store{db: db, path: path, checked: checked}
	if err := db.View(func(tx *bolt.Tx) error {
		var first error
		for e := range tx.Check() {
			if first == nil {
				first = e
			}
		}
		if first != nil {
			return first
		}
		if v := tx.Bucket(bucketMeta); v == nil || !bytes.Equal(v.Get(keySchema), []byte(schemaVersion)) {
			return fmt.Errorf("no schema %s marker", schemaVersion)
		}
		if tx.Bucket(bucketPools) == nil || tx.Bucket(bucketAllocations) == nil {
			return errors.New("buckets missing")
		}
		return nil
	}); err != nil {
		return nil, corrupt(path, err)
	}
	pools, err := s.Load()
	if err != nil {
		return nil, err
	}
	var id, applied uint64
	if err := db.View(func(tx *bolt.Tx) error { id, applied = walMeta(tx); return nil }); err != nil {
		return nil, corrupt(path, err)
	}
	logged, err := parseWAL(logData, id)
	if err == nil {
		err = applyToSnapshot(pools, logged, applied)
	}
	if err != nil {
		return nil, fmt.Errorf("the store's log %s.wal cannot be read: %w", path, err)
	}
	return pools, nil
}

func openSnapshot(copyPath, path string) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	db, err = bolt.Open(copyPath, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return nil, corrupt(path, err)
	}
	return db, nil
}
