package poolcontroller_test

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
)

// reportRaw sets node short's held annotation to raw, as a daemon (or whoever
// holds its credentials) may write it.
func (f *fixture) reportRaw(short, raw string) {
	f.t.Helper()
	var n corev1.Node
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: f.nodeName(short)}, &n); err != nil {
		f.t.Fatal(err)
	}
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[v1alpha1.HeldAnnotation] = raw
	if err := f.c.Update(f.t.Context(), &n); err != nil {
		f.t.Fatal(err)
	}
}

// wantIgnoredEvent checks that an event on node short tells that its report was
// ignored, saying why.
func (f *fixture) wantIgnoredEvent(short, why string) {
	f.t.Helper()
	evs := f.events()
	for _, e := range evs {
		if strings.Contains(e, "HeldReportIgnored") && strings.Contains(e, why) {
			return
		}
	}
	f.t.Errorf("no HeldReportIgnored event about node %s saying %q; events: %q", short, why, evs)
}

// Issue 29, case 1: a report for a pool that does not exist made that range
// foreign to every pool of the namespace, so no node got a block in any of them.
func TestReportOfAnUnknownPoolTakesNothing(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("h", false, map[string]string{v1alpha1.HeldAnnotation: `{"no-such-pool":{"held":["0.0.0.0-255.255.255.255"]}}`})
	f.node("a", true, nil)
	f.newIPPool("p", "10.96.0.0/24", 8, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.96.0.1-10.96.0.8"})
	f.wantIgnoredEvent("h", `reports pool "no-such-pool", in which the controller never gave it a block`)
	// Once per report: the next reconcile says nothing new.
	f.reconcile(f.ip, "p")
	if evs := f.events(); len(evs) != 0 {
		t.Errorf("events on a second reconcile with the same report: %q", evs)
	}
}

// Issue 29, case 1: a report claiming a whole pool as the node's orphans, though
// the node never had a block there, kept every other node from a block in it.
func TestReportClaimingAPoolTakesNothing(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.node("h", false, nil)
	f.newIPPool("p", "10.97.0.0/24", 8, nil)
	f.reconcile(f.ip, "p")
	f.reportRaw("h", `{"p":{"block":"10.97.0.9-10.97.0.16","held":["10.97.0.0-10.97.0.255"]}}`)
	f.node("b", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.97.0.1-10.97.0.8", "b=10.97.0.9-10.97.0.16"})
	f.wantIgnoredEvent("h", `reports pool "p", in which the controller never gave it a block`)
	wantCondition(t, f.ipPool("p").Status.PoolStatusCommon, v1alpha1.ConditionOrphans, "False", "no node holds")
}

// A node's report counts inside the blocks the controller gave it, now or
// earlier, and nowhere else: a's orphans in its old block stay its own, what it
// claims beyond them goes to other nodes.
func TestReportCountsOnlyInsideTheNodesBlocks(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.newIPPool("p", "10.98.0.0/24", 10, nil)
	f.reconcile(f.ip, "p")
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.98.0.1-10.98.0.10"}})
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 5 })
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks after the edit", f.blocksOf(f.ipPool("p")), []string{"a=10.98.0.1-10.98.0.5"})
	// Pods left in the old block (.6-.8), and a claim beyond it (.11-.30).
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.98.0.1-10.98.0.5", Held: []string{"10.98.0.6-10.98.0.8", "10.98.0.11-10.98.0.30"}}})
	f.node("b", true, nil)
	f.node("c", true, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")),
		[]string{"a=10.98.0.1-10.98.0.5", "b=10.98.0.11-10.98.0.15", "c=10.98.0.16-10.98.0.20"})
	f.wantIgnoredEvent("a", `reports 10.98.0.11-10.98.0.30 in pool "p", outside the blocks the controller gave it`)
	wantCondition(t, f.ipPool("p").Status.PoolStatusCommon, v1alpha1.ConditionOrphans, "True", "10.98.0.6-10.98.0.8")
}

