package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// openNew opens a new store in a temporary directory; the test closes it (or
// crashes it).
func openNew(t *testing.T, opts store.Options) (*store.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	s, err := store.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

// reopenAgrees opens the store at path, as the next run of the daemon does,
// and fails the test unless it holds what m says.
func reopenAgrees(t *testing.T, path string, opts store.Options, m model) {
	t.Helper()
	s, err := store.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.agrees(pools); err != nil {
		t.Fatal(err)
	}
}

// model is what the store must hold: pool key → record key → address.
type model map[string]map[string]string

func (m model) apply(puts []store.Put, dels []store.Key) {
	for _, p := range puts {
		if m[p.PoolKey] == nil {
			m[p.PoolKey] = map[string]string{}
		}
		m[p.PoolKey][store.RecordKey(p.Allocation.ContainerID, p.Allocation.IfName)] = p.Allocation.IP
	}
	for _, d := range dels {
		delete(m[d.PoolKey], store.RecordKey(d.ContainerID, d.IfName))
	}
}

// agrees reports how pools (as Load or Snapshot return them) differ from m.
func (m model) agrees(pools map[string]*store.PoolState) error {
	var diffs []string
	seen := map[string]bool{}
	for key, p := range pools {
		for _, a := range p.Allocations {
			k := store.RecordKey(a.ContainerID, a.IfName)
			seen[key+"/"+k] = true
			if want, ok := m[key][k]; !ok || want != a.IP {
				diffs = append(diffs, fmt.Sprintf("%s %q holds %s, want %q", key, k, a.IP, want))
			}
		}
	}
	for key, recs := range m {
		for k, ip := range recs {
			if !seen[key+"/"+k] {
				diffs = append(diffs, fmt.Sprintf("%s %q (%s) is missing", key, k, ip))
			}
		}
	}
	slices.Sort(diffs)
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs[:min(len(diffs), 10)], "; "))
	}
	return nil
}

// randomCommit is a commit of one to three puts and deletes over a few pools
// and containers, so that puts overwrite and deletes hit.
func randomCommit(r *rand.Rand, step int) ([]store.Put, []store.Key) {
	var puts []store.Put
	var dels []store.Key
	for range 1 + r.IntN(3) {
		pool := []string{"a", "b", "cidrpool/c"}[r.IntN(3)]
		cid := fmt.Sprintf("c%d", r.IntN(40))
		if r.IntN(3) == 0 {
			dels = append(dels, store.Key{PoolKey: pool, ContainerID: cid, IfName: "net1"})
			continue
		}
		a := alloc(cid, "net1", fmt.Sprintf("10.%d.%d.%d", step/65536%256, step/256%256, step%256))
		puts = append(puts, store.Put{PoolKey: pool, Allocation: a, LastReserved: a.IP})
	}
	return puts, dels
}

