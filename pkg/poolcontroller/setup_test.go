package poolcontroller

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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
