package poolcontroller_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
)

// restarted returns an IPPool reconciler as a controller that has just started
// has it: it knows only what the Lease keeps (nothing when lease is false).
func (f *fixture) restarted(lease bool) (*poolcontroller.Reconciler, *poolcontroller.Memory) {
	m := &poolcontroller.Memory{Reader: f.c, Client: f.c, Log: testr.New(f.t)}
	if lease {
		m.Lease = types.NamespacedName{Namespace: f.ns, Name: poolcontroller.MemoryLeaseName}
	}
	return &poolcontroller.Reconciler{Client: f.c, StatusWriter: newStatusWriter(f.t, cp), Kind: v1alpha1.KindIPPool,
		ReleaseGracePeriod: time.Minute, Now: f.clock.Now, Memory: m}, m
}

func (f *fixture) save(m *poolcontroller.Memory) {
	f.t.Helper()
	if err := m.Save(f.t.Context()); err != nil {
		f.t.Fatal(err)
	}
}

// lease returns the memory's Lease (nil if none) and the reports it keeps.
func (f *fixture) lease() (*coordinationv1.Lease, map[string]string) {
	f.t.Helper()
	var l coordinationv1.Lease
	err := f.c.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: poolcontroller.MemoryLeaseName}, &l)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	kept, err := poolcontroller.DecodeMemory(l.Annotations[poolcontroller.MemoryAnnotation])
	if err != nil {
		f.t.Fatalf("the Lease's annotation: %v", err)
	}
	return &l, kept
}

