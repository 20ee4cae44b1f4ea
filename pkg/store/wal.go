package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// The write-ahead log, <store-file>.wal. A bbolt commit flushes the disk twice
// (its new pages, then its meta page), and an allocation was acknowledged only
// after both: two device flushes on every ADD and DEL. Commit now appends the
// change to this log; a background checkpointer applies what the log holds to
// the bbolt file in one transaction (two flushes for many changes) and records
// there the last sequence number applied. Open replays what the bbolt file
// lacks, and the bbolt file is consistent at every instant, as before (it is
// still written only by bbolt's own, fully synced transactions).
//
// What a commit waits for. Commit returns once its record is written to the
// log's file, in the kernel's page cache: from then on it survives a crash or
// kill of ipam-node at any instant (the page cache outlives the process; this
// is the invariant DESIGN.md §5 asks for). The flusher fdatasyncs the log in
// the background, flushDelay (5 ms) after the first record it has not flushed
// (the commits made meanwhile share the flush), so a record reaches the disk
// within 5 ms of its commit plus at most two flushes (one may be under way).
// What a power loss or kernel crash can take is the last records not yet
// flushed; it also takes every pod on the node with it
// (their network namespaces and interfaces are gone), so no live pod holds an
// address whose record was lost, and a lost deletion only leaves an allocation
// for the stale-allocation cleaner or CNI GC to release. Waiting for the disk
// on every ADD and DEL cost 0.2-0.4 ms here, a third of the CNI call above a
// bare exec.
//
// Records are appended to an in-memory copy of the current generation and
// written from it: a write covers everything appended since the last one, so
// concurrent commits share it.
//
// Layout: a header, then records, in a file of fixed size written with zeros
// when made (so an append allocates nothing and its flush writes no metadata):
//
//	header: "hwipwal2" | generation u64 | store ID u64 | crc32c(first 24 bytes) u32 | 0 u32
//	record: payload length u32 | crc32c(generation..payload) u32 | generation u64 | sequence u64 | payload
//	payload: ops, each: kind byte | pool key | record key | value | last reserved (uvarint-prefixed strings)
//
// When the log is full, everything in it is checkpointed and a new generation
// starts at the front: the header is rewritten with the generation plus one
// (see newGeneration), and replay stops at the first record that is not of the header's generation,
// has a bad checksum, or does not continue the sequence. Sequence numbers grow
// across generations; the bbolt file's meta bucket holds the last one applied
// ("walSeq"), so replay skips what is already there. The store ID is a random
// number the bbolt file keeps ("walID"): a log whose header names another (left
// from a store that was moved away, or from before an nv-ipam import) is
// another store's, and is never replayed.
//
// A log record that fails to be written or flushed leaves the log in an
// unknown state: the store then refuses every write until ipam-node restarts
// (and replays what the log's file holds; after a failed flush, what was
// answered is put into the bbolt file first); see poison and flusher.

const (
	walMagic      = "hwipwal2"
	walHeaderSize = 32
	walRecHeader  = 24
	// DefaultWALSize is the log's size: about 1,000 allocations' records before
	// it wraps (the checkpointer applies it when half full, and again as it
	// fills: see nextKick). Its in-memory copy, and the records not yet
	// checkpointed, are on the daemon's RSS.
	DefaultWALSize = 256 << 10
	// walBlock is the page size: the log's size is a multiple of it, and the
	// in-memory copy keeps its first page across generations.
	walBlock = 4096
)

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	keyWALSeq  = []byte("walSeq")
	keyWALID   = []byte("walID")
)

const (
	opPut byte = 1
	opDel byte = 2
)

// walOp is one change of a Commit: a record put (with the pool's cursor) or
// deleted.
type walOp struct {
	kind         byte
	pool, key    string
	value        []byte
	lastReserved string
}

type walEntry struct {
	seq uint64
	ops []walOp
}

