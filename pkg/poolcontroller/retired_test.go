package poolcontroller

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// What the memory writes into the records (retiredOf) and what it reads back
// from them after a restart (restoreRecords) are the same grants and
// reservations: a record written from a restored memory is not written again,
// and no restart moves a reservation; what the daemons' reports said (whether a
// node's daemon reports, which retired blocks it held) is read back as it was
// written. Randomised, with a printed seed (HWIPAM_RETIRED_SEED replays one).
func TestRetiredBlocksRoundTripThroughRecords(t *testing.T) {
	rng := seededRand(t, "HWIPAM_RETIRED_SEED", 0)
	const ns = "kube-system"
	now := time.Date(2026, 11, 29, 7, 0, 0, int(rng.IntN(1e9)), time.UTC)
	m := &Memory{}
	m.mu.Lock()
	m.init()
	m.loaded, m.now = true, now
	m.pools["rail0"] = knownPool{UID: "uid-rail0"}
	m.pools["cidrpool/rail1"] = knownPool{UID: "uid-rail1"}
	nodes := []string{"n-a", "n-b", "n-c"}
	var taken []planner.Misfit
	for i := range 1 + rng.IntN(12) {
		start := netip.AddrFrom4([4]byte{10, 7, byte(i), byte(rng.IntN(200))})
		end, _ := iprange.Add(start, iprange.U64(uint64(rng.IntN(40))))
		tk := planner.Misfit{Node: nodes[rng.IntN(len(nodes))], Range: iprange.Range{Start: start, End: end}}
		if !slices.Contains(taken, tk) {
			taken = append(taken, tk)
		}
	}
	key := []string{"rail0", "cidrpool/rail1"}[rng.IntN(2)]
	m.retireLocked(key, taken, now.Add(-time.Duration(rng.IntN(5000))*time.Millisecond))
	m.mu.Unlock()
	var rs []reservation
	for _, tk := range taken {
		if rng.IntN(2) == 0 {
			rs = append(rs, reservation{Misfit: tk, Until: now.Add(time.Duration(1+rng.IntN(3600000)) * time.Millisecond)})
		}
	}
	m.keepReservations(ns+"/"+key, m.pools[key].UID, rs)
	// Some daemons report, holding addresses in some of their retired blocks
	// (which never overlap: each lies in its own /24).
	heldBy := map[planner.Misfit]bool{}
	reporting := map[string]bool{}
	m.mu.Lock()
	for _, n := range nodes {
		if rng.IntN(3) == 0 {
			continue
		}
		reporting[n] = true
		var h v1alpha1.PoolHold
		for _, tk := range taken {
			if tk.Node == n && rng.IntN(2) == 0 {
				h.Held = append(h.Held, tk.Range.String())
				heldBy[tk] = true
			}
		}
		raw, _ := json.Marshal(map[string]v1alpha1.PoolHold{key: h})
		m.reports[n] = newReport(string(raw), now, true)
	}
	m.mu.Unlock()

	var recs []nodeipamv1.NodeIPAM
	written := map[string][]nodeipamv1.RetiredBlock{}
	for _, n := range nodes {
		out, reports, ok := m.retiredOf(ns, n)
		if !ok {
			t.Fatal("retiredOf on a loaded memory says it is not loaded")
		}
		if reports != reporting[n] {
			t.Fatalf("%s's record would say daemonReports=%v, its daemon reports: %v", n, reports, reporting[n])
		}
		written[n] = out
		recs = append(recs, nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: nodeipamv1.FieldManager}}},
			Spec: nodeipamv1.NodeIPAMSpec{Retired: out, DaemonReports: reports}})
	}
	for _, tk := range taken {
		for _, rb := range written[tk.Node] {
			if rb.Range == tk.Range.String() && rb.Held != heldBy[tk] {
				t.Fatalf("%s's retired %s is written held=%v; its report holds addresses in it: %v", tk.Node, tk.Range, rb.Held, heldBy[tk])
			}
		}
	}
	for _, tk := range taken {
		found := false
		for _, rb := range written[tk.Node] {
			found = found || (rb.Range == tk.Range.String() && rb.PoolUID == types.UID(m.pools[key].UID))
		}
		if !found {
			t.Fatalf("%s's retired block %s is not in what its record is written from: %+v", tk.Node, tk.Range, written[tk.Node])
		}
	}
	for _, r := range rs {
		for _, rb := range written[r.Node] {
			if rb.Range == r.Range.String() && (rb.ReservedUntil == nil || rb.ReservedUntil.Time.Before(r.Until)) {
				t.Fatalf("%s's %s is reserved until %v in the memory, %v in its record", r.Node, r.Range, r.Until, rb.ReservedUntil)
			}
		}
	}

	// A controller that starts: a memory with nothing but the records.
	again := &Memory{}
	again.mu.Lock()
	again.init()
	again.loaded, again.now = true, now
	again.pools[key] = m.pools[key]
	again.restoreRecords(recs, now)
	again.mu.Unlock()
	for _, n := range nodes {
		out, reports, _ := again.retiredOf(ns, n)
		if reports != reporting[n] {
			t.Errorf("%s's record after a restart would say daemonReports=%v, where it says %v", n, reports, reporting[n])
		}
		if fmt.Sprint(mergeRetired(out, written[n])) != fmt.Sprint(written[n]) || !retiredEqual(mergeRetired(out, written[n]), written[n]) {
			t.Errorf("%s's record after a restart would say\n%+v\nwhere it says\n%+v", n, out, written[n])
		}
	}
	if got := again.reservationsOf(ns+"/"+key, m.pools[key].UID, now, 2*time.Hour); len(got) != len(rs) {
		t.Errorf("%d reservations read back from the records, want %d", len(got), len(rs))
	}
}

// seededRand returns a generator of a seed from the clock, or the one the
// environment variable env names, logged so that a failure can be replayed.
func seededRand(t *testing.T, env string, stream uint64) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := envSeed(t, env); s != 0 {
		seed = s
	}
	t.Logf("seed %d (replay with %s=%d)", seed, env, seed)
	return rand.New(rand.NewPCG(seed, stream))
}

// envSeed is the seed an environment variable names; 0 when unset.
func envSeed(t *testing.T, name string) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
