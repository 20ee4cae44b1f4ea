package store_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// fnv32a is FNV-1a, 32 bits, written out from its definition (offset basis
// 2166136261, prime 16777619), so that the checksum vector below does not come
// from the code under test.
func fnv32a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

// The published FNV-1a test vectors pin fnv32a itself.
func TestFNV32aVectors(t *testing.T) {
	for in, want := range map[string]uint32{"": 0x811c9dc5, "a": 0xe40c292c, "foobar": 0xbf9cf968} {
		if got := fnv32a([]byte(in)); got != want {
			t.Errorf("fnv32a(%q) = %#x, want %#x", in, got, want)
		}
	}
}

// nvExpected is nv-ipam's store (version 1) for the allocations
// TestExportChecksumVector makes, as nv-ipam's daemon encodes it: Go's
// encoding/json of its types, compact, map keys sorted, with the checksum
// zeroed. The checksum is FNV-32a over exactly these bytes.
const nvExpected = `{"version":1,"checksum":0,"pools":{` +
	`"cidrpool/storage":{"name":"storage","entries":{` +
	`"c3_net2":{"container_id":"c3","interface_name":"net2","ip_address":"fd00:10::5","metadata":{"create_time":"2025-01-02T03:04:05.123456789Z","pod_uuid":"u3","pod_name":"p3","pod_namespace":"ns","device_id":"0000:3b:00.2","pool_config_snapshot":""}}` +
	`},"last_pool_config":"","last_reserved_ip":"fd00:10::5"},` +
	`"rail0":{"name":"rail0","entries":{` +
	`"c1_net1":{"container_id":"c1","interface_name":"net1","ip_address":"10.3.0.2","metadata":{"create_time":"2025-01-02T03:04:05Z","pod_uuid":"u1","pod_name":"p1","pod_namespace":"default","device_id":"","pool_config_snapshot":""}},` +
	`"c2_net1":{"container_id":"c2","interface_name":"net1","ip_address":"10.3.0.3","metadata":{"create_time":"2025-01-02T03:04:06Z","pod_uuid":"","pod_name":"","pod_namespace":"","device_id":"","pool_config_snapshot":""}}` +
	`},"last_pool_config":"","last_reserved_ip":"10.3.0.3"}}}`