// A controller that restarts still honours what daemons hold: found by the
// whole-system test, seed 411767, where the restarted controller gave another
// node a block over an address a node held from a pool deleted and re-created,
// its Node re-registered while its daemon was down. The re-registration seen by
// the controller before it restarts (a), and while it was down (c, e); a held
// address (a, c, g), a reported block the status does not give the node (e); a
// Node that is gone (g).
func TestHeldReportsOutliveARestart(t *testing.T) {
	f := newFixture(t, time.Minute)
	aReport := `{"p":{"held":["10.93.0.2"]},"x":{"block":"10.90.0.1-10.90.0.4"}}`
	gReport := `{"p":{"held":["10.93.0.14"]},"z":{"block":"10.92.0.1-10.92.0.4"}}`
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: aReport})
	f.node("c", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.93.0.6"]},"y":{"block":"10.91.0.1-10.91.0.4"}}`})
	f.node("e", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"block":"10.93.0.9-10.93.0.12"}}`})
	f.node("g", false, map[string]string{v1alpha1.HeldAnnotation: gReport})
	f.node("b", true, nil)
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	first, mem := f.restarted(true)
	f.reconcile(first, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.17-10.93.0.20"})
	f.save(mem)
	// Of the Nodes that show their reports, the pools with something no status
	// records.
	_, kept := f.lease()
	want := map[string]string{f.nodeName("a"): `{"p":{"held":["10.93.0.2"]}}`, f.nodeName("c"): `{"p":{"held":["10.93.0.6"]}}`,
		f.nodeName("e"): `{"p":{"block":"10.93.0.9-10.93.0.12"}}`, f.nodeName("g"): `{"p":{"held":["10.93.0.14"]}}`}
	if !maps.Equal(kept, want) {
		t.Errorf("the Lease keeps %v, want %v", kept, want)
	}
	// a re-registered and g gone while this controller runs: what their reports
	// count for (pools x and z, in which they have no block, do not: see
	// trust_test.go).
	f.deleteNode("a")
	f.node("a", false, nil)
	f.deleteNode("g")
	f.reconcile(first, "p")
	f.save(mem)
	_, kept = f.lease()
	if !maps.Equal(kept, want) {
		t.Errorf("the Lease keeps %v, want %v", kept, want)
	}
	// c and e re-registered while it is down; the pool is re-created.
	f.deleteNode("c")
	f.node("c", false, nil)
	f.deleteNode("e")
	f.node("e", false, nil)
	recreate := func() {
		t.Helper()
		if err := f.c.Delete(t.Context(), f.ipPool("p")); err != nil {
			t.Fatal(err)
		}
		f.newIPPool("p", "10.93.0.0/24", 4, nil)
	}
	recreate()

	// Without the Lease, a restarted controller gives b a block over a's address.
	forgetful, _ := f.restarted(false)
	f.reconcile(forgetful, "p")
	wantStrings(t, "blocks by a restarted controller without the Lease", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.1-10.93.0.4"})
	recreate()
	again, mem2 := f.restarted(true)
	f.reconcile(again, "p")
	wantStrings(t, "blocks by a restarted controller", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.17-10.93.0.20"})

	f.save(mem2)
	before, _ := f.lease()
	f.reconcile(again, "p")
	f.save(mem2)
	if after, _ := f.lease(); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("a memory that did not change was written again")
	}

	// a's daemon reports again (nothing outside its block), c and e are gone,
	// and the grace period passes: the Lease keeps only that a's daemon
	// reports (an empty report, see TestNodeRecreatedWhileNoControllerRan).
	f.report("a", map[string]v1alpha1.PoolHold{"x": {Block: "10.90.0.1-10.90.0.4"}})
	f.deleteNode("c")
	f.deleteNode("e")
	f.reconcile(again, "p")
	f.clock.Advance(time.Minute)
	f.reconcile(again, "p")
	f.save(mem2)
	if _, kept := f.lease(); !maps.Equal(kept, map[string]string{f.nodeName("a"): "{}"}) {
		t.Errorf("the Lease keeps %v, want a's empty report", kept)
	}
	if got := mem2.Nodes(); !slices.Equal(got, []string{f.nodeName("a")}) {
		t.Errorf("the memory has reports of %v, want only a's", got)
	}
}

// forbidding reads through Reader, or refuses as RBAC would while forbid is set.
type forbidding struct {
	client.Reader
	forbid atomic.Bool
}

func (r *forbidding) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if r.forbid.Load() {
		return apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, key.Name,
			errors.New("not in the test's role"))
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A controller that may not read the Lease reconciles with what it sees, and
// does not write the Lease until it can read it: then it adds what the Lease
// kept to its own.
func TestForbiddenLeaseIsNotOverwritten(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.93.0.6"]}}`})
	f.node("b", true, nil)
	old := map[string]string{"elsewhere": `{"p":{"held":["10.93.0.2"]}}`}
	value, err := poolcontroller.EncodeMemory(old)
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{}
	lease.Name, lease.Namespace = poolcontroller.MemoryLeaseName, f.ns
	lease.Annotations = map[string]string{poolcontroller.MemoryAnnotation: value}
	if err := f.c.Create(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	r, mem := f.restarted(true)
	reader := &forbidding{Reader: f.c}
	reader.forbid.Store(true)
	mem.Reader = reader
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.1-10.93.0.4"})
	if err := mem.Save(t.Context()); err == nil || !apierrors.IsForbidden(err) {
		t.Errorf("Save while the Lease cannot be read: %v, want forbidden", err)
	}
	if _, kept := f.lease(); !maps.Equal(kept, old) {
		t.Errorf("the Lease keeps %v, want what it kept before, %v", kept, old)
	}
	reader.forbid.Store(false)
	f.save(mem)
	want := map[string]string{"elsewhere": old["elsewhere"], f.nodeName("a"): `{"p":{"held":["10.93.0.6"]}}`}
	if _, kept := f.lease(); !maps.Equal(kept, want) {
		t.Errorf("the Lease keeps %v, want %v", kept, want)
	}
}

// A Lease whose annotation cannot be read is ignored (and logged), not a reason
// to stop reconciling; the next save replaces it.
func TestUnreadableMemoryIsReplaced(t *testing.T) {
	f := newFixture(t, time.Minute)
	report := `{"p":{"held":["10.93.0.2"]}}`
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: report})
	f.node("b", true, nil)
	lease := &coordinationv1.Lease{}
	lease.Name, lease.Namespace = poolcontroller.MemoryLeaseName, f.ns
	lease.Annotations = map[string]string{poolcontroller.MemoryAnnotation: "not gzip in base64"}
	if err := f.c.Create(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	r, mem := f.restarted(true)
	f.reconcile(r, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.5-10.93.0.8"})
	f.save(mem)
	if _, kept := f.lease(); !maps.Equal(kept, map[string]string{f.nodeName("a"): report}) {
		t.Errorf("the Lease keeps %v, want a's report", kept)
	}
}

// What changed since the last save is saved when the controller stops.
func TestMemorySavedOnTheWayOut(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.93.0.6"]}}`})
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	r, mem := f.restarted(true)
	mem.Interval = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mem.Start(ctx) }()
	f.reconcile(r, "p")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, kept := f.lease(); !maps.Equal(kept, map[string]string{f.nodeName("a"): `{"p":{"held":["10.93.0.6"]}}`}) {
		t.Errorf("the Lease keeps %v after the controller stopped, want a's report", kept)
	}
}