// TestLogReplayModel runs random commits against a model, with random stops:
// a crash (what is written stays, nothing pending is applied, with the
// checkpointer sometimes held so that commits are only in the log), a torn
// record left after a crash, a clean close, and a Snapshot of the open store.
// The log is small, so it wraps many times. Every acknowledged commit must be
// there after each, and nothing else.
func TestLogReplayModel(t *testing.T) {
	r := harness.Rand(t)
	opts := store.Options{WALSize: 8192}
	s, path := openNew(t, opts)
	var err error
	defer func() { _ = s.Close() }()
	m := model{}
	cursors := map[string]string{} // pool → its last reserved address
	var release func()
	crashes, tears, wraps := 0, 0, 0
	lastEnd := int64(0)
	for step := range 3000 {
		switch op := r.IntN(100); {
		case op < 2 || op < 4 && release != nil: // crash, and open again
			torn := r.IntN(2) == 0
			logPath, end := s.LogEnd()
			s.Crash()
			crashes++
			if torn {
				// An append that was under way: its record is written in part, or
				// whole without its flush returning; either way not acknowledged.
				tornRecord(t, r, logPath, end)
				tears++
			}
			release = nil
			if s, err = store.Open(path, opts); err != nil {
				t.Fatalf("step %d: open after a crash: %v", step, err)
			}
		case op < 5: // clean close, and open again
			if release != nil {
				release()
				release = nil
			}
			if err := s.Close(); err != nil {
				t.Fatalf("step %d: close: %v", step, err)
			}
			if s, err = store.Open(path, opts); err != nil {
				t.Fatalf("step %d: open: %v", step, err)
			}
		case op < 8 && release == nil:
			release = s.HoldCheckpoints()
		case op < 11 && release != nil:
			release()
			release = nil
		case op < 14:
			snap, err := store.Snapshot(path)
			if err != nil {
				t.Fatalf("step %d: snapshot: %v", step, err)
			}
			if err := m.agrees(snap); err != nil {
				t.Fatalf("step %d: the snapshot disagrees with the model: %v", step, err)
			}
			continue
		default:
			puts, dels := randomCommit(r, step)
			if err := s.Commit(puts, dels); err != nil {
				t.Fatalf("step %d: commit: %v", step, err)
			}
			m.apply(puts, dels)
			for _, p := range puts {
				cursors[p.PoolKey] = p.LastReserved
			}
			if _, end := s.LogEnd(); end < lastEnd {
				wraps++
			}
			_, lastEnd = s.LogEnd()
			continue
		}
		if release != nil {
			continue // a read would wait for the checkpointer
		}
		pools, err := s.Load()
		if err != nil {
			t.Fatalf("step %d: load: %v", step, err)
		}
		if err := m.agrees(pools); err != nil {
			t.Fatalf("step %d: the store disagrees with the model: %v", step, err)
		}
		for pool, want := range cursors {
			if got := pools[pool].Pool.LastReserved; got != want {
				t.Fatalf("step %d: pool %s's cursor is %q, want %q", step, pool, got, want)
			}
		}
		_, lastEnd = s.LogEnd()
	}
	if release != nil {
		release()
	}
	t.Logf("%d crashes (%d with a torn record), %d wraps of the log", crashes, tears, wraps)
	if crashes == 0 || tears == 0 || wraps == 0 {
		t.Fatalf("the run did not exercise crashes, torn records and wraps: %d, %d, %d", crashes, tears, wraps)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.agrees(pools); err != nil {
		t.Fatal(err)
	}
}

// tornRecord writes, at the log's end, what an append cut short leaves: a
// record's header and part of its payload, or a whole record with a bad
// checksum, or random bytes.
func tornRecord(t *testing.T, r *rand.Rand, path string, end int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, min(int64(24+r.IntN(200)), st.Size()-end))
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	if len(junk) >= 8 && r.IntN(2) == 0 {
		// A plausible length, so that replay reads into the junk.
		junk[0], junk[1], junk[2], junk[3] = byte(len(junk)-24), 0, 0, 0
	}
	if _, err := f.WriteAt(junk, end); err != nil {
		t.Fatal(err)
	}
}

// TestCommitIsInTheLogBeforeTheFile: a commit acknowledged while the
// checkpointer is held is only in the log, and a crash then loses nothing; the
// same holds for a snapshot taken meanwhile.
func TestCommitIsInTheLogBeforeTheFile(t *testing.T) {
	s, path := openNew(t, store.Options{})
	var err error
	release := s.HoldCheckpoints()
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1"), LastReserved: "10.0.0.1"}}, nil); err != nil {
		t.Fatal(err)
	}
	snap, err := store.Snapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	if p := snap["p"]; p == nil || len(p.Allocations) != 1 || p.Pool.LastReserved != "10.0.0.1" {
		t.Fatalf("a snapshot misses the commit that is only in the log: %+v", p)
	}
	_ = release
	s.Crash()
	s, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if p := pools["p"]; p == nil || len(p.Allocations) != 1 || p.Allocations[0].IP != "10.0.0.1" || p.Pool.LastReserved != "10.0.0.1" {
		t.Fatalf("after a crash with the commit only in the log: %+v", p)
	}
}