// wal is the log's state, guarded by mu (see Store for the lock order).
type wal struct {
	path string
	id   uint64 // the store's ID, in the header
	fd   int
	size int64
	// mirror holds the current generation as the file does, up to off; writes
	// go out from it. An anonymous map of the log's size.
	mirror  []byte
	saveOff int64 // the file holds mirror[:saveOff]; with syncMu held

	mu      sync.Mutex
	gen     uint64
	off     int64
	kickAt  int64      // past this offset a commit asks for a checkpoint at once (nextKick)
	written uint64     // the last sequence number appended (to mirror; in the file once saved)
	applied uint64     // the last sequence number in the bbolt file
	pending []walEntry // written, not yet in the bbolt file, in sequence order
	err     error      // set once: see poison
	cond    *sync.Cond // signalled when applied or err changes

	saved      atomic.Uint64 // the last sequence number written to the file (the page cache)
	flushed    atomic.Uint64 // the last sequence number on the disk (fdatasync'd)
	syncMu     sync.Mutex    // one write (or wrap) at a time; the others wait for it and share it
	dirty      chan struct{} // a write the flusher has not flushed yet
	flushFd    int           // the flusher's own descriptor of the file (it closes it)
	flushFault atomic.Bool   // tests: every flush fails

	ckMu      sync.Mutex  // one checkpoint (or wrap) at a time
	held      atomic.Bool // tests: the checkpointer applies nothing while set
	closeOnce sync.Once
	kick      chan struct{} // a checkpoint now
	due       chan struct{} // a checkpoint after checkpointDelay
	// dueSet: the checkpointer's timer runs, and the checkpoint it starts will
	// apply every record saved before the flag is cleared; a commit that finds
	// it set does not signal due. Each signal wakes the checkpointer (a thread
	// to wake, with an interrupt to another CPU) while the caller waits for its
	// commit; without this every commit paid that, to start a timer that ran.
	dueSet   atomic.Bool
	stop     chan struct{}
	ended    chan struct{} // the checkpointer has returned
	flushEnd chan struct{} // the flusher has returned
}

