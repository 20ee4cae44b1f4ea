package privilege

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// TestControllerWithItsOwnRights runs the real ipam-controller with a token of its
// own service account and nothing but deploy/'s rights: it wins leader election
// (a Lease and a core event in kube-system), gives pools blocks (status updates)
// and records a pool event (events.k8s.io), and nothing is refused.
func TestControllerWithItsOwnRights(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	for _, n := range []string{"node-a", "node-b"} {
		e.createNode(t, n)
	}
	logs := start(t, harness.BuildBinary(t, "./cmd/ipam-controller"), "--kubeconfig", e.tokenKubeconfig(t, e.tokenFor(t, controlSA, nil)),
		"--ippools-namespace", ns, "--leader-elect=true", "--leader-elect-namespace", ns,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0")
	// A pool with a block for each node, and one with room for one block of the two.
	pool := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.30.0.0/24", PerNodeBlockSize: 8}}
	small := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.31.0.0/29", PerNodeBlockSize: 6}}
	for _, p := range []*v1alpha1.IPPool{pool, small} {
		if err := e.c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "the leader's Lease, a block, and both kinds of event", func() error {
		var lease coordinationv1.Lease
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ipamcontroller.LeaderElectionID}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("the Lease has no holder")
		}
		var p v1alpha1.IPPool
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			return err
		}
		if len(p.Status.Allocations) != 2 {
			return fmt.Errorf("blocks %v", p.Status.Allocations)
		}
		var events eventsv1.EventList
		if err := e.c.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		var poolEvent, leaderEvent bool
		for _, ev := range events.Items {
			poolEvent = poolEvent || ev.Regarding.Name == "small" && ev.Reason == "PoolExhausted"
		}
		var core corev1.EventList
		if err := e.c.List(ctx, &core, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, ev := range core.Items {
			leaderEvent = leaderEvent || ev.Reason == "LeaderElection" && ev.InvolvedObject.Kind == "Lease"
		}
		if !poolEvent || !leaderEvent {
			return fmt.Errorf("events: PoolExhausted %v, LeaderElection %v", poolEvent, leaderEvent)
		}
		return nil
	})
	if s := logs.String(); strings.Contains(strings.ToLower(s), "forbidden") {
		t.Errorf("ipam-controller was refused something:\n%s", harness.LastLines(s, 30))
	}
}
