package poolcontroller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// A pool event re-checks only the pools of the reconciler's kind whose network
// overlaps the event's pool: pools created together do not each enqueue all the
// others again, while an overlap that starts or ends is still seen.
func TestPoolEventsEnqueueOnlyOverlappingPools(t *testing.T) {
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	ip := func(name, subnet string) *v1alpha1.IPPool {
		return &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
			Spec: v1alpha1.IPPoolSpec{Subnet: subnet, PerNodeBlockSize: 8}}
	}
	cidr := func(name, network string) *v1alpha1.CIDRPool {
		return &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
			Spec: v1alpha1.CIDRPoolSpec{CIDR: network, PerNodeNetworkPrefix: 28}}
	}
	a, b, c, bad := ip("a", "10.0.0.0/16"), ip("b", "10.1.0.0/16"), ip("c", "10.0.128.0/17"), ip("bad", "nonsense")
	x, y := cidr("x", "10.1.0.0/24"), cidr("y", "10.9.0.0/16")
	other := ip("other-ns", "10.0.0.0/8")
	other.Namespace = "elsewhere"
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(a, b, c, bad, x, y, other).Build()
	names := func(r *Reconciler, o client.Object) []string {
		var out []string
		for _, req := range r.overlappingPools(t.Context(), "ns", o) {
			out = append(out, req.Name)
		}
		slices.Sort(out)
		return out
	}
	ipr := &Reconciler{Client: cl, Kind: v1alpha1.KindIPPool}
	cidrr := &Reconciler{Client: cl, Kind: v1alpha1.KindCIDRPool}
	for _, tc := range []struct {
		what string
		r    *Reconciler
		o    client.Object
		want []string
	}{
		{"IPPool a, IPPools", ipr, a, []string{"c"}},
		{"IPPool b, IPPools", ipr, b, nil},
		{"CIDRPool x, IPPools", ipr, x, []string{"b"}},
		{"IPPool b, CIDRPools", cidrr, b, []string{"x"}},
		{"IPPool of a new network, IPPools", ipr, ip("new", "10.7.0.0/16"), nil},
		{"IPPool whose network does not parse", ipr, bad, nil},
		{"IPPool of the whole 10/8", ipr, ip("wide", "10.0.0.0/8"), []string{"a", "b", "c"}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			if got := names(tc.r, tc.o); !slices.Equal(got, tc.want) {
				t.Errorf("enqueued %v, want %v", got, tc.want)
			}
		})
	}
}

// A daemon that rewrites its report in a loop costs each pool one reconcile per
// reportDelay, not one per write: 50 report changes queue each pool once, after
// the delay. A label change still queues the pools it concerns at once.
func TestReportLoopQueuesEachPoolOnce(t *testing.T) {
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	pools := []client.Object{
		&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}, Spec: v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/16", PerNodeBlockSize: 8}},
		&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "ns"}, Spec: v1alpha1.IPPoolSpec{Subnet: "10.1.0.0/16", PerNodeBlockSize: 8}},
	}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pools...).Build()
	r := &Reconciler{Client: cl, Kind: v1alpha1.KindIPPool}
	h := r.nodeHandler("ns")
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	node := func(report string, labels map[string]string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels,
			Annotations: map[string]string{v1alpha1.HeldAnnotation: report}}}
	}
	for i := range 50 {
		old, cur := node(fmt.Sprintf(`{"a":{"held":["10.0.9.%d-10.0.9.%d"]}}`, i, i), nil),
			node(fmt.Sprintf(`{"a":{"held":["10.0.9.%d-10.0.9.%d"]}}`, i+1, i+1), nil)
		h.Update(t.Context(), event.UpdateEvent{ObjectOld: old, ObjectNew: cur}, q)
	}
	if n := q.Len(); n != 0 {
		t.Fatalf("%d pools queued at once by report changes, want none before the delay", n)
	}
	time.Sleep(reportDelay + 300*time.Millisecond)
	if n := q.Len(); n != len(pools) {
		t.Fatalf("%d items queued after 50 report changes, want each of the %d pools once", n, len(pools))
	}
	for q.Len() > 0 {
		item, _ := q.Get()
		q.Done(item)
		q.Forget(item)
	}
	h.Update(t.Context(), event.UpdateEvent{ObjectOld: node("{}", nil), ObjectNew: node(`{"a":{}}`, map[string]string{"x": "y"})}, q)
	if n := q.Len(); n != len(pools) {
		t.Fatalf("a report and a label changed together queued %d pools at once, want %d", n, len(pools))
	}
}