func encodeOps(ops []walOp) []byte {
	var b []byte
	for _, o := range ops {
		b = append(b, o.kind)
		for _, s := range []string{o.pool, o.key, string(o.value), o.lastReserved} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

func decodeOps(b []byte) ([]walOp, error) {
	var ops []walOp
	for len(b) > 0 {
		o := walOp{kind: b[0]}
		if o.kind != opPut && o.kind != opDel {
			return nil, fmt.Errorf("unknown operation %d", o.kind)
		}
		b = b[1:]
		var fields [4]string
		for i := range fields {
			n, w := binary.Uvarint(b)
			if w <= 0 || n > uint64(len(b)-w) {
				return nil, errors.New("truncated operation")
			}
			fields[i] = string(b[w : w+int(n)])
			b = b[w+int(n):]
		}
		o.pool, o.key, o.lastReserved = fields[0], fields[1], fields[3]
		if o.kind == opPut {
			o.value = []byte(fields[2])
		}
		ops = append(ops, o)
	}
	return ops, nil
}

func walHeader(gen, id uint64) []byte {
	h := make([]byte, walHeaderSize)
	copy(h, walMagic)
	binary.LittleEndian.PutUint64(h[8:], gen)
	binary.LittleEndian.PutUint64(h[16:], id)
	binary.LittleEndian.PutUint32(h[24:], crc32.Checksum(h[:24], castagnoli))
	return h
}

func walRecord(gen, seq uint64, payload []byte) []byte {
	r := make([]byte, walRecHeader+len(payload))
	binary.LittleEndian.PutUint32(r[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(r[8:], gen)
	binary.LittleEndian.PutUint64(r[16:], seq)
	copy(r[walRecHeader:], payload)
	binary.LittleEndian.PutUint32(r[4:], crc32.Checksum(r[8:], castagnoli))
	return r
}

// parseWAL returns a log's records, in order, up to the first that is torn, of
// another generation than the header's, or out of sequence. A log whose header
// is not valid (never written, or torn while a new generation started: all
// before it had been checkpointed) or names another store than id has none.
func parseWAL(data []byte, id uint64) (entries []walEntry, err error) {
	if len(data) < walHeaderSize || string(data[:8]) != walMagic ||
		binary.LittleEndian.Uint32(data[24:]) != crc32.Checksum(data[:24], castagnoli) ||
		binary.LittleEndian.Uint64(data[16:]) != id {
		return nil, nil
	}
	gen := binary.LittleEndian.Uint64(data[8:])
	off := walHeaderSize
	for off+walRecHeader <= len(data) {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		if n > len(data)-off-walRecHeader {
			break
		}
		rec := data[off : off+walRecHeader+n]
		if binary.LittleEndian.Uint32(rec[4:]) != crc32.Checksum(rec[8:], castagnoli) ||
			binary.LittleEndian.Uint64(rec[8:]) != gen {
			break
		}
		seq := binary.LittleEndian.Uint64(rec[16:])
		if len(entries) > 0 && seq != entries[len(entries)-1].seq+1 {
			break
		}
		ops, err := decodeOps(rec[walRecHeader:])
		if err != nil {
			// The checksum holds, so this log was written by something else.
			return nil, fmt.Errorf("record %d: %w", seq, err)
		}
		entries = append(entries, walEntry{seq: seq, ops: ops})
		off += walRecHeader + n
	}
	return entries, nil
}

// readWALFile reads the log at path; a missing log is empty. It is written
// through the page cache, and read through it.
func readWALFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the store's log %s: %w", path, err)
	}
	return data, nil
}

// walMeta reads the bbolt file's store ID and the last sequence number it holds.
func walMeta(tx *bolt.Tx) (id, applied uint64) {
	meta := tx.Bucket(bucketMeta)
	id, _ = strconv.ParseUint(string(meta.Get(keyWALID)), 10, 64)
	applied, _ = strconv.ParseUint(string(meta.Get(keyWALSeq)), 10, 64)
	return id, applied
}

// applyOps writes ops into the bbolt file, and the sequence number they end at.
// Each pool's cursor is written once, with the last value the entries give it.
func applyOps(tx *bolt.Tx, entries []walEntry) error {
	allocs := tx.Bucket(bucketAllocations)
	cursors := map[string]string{}
	for _, e := range entries {
		for _, o := range e.ops {
			switch o.kind {
			case opPut:
				b, err := allocs.CreateBucketIfNotExists([]byte(o.pool))
				if err != nil {
					return fmt.Errorf("pool %q: %w", o.pool, err)
				}
				if err := b.Put([]byte(o.key), o.value); err != nil {
					return fmt.Errorf("allocation %q in pool %s: %w", o.key, o.pool, err)
				}
				if o.lastReserved != "" {
					cursors[o.pool] = o.lastReserved
				}
			case opDel:
				if b := allocs.Bucket([]byte(o.pool)); b != nil {
					if err := b.Delete([]byte(o.key)); err != nil {
						return fmt.Errorf("allocation %q in pool %s: %w", o.key, o.pool, err)
					}
				}
			}
		}
	}
	for pool, cursor := range cursors {
		if err := updatePool(tx, pool, func(p *Pool) { p.LastReserved = cursor }); err != nil {
			return err
		}
	}
	if len(entries) == 0 {
		return nil
	}
	return tx.Bucket(bucketMeta).Put(keyWALSeq, []byte(strconv.FormatUint(entries[len(entries)-1].seq, 10)))
}

// openWAL replays the log into the bbolt file and starts a new generation of
// it, then starts the checkpointer.
func (s *Store) openWAL(size int64) error {
	path := s.path + ".wal"
	var id, applied uint64
	if err := s.db.View(func(tx *bolt.Tx) error { id, applied = walMeta(tx); return nil }); err != nil {
		return err
	}
	if id == 0 {
		// A store file from before the log (a new store, or an imported one,
		// gets its ID when it is made). Beside no log, or one that never got a
		// header, this is the upgrade: it gets its ID before any log is
		// written for it. Beside a log of some store, the file is a backup put
		// back: it predates every log, so it is refused as older than its log,
		// before anything is written to either file.
		if err := refuseOlderThanLog(s.path, path); err != nil {
			return err
		}
		if err := s.waitChecked(); err != nil {
			return err
		}
		if err := s.db.Update(func(tx *bolt.Tx) error { return putStoreID(tx.Bucket(bucketMeta)) }); err != nil {
			return fmt.Errorf("writing store %s: %w", s.path, err)
		}
		if err := s.db.View(func(tx *bolt.Tx) error { id, _ = walMeta(tx); return nil }); err != nil {
			return err
		}
	}
	data, err := readWALFile(path)
	if err != nil {
		return err
	}
	entries, err := parseWAL(data, id)
	if err != nil {
		return fmt.Errorf("the store's log %s cannot be read: %w", path, err)
	}
	last := applied
	var replay []walEntry
	for _, e := range entries {
		if e.seq > applied {
			replay = append(replay, e)
		}
		last = max(last, e.seq)
	}
	if len(replay) > 0 && replay[0].seq != applied+1 {
		// The log goes on from a later state of this store than the file
		// holds: the file was put back from a backup, say. Its records would
		// be applied to a state they do not follow.
		return fmt.Errorf("store %s holds changes up to %d, but its log %s continues only from change %d: the store file "+
			"is older than its log (put back from a backup?). To start from the store file alone, move the log away "+
			"and restart; changes made after the store file was saved are then forgotten", s.path, applied, path, replay[0].seq)
	}
	if len(replay) > 0 {
		if err := s.waitChecked(); err != nil {
			return err
		}
		if err := s.db.Update(func(tx *bolt.Tx) error { return applyOps(tx, replay) }); err != nil {
			return fmt.Errorf("replaying the store's log %s into %s: %w", path, s.path, err)
		}
	}
	size = max(size&^(walBlock-1), 2*walBlock)
	w := &wal{path: path, id: id, size: size, written: last, applied: last, fd: -1,
		kick: make(chan struct{}, 1), due: make(chan struct{}, 1), dirty: make(chan struct{}, 1),
		stop: make(chan struct{}), ended: make(chan struct{}), flushEnd: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	w.saved.Store(last)
	w.flushed.Store(last)
	// Everything the log held is in the bbolt file now. A new log of zeros
	// takes its place, so that no record of an earlier run is left after the
	// ones this run writes (a generation's first write, torn by a power loss,
	// could otherwise leave later blocks of it to be read after a restart's).
	if err := w.create(); err != nil {
		return err
	}
	if err := w.open(); err != nil {
		return err
	}
	w.newGeneration()
	s.wal = w
	go s.checkpointer()
	go s.flusher()
	return nil
}

// putStoreID gives a store its log ID, a random number other than 0.
func putStoreID(meta *bolt.Bucket) error {
	id := rand.Uint64()
	for id == 0 {
		id = rand.Uint64()
	}
	return meta.Put(keyWALID, []byte(strconv.FormatUint(id, 10)))
}

// refuseOlderThanLog refuses a store file with no log ID (written before the
// log existed) beside a log that has a store's header: see openWAL.
func refuseOlderThanLog(storePath, logPath string) error {
	data, err := readWALFile(logPath)
	if err != nil {
		return err
	}
	if len(data) < walHeaderSize || string(data[:8]) != walMagic ||
		binary.LittleEndian.Uint32(data[24:]) != crc32.Checksum(data[:24], castagnoli) {
		return nil // no log, or one that holds nothing
	}
	entries, _ := parseWAL(data, binary.LittleEndian.Uint64(data[16:]))
	held := ""
	if len(entries) > 0 {
		held = fmt.Sprintf(" (its records go up to change %d)", entries[len(entries)-1].seq)
	}
	return fmt.Errorf("store %s has no log ID: it was written before ipam-node kept a log, but the log beside it, %s, "+
		"belongs to a store that kept one%s: the store file is older than its log (put back from a backup?). Nothing was "+
		"changed. Put back the store file that goes with this log; or, to go back to this older store file, move the log "+
		"away and restart: the allocations made since the backup are then forgotten, and their addresses may be handed "+
		"out again", storePath, logPath, held)
}

// open opens the log for writing, with a second descriptor for the flusher,
// and maps its in-memory copy.
func (w *wal) open() (err error) {
	if w.fd, err = unix.Open(w.path, unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		return fmt.Errorf("opening the store's log %s: %w", w.path, err)
	}
	if w.flushFd, err = unix.Dup(w.fd); err != nil {
		_ = w.closeFile()
		return fmt.Errorf("opening the store's log %s: %w", w.path, err)
	}
	if w.mirror, err = unix.Mmap(-1, 0, int(w.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		_ = w.closeFile()
		_ = unix.Close(w.flushFd)
		return fmt.Errorf("mapping the store's log buffer: %w", err)
	}
	return nil
}

// closeFile closes the log's file (not the flusher's descriptor) and unmaps
// its in-memory copy.
func (w *wal) closeFile() error {
	var err error
	if w.fd >= 0 {
		err = unix.Close(w.fd)
		w.fd = -1
	}
	if w.mirror != nil {
		_ = unix.Munmap(w.mirror)
		w.mirror = nil
	}
	return err
}

// writeAt writes b at off, into the page cache.
func (w *wal) writeAt(b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(w.fd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("writing its log: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("writing its log: no progress with %d bytes left", len(b))
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

// create writes a new log of zeros, in place of whatever is at its path (it
// holds nothing the bbolt file lacks); its first header comes with its first
// record.
func (w *wal) create() error {
	tmp := w.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("creating the store's log: %w", err)
	}
	_, err = f.Write(make([]byte, w.size))
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err == nil {
		err = os.Rename(tmp, w.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(w.path))
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("creating the store's log %s: %w", w.path, err)
	}
	return f.Close()
}

// newGeneration starts the log over at its front, with syncMu and mu held (or
// before the log is shared); everything in it must be in the bbolt file. The
// new header goes to the file with the generation's first record, in one
// write: until then the file's old header stands, over records all applied. A
// power loss that tears that write leaves a header that does not check, which
// Open reads as a log holding nothing: it loses what a power loss may lose
// (see the top of this file). Only mirror[:off] is ever written, so what the
// last generation left beyond the header needs no clearing.
func (w *wal) newGeneration() {
	w.gen++
	copy(w.mirror, walHeader(w.gen, w.id))
	if w.off > walBlock {
		// Give back the pages the last generation used.
		_ = unix.Madvise(w.mirror[walBlock:], unix.MADV_DONTNEED)
	}
	w.off = walHeaderSize
	w.saveOff = 0
	w.nextKick()
}

// nextKick sets where the next commit asks for a checkpoint at once: when the
// log is half full, then halfway through what is left of it, and so on while
// more than a sixteenth is left; with mu held. The commit that wraps the log
// applies inline what is not yet in the bbolt file, and waits for it with
// every other commit: these checkpoints leave it at most the records of the
// last sixteenth. They are a few per generation: each is a bbolt transaction
// with two device flushes, and asking for one with every commit past the half
// would make most of a burst's commits (about 1 ms apart) a transaction of
// their own.
func (w *wal) nextKick() {
	left := w.size - w.off
	switch {
	case w.off < w.size/2:
		w.kickAt = w.size / 2
	case left <= w.size/16:
		w.kickAt = w.size // none before the wrap
	default:
		w.kickAt = w.off + left/2
	}
}

// poison stops every later write: after a failed write or flush of the log,
// what the file holds is not known, and a later record must not follow one
// the caller was told had failed. Called with w.mu held.
func (w *wal) poison(path string, err error) error {
	if w.err == nil {
		w.err = fmt.Errorf("store %s: %w; nothing more is written until ipam-node restarts (it then replays what "+
			"its log holds): check the disk and restart ipam-node", path, err)
		w.cond.Broadcast()
	}
	return w.err
}

// log appends ops to the log as one record and returns once it is written to
// the file (see the top of this file for why not once it is on the disk).
func (s *Store) log(ops []walOp) error {
	w := s.wal
	payload := encodeOps(ops)
	need := int64(walRecHeader + len(payload))
	if need > w.size-walHeaderSize {
		// Larger than the log: into the bbolt file at once, after everything
		// pending, in one transaction (as a wrap does).
		defer w.lockAll()()
		if w.err != nil {
			return w.err
		}
		w.written++
		w.pending = append(w.pending, walEntry{seq: w.written, ops: ops})
		return s.wrapLocked()
	}
	w.mu.Lock()
	if w.err == nil && w.off+need > w.size {
		// Full: checkpoint everything and start over (lock order: syncMu,
		// ckMu, mu).
		w.mu.Unlock()
		w.syncMu.Lock()
		w.ckMu.Lock()
		w.mu.Lock()
		if w.err == nil && w.off+need > w.size {
			_ = s.wrapLocked()
		}
		w.ckMu.Unlock()
		w.syncMu.Unlock()
	}
	if w.err != nil {
		defer w.mu.Unlock()
		return w.err
	}
	seq := w.written + 1
	copy(w.mirror[w.off:], walRecord(w.gen, seq, payload))
	w.off += need
	w.written = seq
	w.pending = append(w.pending, walEntry{seq: seq, ops: ops})
	now := w.off > w.kickAt
	if now {
		w.nextKick()
	}
	w.mu.Unlock()
	if err := s.saveTo(seq); err != nil {
		return err
	}
	// A checkpoint at once as the log fills up (so that the commit that wraps
	// it has little to apply), else after checkpointDelay unless one is due.
	ch := w.due
	switch {
	case now:
		ch = w.kick
	case w.dueSet.Load():
		return nil
	}
	select {
	case ch <- struct{}{}:
	default:
	}
	return nil
}

// lockAll takes the log's three locks in their order and returns what
// releases them.
func (w *wal) lockAll() (unlock func()) {
	w.syncMu.Lock()
	w.ckMu.Lock()
	w.mu.Lock()
	return func() {
		w.mu.Unlock()
		w.ckMu.Unlock()
		w.syncMu.Unlock()
	}
}

// saveTo returns once the record seq is written to the file, and has the
// flusher flush it. Callers that arrive during a write wait for it and then
// share the next one.
func (s *Store) saveTo(seq uint64) error {
	w := s.wal
	if w.saved.Load() >= seq {
		return nil
	}
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.saved.Load() >= seq {
		return nil
	}
	// Appends go on during the write, past end: the bytes written are not
	// touched until the next generation, which needs syncMu.
	w.mu.Lock()
	upto, start, end, err := w.written, w.saveOff, w.off, w.err
	w.mu.Unlock()
	if err != nil {
		return err
	}
	if err := w.writeAt(w.mirror[start:end], start); err != nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.poison(s.path, err)
	}
	w.saveOff = end
	raise(&w.saved, upto)
	select {
	case w.dirty <- struct{}{}:
	default:
	}
	return nil
}

// flushDelay is how long the flusher lets writes gather after the first one
// it has not flushed: each flush is a device round trip, and on a virtual
// disk a few hundred microseconds of CPU in the host's exits; during a burst
// of pods one flush then covers every commit of the last flushDelay rather
// than one or two. It bounds, with the flush itself, how long an answered
// change is only in the page cache.
const flushDelay = 5 * time.Millisecond

// flusher fdatasyncs the log flushDelay after something was written to it
// since its last flush, until the store closes. Commits do not wait for it.
//
// A failed flush stops every later write (see poison), but the commits already
// answered are only in the page cache, whose pages the kernel marks clean after
// a writeback error and may drop: so first they all go into the bbolt file,
// which syncs its own writes, and a restart finds them there.
func (s *Store) flusher() {
	w := s.wal
	defer close(w.flushEnd)
	defer unix.Close(w.flushFd)
	timer := time.NewTimer(flushDelay)
	timer.Stop()
	for {
		select {
		case <-w.dirty:
		case <-w.stop:
			return
		}
		timer.Reset(flushDelay)
		select {
		case <-timer.C:
		case <-w.stop:
			return
		}
		// Writes made during the wait are covered by this flush: their
		// signal is taken, so that no empty flush follows.
		select {
		case <-w.dirty:
		default:
		}
		upto := w.saved.Load()
		if upto <= w.flushed.Load() {
			continue
		}
		err := unix.Fdatasync(w.flushFd)
		for errors.Is(err, unix.EINTR) {
			err = unix.Fdatasync(w.flushFd)
		}
		if w.flushFault.Load() {
			err = unix.EIO
		}
		if err != nil {
			unlock := w.lockAll()
			if w.err == nil {
				_ = s.applyLocked(w.savedPending(w.saved.Load(), len(w.pending)), false) // poisons the log itself if it fails
			}
			_ = w.poison(s.path, fmt.Errorf("flushing its log: %w", err))
			unlock()
			return
		}
		raise(&w.flushed, upto)
		s.transactions.Add(1)
	}
}

// savedPending is how many of the first limit pending entries are written to
// the file, up to the record saved; with mu held.
func (w *wal) savedPending(saved uint64, limit int) int {
	n := 0
	for n < len(w.pending) && n < limit && w.pending[n].seq <= saved {
		n++
	}
	return n
}

// raise sets v to seq unless it is already past it.
func raise(v *atomic.Uint64, seq uint64) {
	for {
		cur := v.Load()
		if cur >= seq || v.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// wrapLocked checkpoints all of the log and starts a new generation; with
// syncMu, ckMu and mu held. Records not yet written or flushed are durable
// once the bbolt file has them.
func (s *Store) wrapLocked() error {
	w := s.wal
	// mu stays held: a record appended now would be lost to the new generation.
	if err := s.applyLocked(len(w.pending), false); err != nil {
		return err
	}
	raise(&w.saved, w.written)
	raise(&w.flushed, w.written)
	w.newGeneration()
	return nil
}

// applyLocked writes the first n pending entries into the bbolt file; with
// ckMu and mu held. With release, mu is released while bbolt commits, so that
// appends go on meanwhile.
func (s *Store) applyLocked(n int, release bool) error {
	w := s.wal
	if n == 0 {
		return nil
	}
	batch := w.pending[:n:n]
	if release {
		w.mu.Unlock()
	}
	err := s.waitChecked()
	if err == nil {
		err = s.db.Update(func(tx *bolt.Tx) error { return applyOps(tx, batch) })
	}
	if release {
		w.mu.Lock()
	}
	if err != nil {
		return w.poison(s.path, fmt.Errorf("checkpointing its log: %w", err))
	}
	s.checkpoints.Add(1)
	w.pending = append([]walEntry(nil), w.pending[n:]...)
	w.applied = batch[n-1].seq
	w.cond.Broadcast()
	return nil
}

// checkpointDelay is how long a commit's record may wait in the log alone
// before the checkpointer applies it to the bbolt file. A checkpoint is a
// bbolt transaction, two device flushes and the writes of every page it
// changed (on a virtual disk, each costs exits to the host): during a burst of
// pods, checkpoints every quarter second took about 0.09 ms of the daemon's
// 0.31 ms of CPU per allocation; every second, or as the log fills up (see
// nextKick), they are few, and apply many commits at once. Reads do not wait
// for it (they ask for a checkpoint at once), nor does a log filling up.
const checkpointDelay = time.Second

// checkpointer applies saved records to the bbolt file: checkpointDelay
// after the first record it has not applied, or at once when asked (kick).
func (s *Store) checkpointer() {
	w := s.wal
	defer close(w.ended)
	timer := time.NewTimer(checkpointDelay)
	timer.Stop()
	for {
		select {
		case <-w.due:
			// Only this goroutine sets or clears dueSet: set, the timer runs.
			if !w.dueSet.Load() {
				timer.Reset(checkpointDelay)
				w.dueSet.Store(true)
			}
			continue
		case <-w.kick:
		case <-timer.C:
			// Before the checkpoint: a record saved after this signals again.
			w.dueSet.Store(false)
		case <-w.stop:
			timer.Stop()
			return
		}
		s.checkpoint()
	}
}

// checkpoint applies every saved record to the bbolt file.
func (s *Store) checkpoint() {
	w := s.wal
	if w.held.Load() {
		return
	}
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	saved := w.saved.Load()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.err == nil {
		n := w.savedPending(saved, checkpointBatch)
		if n == 0 || s.applyLocked(n, true) != nil {
			return
		}
		s.unmapNowAndThen()
	}
}

// checkpointBatch bounds the records one checkpoint transaction applies: a
// bbolt transaction holds every page it changes in memory until it commits,
// and half a log's records at once (during a burst, or the 100,000
// allocations of BenchmarkNodeDaemon) put several MiB on the daemon's peak.
const checkpointBatch = 256

// settle returns once every acknowledged commit is in the bbolt file, for
// reads of it.
func (s *Store) settle() error {
	w := s.wal
	if w == nil {
		return nil
	}
	target := w.saved.Load()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.applied < target && w.err == nil {
		select {
		case w.kick <- struct{}{}:
		default:
		}
		w.cond.Wait()
	}
	return w.err
}

// closeWAL stops the checkpointer, checkpoints what is left and closes the log.
func (s *Store) closeWAL() error {
	w := s.wal
	if w == nil {
		return nil
	}
	w.closeOnce.Do(func() { close(w.stop) })
	<-w.ended
	<-w.flushEnd
	defer w.lockAll()()
	if errors.Is(w.err, errClosed) {
		return nil
	}
	var err error
	if w.err == nil && w.written > w.applied {
		err = s.wrapLocked()
	}
	if err == nil {
		err = w.err
	}
	// A commit or read after Close fails, rather than write to a closed file.
	w.err = fmt.Errorf("store %s: %w", s.path, errClosed)
	w.cond.Broadcast()
	if cerr := w.closeFile(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

var errClosed = errors.New("the store is closed")

// applyToSnapshot replays log entries past what a copy of the bbolt file holds
// (applied) onto the pools loaded from it.
func applyToSnapshot(pools map[string]*PoolState, entries []walEntry, applied uint64) error {
	for _, e := range entries {
		if e.seq <= applied {
			continue
		}
		for _, o := range e.ops {
			st := pools[o.pool]
			if st == nil {
				if o.kind == opDel {
					continue
				}
				st = &PoolState{Pool: Pool{Key: o.pool}}
				pools[o.pool] = st
			}
			kept := st.Allocations[:0]
			for _, a := range st.Allocations {
				if RecordKey(a.ContainerID, a.IfName) != o.key {
					kept = append(kept, a)
				}
			}
			st.Allocations = kept
			if o.kind == opPut {
				var a Allocation
				if err := json.Unmarshal(o.value, &a); err != nil {
					return fmt.Errorf("log record %d: allocation %q: %w", e.seq, o.key, err)
				}
				st.Allocations = append(st.Allocations, a)
				if o.lastReserved != "" {
					st.Pool.LastReserved = o.lastReserved
				}
			}
		}
	}
	return nil
}