// Without the daemons' reports (no RBAC to annotate Nodes), a block retired by
// an edit is held back for the grace period only by the controller's
// reservation: the Lease keeps it, written before the status drops the block,
// so a controller that restarts within the grace period still holds it back.
func TestReservationsOutliveARestart(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.newIPPool("p", "10.89.0.0/24", 10, nil)
	first, _ := f.restarted(true)
	f.reconcile(first, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"a=10.89.0.1-10.89.0.10"})
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 5 })
	f.reconcile(first, "p") // no Save by Start: the reconcile saved it
	wantStrings(t, "blocks after the edit", f.blocksOf(f.ipPool("p")), []string{"a=10.89.0.1-10.89.0.5"})
	l, _ := f.lease()
	if l == nil {
		t.Fatal("no Lease after a block was retired")
	}
	reserved, err := poolcontroller.DecodeReserved(l.Annotations[poolcontroller.MemoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{f.nodeName("a") + " 10.89.0.1-10.89.0.10"}; !slices.Equal(reserved[f.ns+"/p"], want) {
		t.Errorf("the Lease keeps reservations %v, want %v for %s/p", reserved, want, f.ns)
	}
	f.node("b", true, nil)

	// What a restarted controller without the Lease does, then undone.
	before := f.ipPool("p").Status
	forgetful, _ := f.restarted(false)
	f.reconcile(forgetful, "p")
	wantStrings(t, "blocks by a restarted controller without the Lease", f.blocksOf(f.ipPool("p")),
		[]string{"a=10.89.0.1-10.89.0.5", "b=10.89.0.6-10.89.0.10"})
	undo := f.ipPool("p")
	undo.Status = before
	if err := f.c.Status().Update(t.Context(), undo); err != nil {
		t.Fatal(err)
	}

	again, mem := f.restarted(true)
	f.reconcile(again, "p")
	wantStrings(t, "blocks by a restarted controller", f.blocksOf(f.ipPool("p")),
		[]string{"a=10.89.0.1-10.89.0.5", "b=10.89.0.11-10.89.0.15"})
	// Once the grace period is over, the Lease keeps no reservation.
	f.clock.Advance(time.Minute)
	f.reconcile(again, "p")
	f.save(mem)
	l, _ = f.lease()
	if reserved, _ := poolcontroller.DecodeReserved(l.Annotations[poolcontroller.MemoryAnnotation]); len(reserved) != 0 {
		t.Errorf("the Lease keeps reservations %v past the grace period", reserved)
	}
}

// leaseWatcher is the controller's status writer, which first checks what the
// Lease keeps.
type leaseWatcher struct {
	poolcontroller.StatusWriter
	check func(pool client.Object)
}

func (w *leaseWatcher) UpdateStatus(ctx context.Context, pool client.Object) (string, error) {
	w.check(pool)
	return w.StatusWriter.UpdateStatus(ctx, pool)
}

// failingWrites fails the next fails writes as an API server in trouble would.
type failingWrites struct {
	client.Client
	fails atomic.Int32
}

func (c *failingWrites) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if c.fails.Add(-1) >= 0 {
		return apierrors.NewInternalError(errors.New("the test's API server is in trouble"))
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *failingWrites) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if c.fails.Add(-1) >= 0 {
		return apierrors.NewInternalError(errors.New("the test's API server is in trouble"))
	}
	return c.Client.Update(ctx, obj, opts...)
}