// TestExportChecksumVector: the export of a known store is byte for byte the
// document above with its FNV-32a in the checksum field.
func TestExportChecksumVector(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store")
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := func(sec, nsec int) time.Time { return time.Date(2025, 1, 2, 3, 4, sec, nsec, time.UTC) }
	puts := []store.Put{
		{PoolKey: "rail0", Allocation: store.Allocation{ContainerID: "c1", IfName: "net1", IP: "10.3.0.2", PodName: "p1",
			PodNamespace: "default", PodUID: "u1", CreateTime: at(5, 0), Network: "rail0-net", Rail: "r0"}},
		{PoolKey: "rail0", Allocation: store.Allocation{ContainerID: "c2", IfName: "net1", IP: "10.3.0.3", CreateTime: at(6, 0)},
			LastReserved: "10.3.0.3"},
		{PoolKey: "cidrpool/storage", Allocation: store.Allocation{ContainerID: "c3", IfName: "net2", IP: "fd00:10::5",
			PodName: "p3", PodNamespace: "ns", PodUID: "u3", DeviceID: "0000:3b:00.2", CreateTime: at(5, 123456789)},
			LastReserved: "fd00:10::5"},
	}
	if err := s.Commit(puts, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "nv-ipam.json")
	rep, err := store.ExportNVIPAM(path, out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Allocations != 3 || rep.Pools != 2 || rep.WithNetwork != 1 || rep.WithRail != 1 || rep.Backup != "" {
		t.Errorf("report %+v", rep)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := fnv32a([]byte(nvExpected))
	want := strings.Replace(nvExpected, `"checksum":0`, `"checksum":`+strconv.FormatUint(uint64(sum), 10), 1)
	if string(got) != want {
		t.Errorf("export:\n%s\nwant (checksum %d):\n%s", got, sum, want)
	}
}

// randomStore fills the store at path as a node's life would: an nv-ipam store
// imported first, then allocations made by the node allocator over IPv4 and
// IPv6 IPPools and CIDRPools (plain, static, by index, dual-stack), some
// released again, with pod metadata, device IDs, networks and rails.
func randomStore(t *testing.T, rng *rand.Rand, path string) (made map[string]int) {
	t.Helper()
	writeRandomNVStore(t, rng, path)
	st, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("importing the nv-ipam store: %v", err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	clock := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	m, err := nodealloc.New(st, "node-1", nodealloc.WithClock(func() time.Time {
		clock = clock.Add(time.Duration(rng.Int64N(int64(time.Hour))))
		return clock
	}))
	if err != nil {
		t.Fatal(err)
	}
	ippool := func(name, subnet, start, end string) *nodealloc.PoolConfig {
		p := &v1alpha1.IPPool{Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 64},
			Status: v1alpha1.IPPoolStatus{Allocations: []v1alpha1.Allocation{{NodeName: "node-1", StartIP: start, EndIP: end}}}}
		p.Name = name
		c, err := nodealloc.FromIPPool(p, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cidrpool := func(name, prefix string) *nodealloc.PoolConfig {
		p := &v1alpha1.CIDRPool{Status: v1alpha1.CIDRPoolStatus{Allocations: []v1alpha1.CIDRPoolAllocation{{NodeName: "node-1", Prefix: prefix}}}}
		p.Name = name
		c, err := nodealloc.FromCIDRPool(p, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// "nvpool" is the pool the imported entries are in (10.3.0.0/24, a block of
	// the first 100): new allocations continue in it.
	cfgs := []*nodealloc.PoolConfig{
		ippool("nvpool", "10.3.0.0/16", "10.3.0.1", "10.3.0.100"),
		ippool("v4", "10.8.0.0/16", "10.8.1.0", "10.8.1.63"),
		ippool("v6", "fd00:8::/64", "fd00:8::100", "fd00:8::1ff"),
		cidrpool("c4", "192.168.7.0/26"),
		cidrpool("c6", "fd00:77::/120"),
	}
	if err := m.SyncPools(cfgs); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	made = map[string]int{}
	var live []*nodealloc.Request
	n := 40 + rng.IntN(80)
	for i := range n {
		c := cfgs[rng.IntN(len(cfgs))]
		r := &nodealloc.Request{Pools: []string{c.Name}, Kind: c.Kind, ContainerID: fmt.Sprintf("%016x", rng.Uint64()),
			IfName: fmt.Sprintf("net%d", 1+rng.IntN(3))}
		if rng.IntN(4) > 0 {
			r.Meta = nodealloc.Metadata{PodName: fmt.Sprintf("pod-%d", i), PodNamespace: []string{"default", "ml"}[rng.IntN(2)],
				PodUID: fmt.Sprintf("uid-%d-%d", i, rng.IntN(1000))}
		}
		if rng.IntN(3) == 0 {
			r.Meta.DeviceID = fmt.Sprintf("0000:%02x:00.%d", rng.IntN(256), rng.IntN(8))
		}
		if rng.IntN(2) == 0 {
			r.Meta.Network = "net-" + c.Name
		}
		if rng.IntN(4) == 0 {
			r.Meta.Rail = "rail" + strconv.Itoa(rng.IntN(4))
		}
		kind := "plain"
		switch rng.IntN(5) {
		case 0:
			kind, r.RequestedIPs = "static", []netip.Addr{randomIn(rng, c)}
		case 1:
			ix := int32(rng.IntN(40))
			kind, r.Index = "index", &ix
		case 2:
			if c.Kind == v1alpha1.KindIPPool && c.Name != "v6" {
				kind, r.Pools = "dual-stack", []string{c.Name, "v6"}
			}
		}
		if _, err := m.Allocate(ctx, r); err != nil {
			// A static address or an index taken already, or a full block: the
			// allocator's business, not the export's.
			if errors.Is(err, nodealloc.ErrInvalid) || errors.Is(err, nodealloc.ErrExhausted) {
				continue
			}
			t.Fatalf("allocate %+v: %v", r, err)
		}
		made[kind]++
		live = append(live, r)
		if rng.IntN(5) == 0 {
			k := rng.IntN(len(live))
			if err := m.Deallocate(ctx, live[k]); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, k, k+1)
		}
	}
	return made
}

func randomIn(rng *rand.Rand, c *nodealloc.PoolConfig) netip.Addr {
	a := c.Block.Start
	for range rng.IntN(50) {
		if n := a.Next(); c.Block.Contains(n) {
			a = n
		}
	}
	return a
}

// writeRandomNVStore writes an nv-ipam store with a few entries in pool
// "nvpool", one released (kept for nv-ipam's cooldown), with its checksum.
func writeRandomNVStore(t *testing.T, rng *rand.Rand, path string) {
	t.Helper()
	type meta struct {
		CreateTime   string `json:"create_time"`
		PodUUID      string `json:"pod_uuid"`
		PodName      string `json:"pod_name"`
		PodNamespace string `json:"pod_namespace"`
		DeviceID     string `json:"device_id"`
		Snapshot     string `json:"pool_config_snapshot"`
	}
	type entry struct {
		ContainerID string `json:"container_id"`
		IfName      string `json:"interface_name"`
		IP          string `json:"ip_address"`
		Meta        meta   `json:"metadata"`
	}
	type pool struct {
		Name           string            `json:"name"`
		Entries        map[string]*entry `json:"entries"`
		LastPoolConfig string            `json:"last_pool_config"`
		LastReserved   string            `json:"last_reserved_ip"`
	}
	type root struct {
		Version  int              `json:"version"`
		Checksum uint32           `json:"checksum"`
		Pools    map[string]*pool `json:"pools"`
	}
	p := &pool{Name: "nvpool", Entries: map[string]*entry{}, LastPoolConfig: `{"subnet":"10.3.0.0/16"}`}
	for i := range 1 + rng.IntN(20) {
		e := &entry{ContainerID: fmt.Sprintf("nv%06d", rng.IntN(1e6)), IfName: "net1", IP: fmt.Sprintf("10.3.0.%d", i+1),
			Meta: meta{CreateTime: time.Date(2025, 5, 1, 0, 0, i, rng.IntN(1e9), time.UTC).Format(time.RFC3339Nano),
				PodUUID: fmt.Sprintf("nvuid-%d", i), PodName: fmt.Sprintf("nvpod-%d", i), PodNamespace: "default"}}
		p.Entries[e.ContainerID+"_"+e.IfName] = e
		p.LastReserved = e.IP
	}
	r := root{Version: 1, Pools: map[string]*pool{"nvpool": p}}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	r.Checksum = fnv32a(data)
	if data, err = json.Marshal(r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// exported is what nv-ipam's format carries of an allocation.
type exported struct {
	Pool, ContainerID, IfName, IP, PodName, PodNamespace, PodUID, DeviceID string
	Created                                                                string
}

func loadExported(t *testing.T, path string) (allocs []exported, cursors map[string]string) {
	t.Helper()
	s, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	defer s.Close()
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	cursors = map[string]string{}
	for key, p := range pools {
		cursors[key] = p.Pool.LastReserved
		for _, a := range p.Allocations {
			allocs = append(allocs, exported{key, a.ContainerID, a.IfName, a.IP, a.PodName, a.PodNamespace, a.PodUID,
				a.DeviceID, a.CreateTime.UTC().Format(time.RFC3339Nano)})
		}
	}
	sort.Slice(allocs, func(i, j int) bool { return fmt.Sprint(allocs[i]) < fmt.Sprint(allocs[j]) })
	return allocs, cursors
}

// TestExportImportRoundTrip: a random store, exported in nv-ipam's format and
// imported by hwipam's own importer, holds the same allocations (every field
// nv-ipam's format carries) and the same cursors. Both ways: to a new file,
// and in place, where the hwipam store is kept whole beside it.
func TestExportImportRoundTrip(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HWIPAM_EXPORT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HWIPAM_EXPORT_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with HWIPAM_EXPORT_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	made := map[string]int{}
	for round := range 8 {
		dir := t.TempDir()
		path := filepath.Join(dir, "store")
		for k, n := range randomStore(t, rng, path) {
			made[k] += n
		}
		want, wantCursors := loadExported(t, path)
		if len(want) == 0 {
			t.Fatalf("seed %d round %d: an empty store tests nothing", seed, round)
		}
		v6, cidr := false, false
		for _, a := range want {
			v6 = v6 || strings.Contains(a.IP, ":")
			cidr = cidr || strings.HasPrefix(a.Pool, "cidrpool/")
			switch {
			case strings.Contains(a.IP, ":"):
				made["exported v6"]++
			case strings.HasPrefix(a.Pool, "cidrpool/"):
				made["exported cidrpool"]++
			case a.Pool == "nvpool" && strings.HasPrefix(a.ContainerID, "nv"):
				made["exported from nv-ipam"]++
			}
		}

		out := filepath.Join(dir, "exported.json")
		rep, err := store.ExportNVIPAM(path, out)
		if err != nil {
			t.Fatalf("seed %d round %d: export: %v", seed, round, err)
		}
		if rep.Allocations != len(want) {
			t.Errorf("seed %d round %d: report counts %d allocations, the store holds %d", seed, round, rep.Allocations, len(want))
		}
		// hwipam's importer reads it where ipam-node would find it.
		imported := filepath.Join(t.TempDir(), "store")
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(imported, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, gotCursors := loadExported(t, imported)
		compareExported(t, fmt.Sprintf("seed %d round %d (to a file, v6 %v, cidrpool %v)", seed, round, v6, cidr),
			got, want, gotCursors, wantCursors)

		// In place: the rollback's way.
		rep, err = store.ExportNVIPAM(path, path)
		if err != nil {
			t.Fatalf("seed %d round %d: export in place: %v", seed, round, err)
		}
		if rep.Backup != path+store.HwipamBackupSuffix {
			t.Errorf("in-place export kept the store as %q", rep.Backup)
		}
		placed, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(placed, data) {
			t.Errorf("seed %d round %d: the in-place export differs from the export to a file (%v)", seed, round, err)
		}
		if _, err := os.Stat(path + ".wal"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the hwipam log was left beside the nv-ipam store: %v", err)
		}
		kept, keptCursors := loadExported(t, rep.Backup)
		compareExported(t, fmt.Sprintf("seed %d round %d (the kept hwipam store)", seed, round), kept, want, keptCursors, wantCursors)
		got, gotCursors = loadExported(t, path) // imports the in-place export
		compareExported(t, fmt.Sprintf("seed %d round %d (in place)", seed, round), got, want, gotCursors, wantCursors)
	}
	t.Logf("allocations made and exported over the rounds: %v", made)
	for _, k := range []string{"static", "index", "dual-stack", "exported v6", "exported cidrpool", "exported from nv-ipam"} {
		if made[k] == 0 {
			t.Errorf("seed %d: no %s allocation in any round: the test did not cover it", seed, k)
		}
	}
}

func compareExported(t *testing.T, ctx string, got, want []exported, gotCursors, wantCursors map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d allocations after the round trip, %d before", ctx, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			t.Errorf("%s: allocation\n %+v\nbecame\n %+v", ctx, want[i], got[i])
		}
	}
	for k, v := range wantCursors {
		if gotCursors[k] != v {
			t.Errorf("%s: pool %s last reserved %q, was %q", ctx, k, gotCursors[k], v)
		}
	}
}

// TestExportRefusesAndWritesNothing: a store that cannot be read fully, one
// the daemon holds, a missing one, an nv-ipam file and an existing output are
// refused, and no file appears.
func TestExportRefusesAndWritesNothing(t *testing.T) {
	noFiles := func(t *testing.T, dir string, keep ...string) {
		t.Helper()
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !slices.Contains(keep, e.Name()) {
				t.Errorf("the failed export left %s", e.Name())
			}
		}
	}
	t.Run("damaged store", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "store")
		data := damagedStore(t, path)
		for _, out := range []string{filepath.Join(dir, "out.json"), path} {
			_, err := store.ExportNVIPAM(path, out)
			if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), "nothing was exported") {
				t.Errorf("export of a damaged store to %s = %v, want ErrCorrupt saying nothing was exported", out, err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, data) {
				t.Error("the damaged store was modified")
			}
		}
		noFiles(t, dir, "store", "store.wal")
	})
	t.Run("a record that does not decode", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "store")
		s, err := store.Open(path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")},
			{PoolKey: "p", Allocation: alloc("c2", "net1", "not-an-address")}}, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(path)
		_, err = store.ExportNVIPAM(path, path)
		if err == nil || !strings.Contains(err.Error(), `"not-an-address"`) || !strings.Contains(err.Error(), "nothing was written") {
			t.Errorf("export of a store with a bad address = %v, want an error naming it", err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
			t.Error("the store was replaced")
		}
		noFiles(t, dir, "store", "store.wal")
	})
	t.Run("daemon running", func(t *testing.T) {
		s, path := openStore(t)
		if err := s.Commit([]store.Put{{PoolKey: "p", Allocation: alloc("c1", "net1", "10.0.0.1")}}, nil); err != nil {
			t.Fatal(err)
		}
		_, err := store.ExportNVIPAM(path, path)
		if err == nil || !strings.Contains(err.Error(), "stop ipam-node") {
			t.Errorf("export of a store held open = %v, want an error saying to stop ipam-node", err)
		}
		noFiles(t, filepath.Dir(path), "store", "store.wal")
	})
	t.Run("missing, nv-ipam already, output exists", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "store")
		if _, err := store.ExportNVIPAM(path, path); err == nil || !strings.Contains(err.Error(), "no store") {
			t.Errorf("export of no store = %v", err)
		}
		noFiles(t, dir)
		writeNVStore(t, path, 0)
		if _, err := store.ExportNVIPAM(path, path); err == nil || !strings.Contains(err.Error(), "already an nv-ipam JSON store") {
			t.Errorf("export of an nv-ipam store = %v", err)
		}
		noFiles(t, dir, "store")
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		s, err := store.Open(path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "out.json")
		if err := os.WriteFile(out, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := store.ExportNVIPAM(path, out); err == nil || !strings.Contains(err.Error(), "does not overwrite") {
			t.Errorf("export over an existing file = %v", err)
		}
		if b, _ := os.ReadFile(out); string(b) != "mine" {
			t.Error("the existing file was overwritten")
		}
		noFiles(t, dir, "store", "store.wal", "out.json")
	})
}

