package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hwipam/hwipam/pkg/store"
)

// openStore opens a store in a temporary directory. When the test ends it closes
// it, reopens it and checks the invariants every store must keep: it loads, every
// address parses, and no address is held twice in a pool.
func openStore(t *testing.T) (*store.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store")
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		checkInvariants(t, path)
	})
	return s, path
}

func checkInvariants(t *testing.T, path string) {
	t.Helper()
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Errorf("reopening %s: %v", path, err)
		return
	}
	defer s.Close()
	pools, err := s.Load()
	if err != nil {
		t.Errorf("loading: %v", err)
		return
	}
	for key, p := range pools {
		seen := map[netip.Addr]string{}
		for i := range p.Allocations {
			a := &p.Allocations[i]
			ip, err := netip.ParseAddr(a.IP)
			if err != nil {
				t.Errorf("pool %s: allocation %s/%s has address %q: %v", key, a.ContainerID, a.IfName, a.IP, err)
				continue
			}
			if other, dup := seen[ip]; dup {
				t.Errorf("pool %s: %s held by %s and %s/%s", key, ip, other, a.ContainerID, a.IfName)
			}
			seen[ip] = a.ContainerID + "/" + a.IfName
		}
	}
}

func alloc(cid, ifn, ip string) store.Allocation {
	return store.Allocation{ContainerID: cid, IfName: ifn, IP: ip, PodName: "pod-" + cid, PodNamespace: "ns",
		PodUID: "uid-" + cid, CreateTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func TestCommitLoadDelete(t *testing.T) {
	s, _ := openStore(t)
	if err := s.Commit([]store.Put{
		{PoolKey: "rail0", Allocation: alloc("c1", "net1", "10.0.0.1"), LastReserved: "10.0.0.1"},
		{PoolKey: "cidrpool/rail1", Allocation: alloc("c1", "net2", "fd00::5")},
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SavePool("rail0", []byte(`{"start":"10.0.0.1","end":"10.0.0.64"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit([]store.Put{{PoolKey: "rail0", Allocation: alloc("c2", "net1", "10.0.0.2")}},
		[]store.Key{{PoolKey: "cidrpool/rail1", ContainerID: "c1", IfName: "net2"}, {PoolKey: "nope", ContainerID: "x", IfName: "y"}}); err != nil {
		t.Fatal(err)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	r0 := pools["rail0"]
	if r0 == nil || len(r0.Allocations) != 2 || r0.Pool.LastReserved != "10.0.0.1" || !bytes.Contains(r0.Pool.Block, []byte("10.0.0.64")) {
		t.Fatalf("rail0 = %+v", r0)
	}
	if got := r0.Allocations[0]; !reflect.DeepEqual(got, alloc("c1", "net1", "10.0.0.1")) {
		t.Errorf("allocation read back = %+v", got)
	}
	if r1 := pools["cidrpool/rail1"]; r1 != nil && len(r1.Allocations) != 0 {
		t.Errorf("deleted allocation still there: %+v", r1.Allocations)
	}
}

// TestNetworkRecordedAndOldRecordsHaveNone: an allocation keeps the CNI network
// that made it; a record written before the field existed loads with none (which
// CNI GC reads as "never collect"), and an older daemon's view of a new record
// is the same record without it.
func TestNetworkRecordedAndOldRecordsHaveNone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	withNet := alloc("c1", "net1", "10.0.0.1")
	withNet.Network = "red"
	if err := s.Commit([]store.Put{{PoolKey: "rail0", Allocation: withNet}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The record as ipam-node wrote it before allocations carried their network.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := `{"containerID":"c0","ifName":"net1","ip":"10.0.0.9","podName":"pod-c0","podNamespace":"ns","createTime":"2025-01-02T03:04:05Z"}`
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("allocations")).Bucket([]byte("rail0")).Put([]byte("c0\x00net1"), []byte(old))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]store.Allocation{}
	for _, a := range pools["rail0"].Allocations {
		got[a.ContainerID] = a
	}
	if !reflect.DeepEqual(got["c1"], withNet) {
		t.Errorf("allocation read back = %+v, want %+v", got["c1"], withNet)
	}
	if a, ok := got["c0"]; !ok || a.Network != "" || a.IP != "10.0.0.9" || a.PodName != "pod-c0" {
		t.Errorf("old record read back = %+v %v, want it whole, with no network", a, ok)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, path)
}

// TestCommitAllOrNothing: a dual-stack commit whose second put fails leaves nothing.
func TestCommitAllOrNothing(t *testing.T) {
	s, _ := openStore(t)
	err := s.Commit([]store.Put{
		{PoolKey: "v4", Allocation: alloc("c1", "net1", "10.0.0.1")},
		{PoolKey: "", Allocation: alloc("c1", "net1", "fd00::1")}, // no pool key: bbolt refuses the bucket
	}, nil)
	if err == nil {
		t.Fatal("commit with an invalid put succeeded")
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if p := pools["v4"]; p != nil && len(p.Allocations) > 0 {
		t.Errorf("half of a failed commit was stored: %+v", p.Allocations)
	}
}

func TestGroupCommitSharesTransactions(t *testing.T) {
	s, _ := openStore(t)
	const writers, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				ip := fmt.Sprintf("10.%d.%d.%d", w/256, w%256, i+1)
				if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprintf("c%d-%d", w, i), "net1", ip)}}, nil); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFlushed(t, s) // commits return before the flush they share
	commits, txs := s.Stats()
	if commits != writers*each {
		t.Errorf("commits = %d, want %d", commits, writers*each)
	}
	if txs == 0 || txs*2 > commits {
		t.Errorf("%d commits used %d write transactions: concurrent commits are not batched", commits, txs)
	}
	t.Logf("%d commits in %d transactions", commits, txs)
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(pools["p"].Allocations); n != writers*each {
		t.Errorf("%d allocations stored, want %d", n, writers*each)
	}
}

func TestRefusesGarbageAndKeepsIt(t *testing.T) {
	for name, content := range map[string][]byte{
		"text":        []byte("this is not a store\n"),
		"broken JSON": []byte(`{"version":1,"pools":{`),
		"zeros":       make([]byte, 16384),
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store")
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := store.Open(path, store.Options{})
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "move it away") {
				t.Fatalf("Open over %s = %v, want ErrCorrupt saying what to do", name, err)
			}
			after, _ := os.ReadFile(path)
			if !bytes.Equal(after, content) {
				t.Error("the broken file was modified")
			}
		})
	}
}

// damagedStore writes a store of 200 allocations at path, closes it, and
// overwrites every page after the two meta pages with garbage; it returns the
// damaged file's bytes.
func damagedStore(t *testing.T, path string) []byte {
	t.Helper()
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc(fmt.Sprint(i), "net1", fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2 * 4096; i < len(data); i++ {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRefusesDamagedStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	damagedStore(t, path)
	_, err := store.Open(path, store.Options{})
	if !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("Open over a damaged store = %v, want ErrCorrupt", err)
	}
}

func TestLockedByAnotherOpen(t *testing.T) {
	s, path := openStore(t)
	_ = s
	_, err := store.Open(path, store.Options{LockTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open = %v, want a lock error", err)
	}
}

// The nv-ipam store as a reference node wrote it, compact, with the checksum
// zeroed: nv-ipam's checksum is FNV-32a over exactly this encoding (released_at left
// out). The test computes it from the literal, independently of the importer.
const nvCanonical = `{"version":1,"checksum":0,"pools":{` +
	`"cidrpool/storage":{"name":"storage","entries":{` +
	`"c3_net2":{"container_id":"c3","interface_name":"net2","ip_address":"192.168.10.5","metadata":{"create_time":"2025-01-02T03:04:05.123456789Z","pod_uuid":"u3","pod_name":"p3","pod_namespace":"ns","device_id":"0000:3b:00.2","pool_config_snapshot":""}},` +
	`"c9_net2":{"container_id":"c9","interface_name":"net2","ip_address":"192.168.10.6","metadata":{"create_time":"2025-01-02T03:04:05Z","pod_uuid":"u9","pod_name":"p9","pod_namespace":"ns","device_id":"","pool_config_snapshot":""}}` +
	`},"last_pool_config":"","last_reserved_ip":"192.168.10.6"},` +
	`"rail0":{"name":"rail0","entries":{` +
	`"c1_net1":{"container_id":"c1","interface_name":"net1","ip_address":"10.3.0.2","metadata":{"create_time":"2025-01-02T03:04:05Z","pod_uuid":"u1","pod_name":"p1","pod_namespace":"default","device_id":"","pool_config_snapshot":"{}"}},` +
	`"c2_net1":{"container_id":"c2","interface_name":"net1","ip_address":"10.3.0.3","metadata":{"create_time":"2025-01-02T03:04:06Z","pod_uuid":"","pod_name":"","pod_namespace":"","device_id":"","pool_config_snapshot":""}}` +
	`},"last_pool_config":"{\"subnet\":\"10.3.0.0/16\"}","last_reserved_ip":"10.3.0.3"}}}`

func writeNVStore(t *testing.T, path string, checksumDelta uint32) []byte {
	t.Helper()
	h := fnv.New32a()
	h.Write([]byte(nvCanonical))
	sum := h.Sum32() + checksumDelta
	file := strings.Replace(nvCanonical, `"checksum":0`, fmt.Sprintf(`"checksum":%d`, sum), 1)
	// c9 was released by its owner and is only kept for nv-ipam's cooldown.
	file = strings.Replace(file, `"pool_config_snapshot":""}}},"last_pool_config":""`,
		`"pool_config_snapshot":""},"released_at":"2025-01-03T00:00:00Z"}},"last_pool_config":""`, 1)
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	return []byte(file)
}

func TestImportNVIPAMStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	original := writeNVStore(t, path, 0)
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("importing: %v", err)
	}
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	r0 := pools["rail0"]
	if r0 == nil || len(r0.Allocations) != 2 || r0.Pool.LastReserved != "10.3.0.3" {
		t.Fatalf("rail0 imported as %+v", r0)
	}
	got := map[string]store.Allocation{}
	all := slices.Concat(r0.Allocations, pools["cidrpool/storage"].Allocations)
	for i := range all {
		got[all[i].ContainerID+"/"+all[i].IfName] = all[i]
	}
	if a := got["c1/net1"]; a.IP != "10.3.0.2" || a.PodName != "p1" || a.PodNamespace != "default" || a.PodUID != "u1" ||
		!a.CreateTime.Equal(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("c1/net1 imported as %+v", a)
	}
	if a := got["c3/net2"]; a.IP != "192.168.10.5" || a.DeviceID != "0000:3b:00.2" {
		t.Errorf("c3/net2 imported as %+v", a)
	}
	if a, ok := got["c2/net1"]; !ok || a.PodName != "" {
		t.Errorf("an allocation without pod metadata must be imported as such: %+v %v", a, ok)
	}
	if _, ok := got["c9/net2"]; ok {
		t.Error("an entry nv-ipam had released was imported")
	}
	if len(got) != 3 {
		t.Errorf("imported %d allocations, want 3: %v", len(got), got)
	}
	for k, a := range got {
		if a.Network != "" {
			t.Errorf("%s imported with network %q: nv-ipam does not know it", k, a.Network)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(path + store.BackupSuffix)
	if err != nil || !bytes.Equal(backup, original) {
		t.Errorf("backup of the nv-ipam store: %v (equal: %v)", err, bytes.Equal(backup, original))
	}
	// A second start opens the imported store; it does not import again.
	s, err = store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pools, err = s.Load()
	if err != nil || len(pools["rail0"].Allocations) != 2 {
		t.Errorf("after reopening: %v %+v", err, pools["rail0"])
	}
}

func TestImportRefusesBadChecksum(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	original := writeNVStore(t, path, 1)
	_, err := store.Open(path, store.Options{})
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("Open over an nv-ipam store with a wrong checksum = %v, want ErrCorrupt naming the checksum", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(after, original) {
		t.Error("the nv-ipam store was modified")
	}
	if _, err := os.Stat(path + store.BackupSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a backup was made of a store that was not imported: %v", err)
	}
}

// Snapshot reads a store the daemon holds open (and locked), and refuses garbage
// and an nv-ipam file not imported yet with what it is.
func TestSnapshotWhileOpen(t *testing.T) {
	s, path := openStore(t)
	if err := s.Commit([]store.Put{{PoolKey: "rail0", Allocation: store.Allocation{ContainerID: "c1", IfName: "net1", IP: "10.0.0.5"}},
		{PoolKey: "cidrpool/r1", Allocation: store.Allocation{ContainerID: "c2", IfName: "net2", IP: "10.1.0.9"}}}, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		snap, err := store.Snapshot(path)
		if err == nil && (len(snap["rail0"].Allocations) != 1 || snap["cidrpool/r1"].Allocations[0].IP != "10.1.0.9") {
			err = fmt.Errorf("snapshot %+v", snap)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Snapshot waited for the open store's lock")
	}

	garbage := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("x"), 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Snapshot(garbage); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("garbage: %v", err)
	}
	nv := filepath.Join(t.TempDir(), "store")
	if err := os.WriteFile(nv, []byte(`{"version":1,"checksum":0,"pools":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Snapshot(nv); err == nil || !strings.Contains(err.Error(), "not imported yet") {
		t.Errorf("nv-ipam file: %v", err)
	}
	if _, err := store.Snapshot(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing store gave no error")
	}
}

// TestScanGetEachAgreeWithLoad: what the daemon reads at start (Scan), one
// record (Get) and the listing (EachAllocation) say what Load says.
func TestScanGetEachAgreeWithLoad(t *testing.T) {
	s, _ := openStore(t)
	odd := alloc("c\"3", "net\\1", "10.0.0.3") // escapes in the record
	odd.PodName = `pod "ip":"1.2.3.4"`
	if err := s.Commit([]store.Put{
		{PoolKey: "rail0", Allocation: alloc("c1", "net1", "10.0.0.1"), LastReserved: "10.0.0.1"},
		{PoolKey: "rail0", Allocation: alloc("c2", "net1", "10.0.0.2")},
		{PoolKey: "rail0", Allocation: odd},
		{PoolKey: "cidrpool/rail1", Allocation: alloc("c1", "net2", "fd00::5")},
	}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SavePool("rail2", []byte(`{"start":"10.2.0.1","end":"10.2.0.64"}`)); err != nil {
		t.Fatal(err)
	}
	loaded, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	pools := map[string]store.Pool{}
	held := map[string]map[string]netip.Addr{}
	err = s.Scan(func(p store.Pool) error {
		pools[p.Key] = p
		return nil
	}, func(poolKey, recordKey string, ip netip.Addr) error {
		if held[poolKey] == nil {
			held[poolKey] = map[string]netip.Addr{}
		}
		held[poolKey][recordKey] = ip
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key, st := range loaded {
		// Load makes up an empty Pool for allocations without a pool record; Scan
		// reports only records.
		if p, ok := pools[key]; ok && !reflect.DeepEqual(p, st.Pool) {
			t.Errorf("pool %s: Scan %+v, Load %+v", key, p, st.Pool)
		}
		if len(held[key]) != len(st.Allocations) {
			t.Errorf("pool %s: Scan holds %d allocations, Load %d", key, len(held[key]), len(st.Allocations))
		}
		var each []store.Allocation
		if err := s.EachAllocation(key, func(pool string, a store.Allocation) error {
			if pool != key {
				t.Errorf("EachAllocation(%s) gave pool %s", key, pool)
			}
			each = append(each, a)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(each, st.Allocations) {
			t.Errorf("pool %s: EachAllocation %+v, Load %+v", key, each, st.Allocations)
		}
		for _, a := range st.Allocations {
			if ip := held[key][store.RecordKey(a.ContainerID, a.IfName)]; ip.String() != a.IP {
				t.Errorf("pool %s: Scan has %s for %s/%s, Load %s", key, ip, a.ContainerID, a.IfName, a.IP)
			}
			got, ok, err := s.Get(key, a.ContainerID, a.IfName)
			if err != nil || !ok || !reflect.DeepEqual(got, a) {
				t.Errorf("Get(%s, %s, %s) = %+v, %v, %v; want %+v", key, a.ContainerID, a.IfName, got, ok, err, a)
			}
		}
	}
	if len(pools) != 2 || pools["rail2"].Block == nil {
		t.Errorf("Scan's pools = %+v, want rail0 and rail2", pools)
	}
	if _, ok, err := s.Get("rail0", "c9", "net1"); ok || err != nil {
		t.Errorf("Get of nothing = %v, %v", ok, err)
	}
	n := 0
	stop := errors.New("enough")
	if err := s.EachAllocation("", func(string, store.Allocation) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("EachAllocation stopped by its callback = %v after %d", err, n)
	}
}

// TestScanRefusesABadAddress: a record whose address does not parse stops the
// start with ErrCorrupt naming it, instead of an allocation the daemon cannot
// account for.
func TestScanRefusesABadAddress(t *testing.T) {
	s, _ := openStore(t)
	if err := s.Commit([]store.Put{{PoolKey: "rail0", Allocation: alloc("c1", "net1", "10.0.0.300")}}, nil); err != nil {
		t.Fatal(err)
	}
	err := s.Scan(func(store.Pool) error { return nil }, func(string, string, netip.Addr) error { return nil })
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "10.0.0.300") {
		t.Fatalf("Scan = %v, want ErrCorrupt naming the address", err)
	}
	// Leave a store the cleanup's invariant check accepts.
	if err := s.Commit(nil, []store.Key{{PoolKey: "rail0", ContainerID: "c1", IfName: "net1"}}); err != nil {
		t.Fatal(err)
	}
}

// TestEachAllocationWhileWriting: the walk holds no transaction while fn runs,
// so fn may write (here, release what it sees, which grows and rewrites the
// file); every allocation present throughout is seen exactly once, in order.
func TestEachAllocationWhileWriting(t *testing.T) {
	s, _ := openStore(t)
	const n = 2500 // more than one chunk
	var puts []store.Put
	for i := range n {
		puts = append(puts, store.Put{PoolKey: "rail0", Allocation: alloc(fmt.Sprintf("c%05d", i), "net1", fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))})
	}
	if err := s.Commit(puts, nil); err != nil {
		t.Fatal(err)
	}
	var seen []string
	err := s.EachAllocation("", func(pool string, a store.Allocation) error {
		seen = append(seen, a.ContainerID)
		return s.Commit([]store.Put{{PoolKey: "rail1", Allocation: alloc(a.ContainerID, "net1", a.IP)}},
			[]store.Key{{PoolKey: pool, ContainerID: a.ContainerID, IfName: a.IfName}})
	})
	if err != nil {
		t.Fatal(err)
	}
	// rail1 did not exist when the walk listed the pools: only rail0 is walked,
	// each allocation once, in order.
	if len(seen) != n || !slices.IsSorted(seen) || len(slices.Compact(slices.Clone(seen))) != n {
		t.Errorf("walked %d allocations of rail0's %d (sorted: %v)", len(seen), n, slices.IsSorted(seen))
	}
}