// The status that drops a retired block is written only once the Lease keeps
// its reservation: a reconcile whose save fails writes nothing and the next one
// saves it. A CIDRPool of the same name, sharing the memory, leaves the
// IPPool's reservation alone.
func TestReservationSavedBeforeTheStatus(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	f.newIPPool("p", "10.89.0.0/24", 10, nil)
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "10.88.0.0/16", PerNodeNetworkPrefix: 24, NodeSelector: f.selector()}})
	ip, mem := f.restarted(true)
	writes := &failingWrites{Client: f.c}
	mem.Client = writes
	edited := false
	ip.StatusWriter = &leaseWatcher{StatusWriter: ip.StatusWriter, check: func(pool client.Object) {
		p, ok := pool.(*v1alpha1.IPPool)
		if !ok || !edited || slices.Contains(f.blocksOf(p), "a=10.89.0.1-10.89.0.10") {
			return
		}
		l, _ := f.lease()
		if l == nil {
			t.Errorf("status without a's old block written while no Lease exists")
			return
		}
		if r, _ := poolcontroller.DecodeReserved(l.Annotations[poolcontroller.MemoryAnnotation]); len(r[f.ns+"/p"]) != 1 {
			t.Errorf("status without a's old block written while the Lease keeps reservations %v", r)
		}
	}}
	cidr := &poolcontroller.Reconciler{Client: f.c, StatusWriter: newStatusWriter(t, cp), Kind: v1alpha1.KindCIDRPool,
		ReleaseGracePeriod: time.Minute, Now: f.clock.Now, Memory: mem}
	f.reconcile(ip, "p")
	f.reconcile(cidr, "p")
	f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 5 })
	edited = true
	writes.fails.Store(1)
	if _, err := ip.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: f.ns, Name: "p"}}); err == nil {
		t.Error("a reconcile whose save failed succeeded")
	}
	wantStrings(t, "blocks after the failed reconcile", f.blocksOf(f.ipPool("p")), []string{"a=10.89.0.1-10.89.0.10"})
	f.reconcile(ip, "p")
	wantStrings(t, "blocks after the edit", f.blocksOf(f.ipPool("p")), []string{"a=10.89.0.1-10.89.0.5"})
	f.reconcile(cidr, "p")
	f.save(mem)
	l, _ := f.lease()
	reserved, err := poolcontroller.DecodeReserved(l.Annotations[poolcontroller.MemoryAnnotation])
	if want := map[string][]string{f.ns + "/p": {f.nodeName("a") + " 10.89.0.1-10.89.0.10"}}; err != nil ||
		!maps.EqualFunc(reserved, want, slices.Equal) {
		t.Errorf("the Lease keeps reservations %v (%v), want %v", reserved, err, want)
	}
}

// A Node deleted and registered again within the grace period keeps its
// daemon's report, however long the controller had been quiet before: found
// by the whole-system test, seed 824446 (issue 38), where the grace period was
// counted from the last reconcile that listed the Node, so that the report was
// dropped at once, and a pool re-created gave another node the block that the
// re-registered node's daemon (down, so it could not report again) still held
// addresses in.
func TestReportOfANodeAwayWithinGraceAfterAQuietSpell(t *testing.T) {
	f := newFixture(t, 3*time.Second)
	f.node("h", true, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"block":"10.94.0.1-10.94.0.4"}}`})
	f.newIPPool("p", "10.94.0.0/24", 4, nil)
	f.reconcile(f.ip, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"h=10.94.0.1-10.94.0.4"})

	// Quiet for longer than the grace period; then h's Node is away a second.
	f.clock.Advance(10 * time.Second)
	f.deleteNode("h")
	f.reconcile(f.ip, "p")
	f.clock.Advance(time.Second)
	f.node("h", true, nil)
	f.reconcile(f.ip, "p")

	// The pool is re-created; b, which sorts first, must not get h's block.
	f.node("b", true, nil)
	if err := f.c.Delete(t.Context(), f.ipPool("p")); err != nil {
		t.Fatal(err)
	}
	f.newIPPool("p", "10.94.0.0/24", 4, nil)
	f.reconcile(f.ip, "p")
	if got := f.blocksOf(f.ipPool("p")); !slices.Contains(got, "b=10.94.0.5-10.94.0.8") {
		t.Errorf("blocks of the re-created pool: %v, want b's clear of h's old block 10.94.0.1-10.94.0.4", got)
	}

	// Gone for the grace period, counted from when the controller found it
	// gone, the report is dropped.
	f.deleteNode("h")
	f.reconcile(f.ip, "p")
	f.clock.Advance(2 * time.Second)
	f.reconcile(f.ip, "p")
	if got := f.ip.Memory.Nodes(); !slices.Contains(got, f.nodeName("h")) {
		t.Errorf("the report of h, gone for 2 s of a 3 s grace period, was dropped (reports of %v)", got)
	}
	f.clock.Advance(2 * time.Second)
	f.reconcile(f.ip, "p")
	if got := f.ip.Memory.Nodes(); slices.Contains(got, f.nodeName("h")) {
		t.Errorf("the report of h, gone for 4 s of a 3 s grace period, is still kept (reports of %v)", got)
	}
}

// A node whose Node was re-registered while no controller ran, its daemon
// down, keeps the block the status gave it when its pool is deleted and
// created anew: the Lease keeps of a live report only what no status
// records, so the restarted controller had no report of the node at all, and
// gave another node the block its daemon still held addresses in (issue 38,
// TestNodeRecreatedWhileNoControllerRanThenPoolRecreated in test/system).
func TestNodeRecreatedWhileNoControllerRan(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("h", true, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"block":"10.95.0.1-10.95.0.4"}}`})
	f.newIPPool("p", "10.95.0.0/24", 4, nil)
	first, mem := f.restarted(true)
	f.reconcile(first, "p")
	wantStrings(t, "blocks", f.blocksOf(f.ipPool("p")), []string{"h=10.95.0.1-10.95.0.4"})
	f.save(mem)

	// No controller runs: h's Node is re-registered, without its report.
	f.deleteNode("h")
	f.node("h", true, nil)
	again, _ := f.restarted(true)
	f.reconcile(again, "p")

	// The pool is re-created; b, which sorts first, must not get h's block.
	f.node("b", true, nil)
	if err := f.c.Delete(t.Context(), f.ipPool("p")); err != nil {
		t.Fatal(err)
	}
	f.newIPPool("p", "10.95.0.0/24", 4, nil)
	f.reconcile(again, "p")
	if got := f.blocksOf(f.ipPool("p")); !slices.Contains(got, "b=10.95.0.5-10.95.0.8") {
		t.Errorf("blocks of the re-created pool: %v, want b's clear of h's block 10.95.0.1-10.95.0.4", got)
	}
}