// What a daemon holds in a pool that was deleted is kept from the pool that
// takes its range, whether the controller saw the deletion (the blocks become
// grants, kept in the Lease) or was down then (the pool the Lease knew is gone:
// its nodes' reports are taken as they stand, inside its network). A report of
// another pool that never existed takes nothing, nor, when the controller saw the
// deletion, a claim of a node that had no block in the deleted pool.
func TestReportsOfADeletedPool(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(map[bool]string{false: "seen", true: "down"}[down], func(t *testing.T) {
			f := newFixture(t, time.Minute)
			f.node("a", true, nil)
			f.node("b", true, nil)
			first, mem := f.restarted(true)
			f.newIPPool("old", "10.99.0.0/24", 4, nil)
			f.reconcile(first, "old")
			wantStrings(t, "blocks of old", f.blocksOf(f.ipPool("old")), []string{"a=10.99.0.1-10.99.0.4", "b=10.99.0.5-10.99.0.8"})
			f.save(mem)
			if err := f.c.Delete(t.Context(), f.ipPool("old")); err != nil {
				t.Fatal(err)
			}
			if !down {
				f.reconcile(first, "old") // NotFound: saved at once
			}
			f.report("a", map[string]v1alpha1.PoolHold{"old": {Held: []string{"10.99.0.2"}},
				"never": {Held: []string{"10.99.0.20-10.99.0.40"}}})
			f.report("b", map[string]v1alpha1.PoolHold{"old": {Held: []string{"10.99.0.6"}}})
			if !down {
				f.node("h", false, map[string]string{v1alpha1.HeldAnnotation: `{"old":{"held":["10.99.0.0-10.99.0.255"]}}`})
			}
			l, _ := f.lease()
			pl, _ := poolcontroller.DecodePayload(l.Annotations[poolcontroller.MemoryAnnotation])
			t.Logf("lease: %s", pl)
			r, _ := f.restarted(true)
			f.newIPPool("new", "10.99.0.0/24", 4, nil)
			f.reconcile(r, "new")
			wantStrings(t, "blocks of new", f.blocksOf(f.ipPool("new")), []string{"a=10.99.0.9-10.99.0.12", "b=10.99.0.13-10.99.0.16"})
			if !down {
				f.node("c", true, nil)
				f.reconcile(r, "new")
				wantStrings(t, "blocks of new after c joined", f.blocksOf(f.ipPool("new")),
					[]string{"a=10.99.0.9-10.99.0.12", "b=10.99.0.13-10.99.0.16", "c=10.99.0.17-10.99.0.20"})
			}
		})
	}
}

// Issue 29, case 2: one node's report of some 190 KiB (under the API server's
// limit, incompressible) pushed the Lease's payload over its bound, so no other
// node's orphans were kept across a restart. Now a report over the limit counts
// as holding the node's grants, and everyone else's is kept.
func TestOversizedReportDoesNotFillTheMemory(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.node("h", true, nil)
	first, mem := f.restarted(true)
	first.Recorder = f.recorder
	f.newIPPool("p", "10.100.0.0/24", 8, nil)
	f.reconcile(first, "p")
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.100.0.1-10.100.0.8"}})
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 4 })
	f.reconcile(first, "p")
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.100.0.1-10.100.0.4", Held: []string{"10.100.0.7"}}})

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 29))
	// Random printable characters: about 6.5 bits each, so gzip leaves the
	// 200 KiB at some 165 KiB, over the Lease's bound once in base64.
	const printable = "!#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~ "
	var held []string
	for range 200 {
		b := make([]byte, 1000)
		for i := range b {
			b[i] = printable[rng.IntN(len(printable))]
		}
		held = append(held, string(b))
	}
	f.report("h", map[string]v1alpha1.PoolHold{"x": {Held: held}})
	f.reconcile(first, "p")
	f.save(mem)
	f.wantIgnoredEvent("h", "more than the 65536 the controller reads")
	_, kept := f.lease()
	// Its block too (the Lease keeps the blocks the status covers while they
	// fit: issue 38, seed 310242).
	if got := kept[f.nodeName("a")]; got != `{"p":{"block":"10.100.0.1-10.100.0.4","held":["10.100.0.7"]}}` {
		t.Errorf("the Lease keeps %q of a's report, want its block and orphan", got)
	}

	// a's Node re-registered while the controller is down: the restarted
	// controller still keeps a's orphan from a new node.
	f.deleteNode("a")
	f.node("a", false, nil)
	again, _ := f.restarted(true)
	f.node("c", true, nil)
	f.reconcile(again, "p")
	var got string
	for _, b := range f.ipPool("p").Status.Allocations {
		if b.NodeName == f.nodeName("c") {
			got = b.StartIP + "-" + b.EndIP
		}
	}
	if r, err := iprange.ParseRange(got); err != nil || r.Contains(netip.MustParseAddr("10.100.0.7")) {
		t.Errorf("c got block %q, want one clear of a's orphan 10.100.0.7", got)
	}
}