// TestFailedLogWriteStopsWrites: once the log cannot be written, every later
// commit fails with what to do, and what was acknowledged before is there
// after a restart.
func TestFailedLogWriteStopsWrites(t *testing.T) {
	s, path := openNew(t, store.Options{})
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err != nil {
		t.Fatal(err)
	}
	s.BreakLog()
	for i := range 2 {
		err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c2", "net1", "10.0.0.2")}}, nil)
		if err == nil || !strings.Contains(err.Error(), "restart ipam-node") {
			t.Fatalf("commit %d after the log broke = %v, want an error saying to restart", i, err)
		}
	}
	_ = s.Close()
	reopenAgrees(t, path, store.Options{}, model{"p": {store.RecordKey("c1", "net1"): "10.0.0.1"}})
}

// TestFlusherFlushesTheLog: a commit returns once its record is in the log's
// file; the flusher then puts it on the disk, soon, without anything else
// happening, and commits made meanwhile share its flushes.
func TestFlusherFlushesTheLog(t *testing.T) {
	s, _ := openNew(t, store.Options{})
	defer s.Close()
	release := s.HoldCheckpoints() // the log alone: a checkpoint would flush too
	defer release()
	const n = 200
	ahead := 0 // commits that returned before their record was on the disk
	for i := range n {
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprintf("c%d", i), "net1", fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))}}, nil); err != nil {
			t.Fatal(err)
		}
		if saved, flushed := s.LogProgress(); flushed < saved {
			ahead++
		}
	}
	if ahead == 0 {
		t.Error("every commit returned after the flush of its record: commits wait for the disk")
	}
	waitFlushed(t, s)
	commits, flushes := s.Stats()
	if flushes == 0 || flushes*2 > commits {
		t.Errorf("%d commits in a row took %d flushes: they do not share them", commits, flushes)
	}
	t.Logf("%d commits, %d flushes, %d returned before their flush", commits, flushes, ahead)
}

// waitFlushed returns once everything written to the log so far is flushed to
// the disk, and fails the test if that takes 5 s.
func waitFlushed(t *testing.T, s *store.Store) {
	t.Helper()
	saved, _ := s.LogProgress()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, flushed := s.LogProgress(); flushed >= saved {
			return
		}
		if time.Now().After(deadline) {
			_, flushed := s.LogProgress()
			t.Fatalf("5 s after the last commit, the log is flushed up to record %d of %d", flushed, saved)
		}
		time.Sleep(time.Millisecond)
	}
}