// The Lease keeps an empty report of each daemon that reports, some 3.5 bytes a
// node compressed: at tens of thousands of nodes with random names that alone
// went over the annotation's bound, and then nothing was saved at all (grants,
// reservations, reports). Now what does not fit in one Lease is spread over
// more (issue 37), each within the bound, and a restarted controller reads them
// all; only past MaxParts do the empty reports go first, the rest being kept.
func TestLeaseSpreadsOverPartsPastItsSize(t *testing.T) {
	for _, maxParts := range []int{0, 2} {
		t.Run(fmt.Sprintf("max-%d", maxParts), func(t *testing.T) {
			f := newFixture(t, time.Minute)
			f.node("a", true, nil)
			first, mem := f.restarted(true)
			mem.MaxParts = maxParts
			f.newIPPool("p", "10.108.0.0/24", 8, nil)
			f.reconcile(first, "p")
			f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.108.0.1-10.108.0.8"}})
			f.updateIPPool("p", func(s *v1alpha1.IPPoolSpec) { s.PerNodeBlockSize = 4 })
			f.reconcile(first, "p")
			f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.108.0.1-10.108.0.4", Held: []string{"10.108.0.7"}}})
			f.reconcile(first, "p")
			mem.AddLiveReports(60000, 38)
			f.save(mem)
			l, kept := f.lease()
			if l == nil {
				t.Fatal("no Lease written")
			}
			parts, err := poolcontroller.DecodeParts(l.Annotations[poolcontroller.MemoryAnnotation])
			if err != nil {
				t.Fatal(err)
			}
			all := maps.Clone(kept)
			var leases coordinationv1.LeaseList
			if err := f.c.List(t.Context(), &leases, client.InNamespace(f.ns)); err != nil {
				t.Fatal(err)
			}
			for _, x := range leases.Items {
				v := x.Annotations[poolcontroller.MemoryAnnotation]
				if len(v) > 200<<10 {
					t.Errorf("Lease %s holds %d bytes, over the annotation's bound", x.Name, len(v))
				}
				if strings.HasPrefix(x.Name, fmt.Sprintf("%s-%d-", poolcontroller.MemoryLeaseName, parts)) && parts > 0 {
					r, err := poolcontroller.DecodeMemory(v)
					if err != nil {
						t.Fatalf("Lease %s: %v", x.Name, err)
					}
					maps.Copy(all, r)
				}
			}
			want := 60001
			if maxParts == 2 {
				want = 1 // past MaxParts: the empty reports go
			}
			if len(all) != want {
				t.Errorf("the Leases (%d parts) keep %d reports, want %d", parts, len(all), want)
			}
			// All of it in parts (its covered block too); past MaxParts, what counts.
			wantA := `{"p":{"block":"10.108.0.1-10.108.0.4","held":["10.108.0.7"]}}`
			if maxParts == 2 {
				wantA = `{"p":{"held":["10.108.0.7"]}}`
			}
			if got := all[f.nodeName("a")]; got != wantA {
				t.Errorf("the Lease keeps %q of a's report, want %q", got, wantA)
			}
			if (parts > 0) != (maxParts == 0) {
				t.Errorf("the Lease names %d parts", parts)
			}
			t.Logf("%d parts; the Lease's annotation: %d bytes", parts, len(l.Annotations[poolcontroller.MemoryAnnotation]))
			// A restarted controller reads every part and still keeps a's orphan
			// from a new node.
			again, mem2 := f.restarted(true)
			f.node("b", true, nil)
			f.reconcile(again, "p")
			if maxParts == 0 && len(mem2.Nodes()) < 60001 {
				t.Errorf("the restarted controller knows %d reports, want every one of the 60,001 kept", len(mem2.Nodes()))
			}
			for _, b := range f.ipPool("p").Status.Allocations {
				if b.NodeName == f.nodeName("b") && b.StartIP == "10.108.0.5" {
					t.Errorf("b got a's orphan's block: %+v", b)
				}
			}
			if maxParts == 0 {
				// One node's report changes: one part is written again, not all.
				versions := func() map[string]string {
					var ls coordinationv1.LeaseList
					if err := f.c.List(t.Context(), &ls, client.InNamespace(f.ns)); err != nil {
						t.Fatal(err)
					}
					out := map[string]string{}
					for _, x := range ls.Items {
						if strings.HasPrefix(x.Name, fmt.Sprintf("%s-%d-", poolcontroller.MemoryLeaseName, parts)) {
							out[x.Name] = x.ResourceVersion
						}
					}
					return out
				}
				f.reconcile(first, "p") // the made-up nodes are not Nodes: seen gone once
				f.save(mem)
				before := versions()
				f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.108.0.1-10.108.0.4", Held: []string{"10.108.0.7", "10.108.0.8"}}})
				f.reconcile(first, "p")
				f.save(mem)
				changed := 0
				for name, rv := range versions() {
					if before[name] != rv {
						changed++
					}
				}
				if len(before) != parts || changed != 1 {
					t.Errorf("%d of %d parts written again for one node's report, want 1", changed, len(before))
				}
			}
		})
	}
}