// Issue 38, window 1: a controller with no grants to check reports against (a
// fresh install, its Lease deleted or not readable) adopted the first report of
// every pool as written for as long as it ran, not only at its start. Tried by
// hand: node evil forged a hold over pool p2 before p2 existed; p2 was created,
// and none of the four nodes got a block. Now a pool created after the start
// adopts nothing: its every block is one this controller gave.
func TestForgedReportOfAPoolCreatedLaterTakesNothing(t *testing.T) {
	for _, lease := range []bool{true, false} {
		t.Run(map[bool]string{true: "no-lease-yet", false: "memory-only"}[lease], func(t *testing.T) {
			f := newFixture(t, time.Minute)
			for _, n := range []string{"a", "b", "c", "d"} {
				f.node(n, true, nil)
			}
			f.node("evil", false, nil)
			f.newIPPool("p1", "10.101.0.0/24", 8, nil)
			r, _ := f.restarted(lease)
			r.Recorder = f.recorder
			f.reconcile(r, "p1")
			wantStrings(t, "blocks of p1", f.blocksOf(f.ipPool("p1")),
				[]string{"a=10.101.0.1-10.101.0.8", "b=10.101.0.9-10.101.0.16", "c=10.101.0.17-10.101.0.24", "d=10.101.0.25-10.101.0.32"})
			f.reportRaw("evil", `{"p2":{"block":"10.102.0.0-10.102.0.255","held":["10.102.0.0-10.102.0.255"]},`+
				`"p1":{"held":["10.101.0.0-10.101.0.255"]}}`)
			f.newIPPool("p2", "10.102.0.0/24", 8, nil)
			f.reconcile(r, "p2")
			wantStrings(t, "blocks of p2", f.blocksOf(f.ipPool("p2")),
				[]string{"a=10.102.0.1-10.102.0.8", "b=10.102.0.9-10.102.0.16", "c=10.102.0.17-10.102.0.24", "d=10.102.0.25-10.102.0.32"})
			f.wantIgnoredEvent("evil", `reports pool "p2", in which the controller never gave it a block`)
			// p1 existed at the start, before the report: nothing of it is
			// adopted either; a new node gets the next block.
			f.node("e", true, nil)
			f.reconcile(r, "p1")
			if got := f.blocksOf(f.ipPool("p1")); !slices.Contains(got, "e=10.101.0.33-10.101.0.40") {
				t.Errorf("blocks of p1 after e joined: %v, want e=10.101.0.33-10.101.0.40", got)
			}
			// Re-created while this controller runs: still nothing.
			if err := f.c.Delete(t.Context(), f.ipPool("p2")); err != nil {
				t.Fatal(err)
			}
			f.reconcile(r, "p2")
			f.newIPPool("p2", "10.102.0.0/24", 8, nil)
			f.reconcile(r, "p2")
			if got := f.blocksOf(f.ipPool("p2")); len(got) != 5 {
				t.Errorf("blocks of the re-created p2: %v, want one for each of a-e", got)
			}
		})
	}
}