// withoutLog copies the bbolt file at path, alone, into a new directory and
// returns the copy's path: what a restart would find if the log were gone.
func withoutLog(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	alone := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(alone, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return alone
}

// TestFailedFlushStopsWrites: once a flush of the log fails (a disk error),
// later commits fail with what to do, and what was acknowledged before it is
// there after a restart.
func TestFailedFlushStopsWrites(t *testing.T) {
	s, path := openNew(t, store.Options{})
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err != nil {
		t.Fatal(err)
	}
	s.BreakFlush()
	m := model{"p": {store.RecordKey("c1", "net1"): "10.0.0.1"}}
	deadline := time.Now().Add(5 * time.Second)
	for i := 2; ; i++ {
		put := store.Put{PoolKey: "p", Allocation: alloc(fmt.Sprintf("c%d", i), "net1", fmt.Sprintf("10.0.0.%d", i))}
		err := s.Commit([]store.Put{put}, nil)
		if err == nil {
			m.apply([]store.Put{put}, nil)
		} else {
			if !strings.Contains(err.Error(), "flushing its log") || !strings.Contains(err.Error(), "restart ipam-node") {
				t.Fatalf("commit after a failed flush = %v, want an error saying the flush failed and to restart", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("commits still succeed 5 s after the log's flushes began to fail")
		}
		time.Sleep(time.Millisecond)
	}
	_ = s.Close()
	// A writeback error leaves the log's pages clean in the page cache, free
	// to be dropped: what was answered must be in the bbolt file itself.
	reopenAgrees(t, withoutLog(t, path), store.Options{}, m)
	reopenAgrees(t, path, store.Options{}, m)
}

// TestCheckpointerAppliesTheLog: with nothing reading the store, the
// checkpointer still moves a commit into the bbolt file, soon.
func TestCheckpointerAppliesTheLog(t *testing.T) {
	s, path := openNew(t, store.Options{})
	defer s.Close()
	commit := func(cid string) {
		t.Helper()
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc(cid, "net1", "10.0.0.1")}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	inFile := func(want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := store.Open(withoutLog(t, path), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			pools, err := c.Load()
			_ = c.Close()
			if err != nil {
				t.Fatal(err)
			}
			if p := pools["p"]; p != nil && len(p.Allocations) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d commits are not in the bbolt file 5 s later", want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	commit("c1") // starts the checkpointer's timer
	inFile(1)
	// A commit while the timer runs does not signal the checkpointer; the
	// checkpoint the timer starts applies it all the same.
	commit("c2")
	time.Sleep(300 * time.Millisecond)
	commit("c3")
	inFile(3)
	// After that checkpoint, a commit starts the timer again.
	commit("c4")
	inFile(4)
}

// TestCheckpointsAreFewPerGeneration: commits spaced as a burst of pods spaces
// them (each a little after the last) fill the log several times, and the
// bbolt file gets them in a few transactions per generation of the log, not
// one per commit once the log is half full.
func TestCheckpointsAreFewPerGeneration(t *testing.T) {
	s, _ := openNew(t, store.Options{WALSize: 32 << 10})
	defer s.Close()
	wraps, commits, last := 0, 0, int64(0)
	for wraps < 4 {
		put := []store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprintf("c%d", commits), "net1",
			fmt.Sprintf("10.2.%d.%d", commits/250, commits%250+1))}}
		if err := s.Commit(put, nil); err != nil {
			t.Fatal(err)
		}
		commits++
		_, off := s.LogEnd()
		if off < last {
			wraps++
		}
		last = off
		time.Sleep(100 * time.Microsecond)
	}
	per := float64(s.Checkpoints()) / float64(wraps)
	t.Logf("%d commits, %d generations of the log, %d checkpoints", commits, wraps, s.Checkpoints())
	// Half full, then halfway through the rest three times, and the wrap; the
	// one-second timer may add one.
	if per > 7 {
		t.Errorf("%.1f checkpoints per generation of the log, want at most 7", per)
	}
}

// TestConcurrentCommitsAcrossWraps: many writers on a small log, which wraps
// under them again and again; after a crash, every acknowledged commit is
// there.
func TestConcurrentCommitsAcrossWraps(t *testing.T) {
	opts := store.Options{WALSize: 8192}
	s, path := openNew(t, opts)
	const writers, each = 16, 60
	var mu sync.Mutex
	m := model{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				put := []store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprintf("c%d-%d", w, i), "net1", fmt.Sprintf("10.1.%d.%d", w, i+1))}}
				var del []store.Key
				if i%3 == 2 {
					del = []store.Key{{PoolKey: "p", ContainerID: fmt.Sprintf("c%d-%d", w, i-1), IfName: "net1"}}
				}
				if err := s.Commit(put, del); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				m.apply(put, del)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s.Crash()
	reopenAgrees(t, path, opts, m)
	t.Logf("after the crash: %d allocations as acknowledged", len(m["p"]))
}

