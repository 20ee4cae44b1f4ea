package poolcontroller_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

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

// A controller that restarts still honours what a daemon holds when that
// daemon's Node was re-registered without annotations, its daemon down: found
// by the whole-system test, seed 411767, where the restarted controller gave
// another node a block over an address a node held from a pool deleted and
// re-created. Both orders: the re-registration seen by the controller before it
// restarts (a), and while it was down (c).
func TestHeldReportsOutliveARestart(t *testing.T) {
	f := newFixture(t, time.Minute)
	aReport := `{"p":{"block":"10.93.0.9-10.93.0.12","held":["10.93.0.2"]},"x":{"block":"10.90.0.1-10.90.0.4"}}`
	f.node("a", false, map[string]string{v1alpha1.HeldAnnotation: aReport})
	f.node("c", false, map[string]string{v1alpha1.HeldAnnotation: `{"p":{"held":["10.93.0.6"]},"y":{"block":"10.91.0.1-10.91.0.4"}}`})
	f.node("b", true, nil)
	f.newIPPool("q", "10.94.0.0/24", 4, nil)
	first, mem := f.restarted(true)
	f.save(mem)
	if l, _ := f.lease(); l != nil {
		t.Errorf("the Lease was written before the memory was read from it")
	}
	f.reconcile(first, "q") // sees both reports
	f.save(mem)
	f.deleteNode("a")
	f.node("a", false, nil)
	f.reconcile(first, "q")
	f.save(mem)
	f.deleteNode("c")
	f.node("c", false, nil)
	// Of a (its Node shows no report) the whole report; of c (its Node showed it)
	// the pools it holds addresses outside its block in.
	_, kept := f.lease()
	want := map[string]string{f.nodeName("a"): aReport, f.nodeName("c"): `{"p":{"held":["10.93.0.6"]}}`}
	if !maps.Equal(kept, want) {
		t.Errorf("the Lease keeps %v, want %v", kept, want)
	}

	// Without the Lease, a restarted controller gives b a block over both.
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	forgetful, _ := f.restarted(false)
	f.reconcile(forgetful, "p")
	wantStrings(t, "blocks by a restarted controller without the Lease", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.1-10.93.0.4"})
	if err := f.c.Delete(t.Context(), f.ipPool("p")); err != nil {
		t.Fatal(err)
	}
	f.newIPPool("p", "10.93.0.0/24", 4, nil)
	again, mem2 := f.restarted(true)
	f.reconcile(again, "p")
	wantStrings(t, "blocks by a restarted controller", f.blocksOf(f.ipPool("p")), []string{"b=10.93.0.13-10.93.0.16"})

	before, _ := f.lease()
	f.save(mem2)
	if after, _ := f.lease(); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("a memory that did not change was written again")
	}

	// a's daemon reports again (nothing held outside its block), c's Node has been
	// gone for the grace period: the Lease keeps nothing.
	f.report("a", map[string]v1alpha1.PoolHold{"p": {Block: "10.93.0.21-10.93.0.24"}})
	f.deleteNode("c")
	f.reconcile(again, "p")
	f.clock.Advance(time.Minute)
	f.reconcile(again, "p")
	f.save(mem2)
	if _, kept := f.lease(); len(kept) != 0 {
		t.Errorf("the Lease keeps %v, want nothing", kept)
	}
	if got := mem2.Nodes(); !slices.Equal(got, []string{f.nodeName("a")}) {
		t.Errorf("the memory has reports of %v, want only a's", got)
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