// What is left of window 1, and its bound: a report present when a controller
// without grants starts, for a pool that exists then, is adopted within the
// pool's network (an honest daemon's orphans are kept: no address twice); the
// same node's later reports count only within what it was given then.
func TestReportsAdoptedOnlyAsTheyStoodAtTheStart(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	// o holds .3 of p and .2 of q, a pool deleted before the start and
	// created again after it.
	f.node("o", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.104.0.3"]},"q":{"held":["10.106.0.2"]}}`})
	f.newIPPool("p", "10.104.0.0/24", 4, nil)
	r, mem := f.restarted(false)
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.104.0.5-10.104.0.8"})
	wantStrings(t, "o's grants", mem.Grants(f.storeKey("p"), f.nodeName("o")), []string{"10.104.0.3-10.104.0.3"})
	// o now claims the whole pool: only its adopted orphan counts.
	f.reportRaw("o", `{"p":{"held":["10.104.0.0-10.104.0.255"]}}`)
	f.node("b", true, nil)
	f.reconcile(r, "p")
	wantStrings(t, "blocks after b joined", f.blocksOf(f.ipPool("p")), []string{"a=10.104.0.5-10.104.0.8", "b=10.104.0.9-10.104.0.12"})
	wantStrings(t, "o's grants", mem.Grants(f.storeKey("p"), f.nodeName("o")), []string{"10.104.0.3-10.104.0.3"})
	// q comes back: o's address there, as reported at the start, is kept;
	// what o claims of q now is not.
	f.reportRaw("o", `{"q":{"held":["10.106.0.0-10.106.0.255"]}}`)
	f.newIPPool("q", "10.106.0.0/24", 4, nil)
	f.reconcile(r, "q")
	wantStrings(t, "blocks of q", f.blocksOf(f.ipPool("q")), []string{"a=10.106.0.5-10.106.0.8", "b=10.106.0.9-10.106.0.12"})
	wantStrings(t, "o's grants in q", mem.Grants(f.storeKey("q"), f.nodeName("o")), []string{"10.106.0.2-10.106.0.2"})
}

func (f *fixture) storeKey(pool string) string { return v1alpha1.PoolKey(v1alpha1.KindIPPool, pool) }

// Issue 38, window 3: grants accumulated. A node that leaves a pool and joins it
// again (a compromised daemon can change its own nic.hwipam.io labels) got the
// lowest free block, not the one it still held, and kept both while its report
// claimed them: cycle by cycle it could take the pool. Now a node that holds
// addresses in the pool gets a block over them when one is free for it, so what
// it counts for stays one block. Randomised, with honest nodes joining and
// leaving around it; the seed is printed.
func TestGrantsDoNotAccumulateWhileANodeComesAndGoes(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HWIPAM_TEST_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (replay: HWIPAM_TEST_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 38))
	f := newFixture(t, time.Minute)
	honest := []string{"a", "b", "c", "d", "e"}
	on := map[string]bool{}
	for _, n := range honest {
		on[n] = rng.IntN(2) == 0
		f.node(n, on[n], nil)
	}
	f.node("h", true, nil)
	on["h"] = true
	f.newIPPool("p", "10.105.0.0/26", 4, nil)
	r, mem := f.restarted(true)
	f.reconcile(r, "p")
	// h claims every address of the pool, whatever it was given.
	f.reportRaw("h", `{"p":{"held":["10.105.0.0-10.105.0.63"]}}`)
	key, h := f.storeKey("p"), f.nodeName("h")
	for step := range 40 {
		switch k := rng.IntN(4); k {
		case 0, 1:
			n := "h"
			if k == 1 {
				n = honest[rng.IntN(len(honest))]
			}
			on[n] = !on[n]
			f.setSelected(n, on[n])
		case 2:
			f.clock.Advance(time.Duration(30+rng.IntN(60)) * time.Second)
		}
		f.reconcile(r, "p")
		var addrs uint64
		grants := mem.Grants(key, h)
		for _, g := range grants {
			rg, err := iprange.ParseRange(g)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := iprange.Distance(rg.Start, rg.End).Add(iprange.U64(1))
			addrs += n.Lo
		}
		if addrs > 4 {
			t.Fatalf("seed %d step %d: h counts for %d addresses (%v), more than the one block of 4 it ever needed; blocks %v",
				seed, step, addrs, grants, f.blocksOf(f.ipPool("p")))
		}
	}
}

// Issue 38, window 2, and its bound: a Node deleted and registered again under
// the same name (a new UID: the same machine whose Node was re-created, or
// another machine given that name) speaks for what the controller gave that
// name, and no more: a report claiming the whole pool counts only within the
// name's grants.
func TestReRegisteredNodeCountsOnlyItsNamesGrants(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.newIPPool("p", "10.107.0.0/24", 4, nil)
	r, mem := f.restarted(true)
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.107.0.1-10.107.0.4"})
	old := f.getNode("a").UID
	f.deleteNode("a")
	f.reconcile(r, "p")
	f.node("a", true, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"block":"10.107.0.1-10.107.0.4","held":["10.107.0.0-10.107.0.255"]}}`})
	if f.getNode("a").UID == old {
		t.Fatal("the re-created Node has the old UID")
	}
	f.node("b", true, nil)
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.107.0.1-10.107.0.4", "b=10.107.0.5-10.107.0.8"})
	wantStrings(t, "a's grants", mem.Grants(f.storeKey("p"), f.nodeName("a")), []string{"10.107.0.1-10.107.0.4"})
}

func (f *fixture) getNode(short string) *corev1.Node {
	f.t.Helper()
	var n corev1.Node
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: f.nodeName(short)}, &n); err != nil {
		f.t.Fatal(err)
	}
	return &n
}