// TestFailingSaveWritesNoPartAgain: the Lease's head cannot be written (a 500, a
// quota, too large); the part Leases were written. Saves that follow with nothing
// changed write the head again, not every part: before, five saves wrote every
// part five times (issue 44, item 6).
func TestFailingSaveWritesNoPartAgain(t *testing.T) {
	f := newFixture(t, time.Minute)
	f.node("a", true, nil)
	first, mem := f.restarted(true)
	f.newIPPool("p", "10.109.0.0/24", 8, nil)
	f.reconcile(first, "p")
	mem.AddLiveReports(60000, 39)
	var headWrites, partWrites atomic.Int64
	count := func(obj client.Object) error {
		if obj.GetName() == poolcontroller.MemoryLeaseName {
			headWrites.Add(1)
			return apierrors.NewInternalError(errors.New("injected: the head Lease cannot be written"))
		}
		if strings.HasPrefix(obj.GetName(), poolcontroller.MemoryLeaseName+"-") {
			partWrites.Add(1)
		}
		return nil
	}
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: f.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	mem.Client = interceptor.NewClient(wc, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := count(obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := count(obj); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	for range 5 {
		if err := mem.Save(t.Context()); err == nil {
			t.Fatal("a save whose head Lease cannot be written succeeded")
		}
	}
	parts := partWrites.Load()
	if headWrites.Load() != 5 {
		t.Fatalf("%d writes of the head in 5 saves, want 5", headWrites.Load())
	}
	if parts == 0 || parts > 16 {
		t.Fatalf("%d part writes in 5 saves that failed at the head with nothing changed, want each part once", parts)
	}
	t.Logf("5 failed saves: %d part writes", parts)
}