// Issue 39, item 2: the export wrote a DRA claim's allocation as an nv-ipam
// entry keyed by the claim's UID, silently, though nv-ipam has no driver to
// return the pod's port or release the address with the claim. Now a store
// with any (marked, or of the driver's network from before the mark) is
// refused, naming the pods, and nothing is written; --keep-dra-claims exports
// them, counted.
func TestExportRefusesDRAClaims(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "store")
		s, err := store.Open(path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		claim := store.Allocation{ContainerID: "3f2c-claim-uid", IfName: "nic:pci-0000-4f-00-0", IP: "10.26.0.3",
			PodName: "demo-gpu", PodNamespace: "default", PodUID: "pod-uid", Network: "nic.hwipam.io", Owner: "dra"}
		if legacy {
			claim.Owner = ""
		}
		if err := s.Commit([]store.Put{
			{PoolKey: "demo-ibp79s0", Allocation: claim},
			{PoolKey: "demo-ibp24s0", Allocation: store.Allocation{ContainerID: "c1", IfName: "net1", IP: "10.24.0.2", PodName: "demo-a",
				PodNamespace: "default", Network: "demo-ibp24s0"}},
		}, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = store.ExportNVIPAM(path, path)
		if !errors.Is(err, store.ErrDRAClaims) || !strings.Contains(err.Error(), "pod default/demo-gpu (claim UID 3f2c-claim-uid, 10.26.0.3)") ||
			!strings.Contains(err.Error(), "--keep-dra-claims") {
			t.Fatalf("legacy=%t: export of a store with a claim's address: %v", legacy, err)
		}
		if isNV, err := os.ReadFile(path); err != nil || strings.HasPrefix(string(isNV), "{") {
			t.Fatalf("legacy=%t: the refused export wrote the store (%v)", legacy, err)
		}
		if _, err := os.Stat(path + store.HwipamBackupSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("legacy=%t: the refused export left a backup: %v", legacy, err)
		}
		rep, err := store.ExportNVIPAMWith(path, path, store.ExportOptions{KeepClaims: true})
		if err != nil || rep.Claims != 1 || rep.Allocations != 2 {
			t.Fatalf("legacy=%t: export with KeepClaims: %+v, %v", legacy, rep, err)
		}
		got, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(got), `"3f2c-claim-uid_nic:pci-0000-4f-00-0":{"container_id":"3f2c-claim-uid"`) ||
			!strings.Contains(string(got), `"pod_name":"demo-gpu"`) {
			t.Errorf("legacy=%t: export with the claim:\n%s (%v)", legacy, got, err)
		}
	}
}