// TestAnotherStoresLogIsNotReplayed: a log left beside a store that was moved
// away (or replaced by an nv-ipam import) belongs to that store: a new store at
// the path neither replays it nor shows it in a snapshot.
func TestAnotherStoresLogIsNotReplayed(t *testing.T) {
	s, path := openNew(t, store.Options{})
	var err error
	_ = s.HoldCheckpoints()
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("old", "net1", "10.0.0.9")}}, nil); err != nil {
		t.Fatal(err)
	}
	s.Crash()
	if err := os.Rename(path, path+".moved-away"); err != nil {
		t.Fatal(err)
	}
	s, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	snap, err := store.Snapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string]map[string]*store.PoolState{"the new store": pools, "its snapshot": snap} {
		if err := (model{}).agrees(got); err != nil {
			t.Errorf("%s holds the old store's logged commit: %v", what, err)
		}
	}
}

// TestCommitLargerThanTheLog: a commit that does not fit the log goes into the
// bbolt file at once, after what the log holds, and survives a crash.
func TestCommitLargerThanTheLog(t *testing.T) {
	opts := store.Options{WALSize: 8192}
	s, path := openNew(t, opts)
	m := model{}
	small := []store.Put{{PoolKey: "p", Allocation: alloc("first", "net1", "10.0.0.1")}}
	if err := s.Commit(small, nil); err != nil {
		t.Fatal(err)
	}
	m.apply(small, nil)
	var big []store.Put
	for i := range 100 {
		big = append(big, store.Put{PoolKey: "p", Allocation: alloc(fmt.Sprintf("big%d", i), "net1", fmt.Sprintf("10.0.1.%d", i+1))})
	}
	if err := s.Commit(big, []store.Key{{PoolKey: "p", ContainerID: "first", IfName: "net1"}}); err != nil {
		t.Fatal(err)
	}
	m.apply(big, []store.Key{{PoolKey: "p", ContainerID: "first", IfName: "net1"}})
	after := []store.Put{{PoolKey: "p", Allocation: alloc("after", "net1", "10.0.0.2")}}
	if err := s.Commit(after, nil); err != nil {
		t.Fatal(err)
	}
	m.apply(after, nil)
	s.Crash()
	reopenAgrees(t, path, opts, m)
}

// TestClosedStoreRefusesWrites: a commit after Close fails, and Close may be
// called again.
func TestClosedStoreRefusesWrites(t *testing.T) {
	s, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err == nil ||
		!strings.Contains(err.Error(), "closed") {
		t.Fatalf("commit after Close = %v, want an error saying the store is closed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestLogOlderThanItsStoreFileIsRefused: a store file put back from an older
// copy, beside a log that goes on from a later state of it, is refused with
// what to do, rather than have the log's records applied to a state they do
// not follow.
func TestLogOlderThanItsStoreFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "store")
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil { // checkpointed: the file holds change 1
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // change 2 in one run, closed; 3 and 4 in the next, only in its log
		if i < 2 {
			if s, err = store.Open(path, store.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		if i == 1 {
			_ = s.HoldCheckpoints()
		}
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprint("d", i), "net1", fmt.Sprint("10.0.0.", i+2))}}, nil); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Crash()
	if err := os.WriteFile(path, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = store.Open(path, store.Options{})
	if err == nil || !strings.Contains(err.Error(), "older than its log") || !strings.Contains(err.Error(), "move the log away") {
		t.Fatalf("Open of a store file older than its log = %v, want a refusal saying what to do", err)
	}
	if err := os.Rename(path+".wal", path+".wal.old"); err != nil {
		t.Fatal(err)
	}
	// With the log moved away, the store file alone, as it was saved.
	reopenAgrees(t, path, store.Options{}, model{"p": {store.RecordKey("c1", "net1"): "10.0.0.1"}})
}

// preLogStore writes a store file as ipam-node wrote it before the log existed:
// allocation c1 in pool p, and no log ID or sequence number in its meta bucket.
// It returns the file's bytes.
func preLogStore(t *testing.T) []byte {
	t.Helper()
	s, path := openNew(t, store.Options{})
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		return errors.Join(meta.Delete([]byte("walID")), meta.Delete([]byte("walSeq")))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// fileState is a file's bytes and modification time.
type fileState struct {
	data  []byte
	mtime time.Time
}

func stateOf(t *testing.T, path string) fileState {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fileState{data, fi.ModTime()}
}

// TestPreLogBackupBesideALogIsRefused: a store file from before the log (no log
// ID in it) put back beside the log of a later store is refused as older than
// its log, with what to do, and neither file is touched; beside no log, or a log
// that holds nothing, it is upgraded; an nv-ipam store imported beside a log
// does not take it.
func TestPreLogBackupBesideALogIsRefused(t *testing.T) {
	backup := preLogStore(t)
	c1 := model{"p": {store.RecordKey("c1", "net1"): "10.0.0.1"}}

	// The upgrade: the file alone opens, keeps c1, and takes a log from now on.
	dir := t.TempDir()
	path := filepath.Join(dir, "store")
	if err := os.WriteFile(path, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	reopenAgrees(t, path, store.Options{}, c1)
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.HoldCheckpoints()
	if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c2", "net1", "10.0.0.2")}}, nil); err != nil {
		t.Fatal(err)
	}
	s.Crash() // c2 is only in the log
	logPath := path + ".wal"
	upgraded, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	logData, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// The upgraded file beside its log: c2 is replayed.
	other := filepath.Join(t.TempDir(), "store")
	if err := errors.Join(os.WriteFile(other, upgraded, 0o600), os.WriteFile(other+".wal", logData, 0o600)); err != nil {
		t.Fatal(err)
	}
	reopenAgrees(t, other, store.Options{}, model{"p": {store.RecordKey("c1", "net1"): "10.0.0.1", store.RecordKey("c2", "net1"): "10.0.0.2"}})

	// The backup put back beside that log: refused, nothing touched.
	if err := os.WriteFile(path, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, p := range []string{path, logPath} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]fileState{path: stateOf(t, path), logPath: stateOf(t, logPath)}
	_, err = store.Open(path, store.Options{})
	for _, want := range []string{"older than its log", "Nothing was changed", "Put back the store file that goes with this log",
		"move the log away", "forgotten"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a store file from before the log, beside a later log = %v, want a refusal saying %q", err, want)
		}
	}
	for p, b := range before {
		if a := stateOf(t, p); !bytes.Equal(a.data, b.data) || !a.mtime.Equal(b.mtime) {
			t.Errorf("%s was modified by the refused Open (mtime %v, was %v; same bytes: %v)", p, a.mtime, b.mtime,
				bytes.Equal(a.data, b.data))
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 2 {
		t.Errorf("files beside the store after the refused Open: %v %v, want the store file and its log", entries, err)
	}
	// Moving the log away goes back to the backup, as the message says.
	if err := os.Rename(logPath, logPath+".old"); err != nil {
		t.Fatal(err)
	}
	reopenAgrees(t, path, store.Options{}, c1)

	// Beside a log that holds nothing (made, never written): the upgrade.
	path = filepath.Join(t.TempDir(), "store")
	if err := errors.Join(os.WriteFile(path, backup, 0o600), os.WriteFile(path+".wal", make([]byte, 8192), 0o600)); err != nil {
		t.Fatal(err)
	}
	reopenAgrees(t, path, store.Options{}, c1)

	// An nv-ipam store imported beside that log is a new store: it opens and
	// does not replay it.
	path = filepath.Join(t.TempDir(), "store")
	writeNVStore(t, path, 0)
	if err := os.WriteFile(path+".wal", logData, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("importing beside another store's log: %v", err)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if pools["p"] != nil || pools["rail0"] == nil {
		t.Errorf("imported beside another store's log: %v, want the import without the log's c2", pools)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
