package ipamcontroller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// runController runs the controller with opts until the test ends or stop is
// called; stop waits for it to end.
func runController(t *testing.T, opts *ipamcontroller.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.NewWithOptions(t, testr.Options{Verbosity: 0})))
	done := make(chan error, 1)
	go func() { done <- ipamcontroller.Run(ctx, opts) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the controller did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// nodeBlocks returns every NodeIPAM's blocks as "kind/pool=range", by node.
func nodeBlocks(t *testing.T, c client.Client, ns string) map[string][]string {
	t.Helper()
	var list nodeipamv1.NodeIPAMList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, o := range list.Items {
		out[o.Name] = []string{}
		for _, b := range o.Spec.Blocks {
			r := b.StartIP + "-" + b.EndIP
			if b.Kind == v1alpha1.KindCIDRPool {
				r = b.Prefix + "@" + b.Gateway
			}
			out[o.Name] = append(out[o.Name], b.Kind+"/"+b.Pool+"="+r)
		}
	}
	return out
}

// checkDisjoint fails when two nodes' blocks of one pool overlap.
func checkDisjoint(t *testing.T, blocks map[string][]string) {
	t.Helper()
	owner := map[string]string{}
	for node, bs := range blocks {
		for _, b := range bs {
			if o, ok := owner[b]; ok {
				t.Fatalf("block %s is in the NodeIPAMs of both %s and %s", b, o, node)
			}
			owner[b] = node
		}
	}
}

// TestNodeIPAMDelivery runs the controller with a threshold of 10 blocks over 13
// nodes: every node's NodeIPAM holds its two blocks, the pools' status lists none
// (blocksIn NodeIPAM, AllocationsListed False, an event), a restart keeps every
// block, a NodeIPAM edited or deleted by hand is written back, a joining node
// changes no other node's NodeIPAM, and below the threshold the status lists the
// blocks again, as the NodeIPAMs do.
func TestNodeIPAMDelivery(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	const ns = "default"
	opts := ipamcontroller.NewOptions()
	opts.RestConfig = cp.Config
	opts.PoolsNamespace, opts.LeaderElectNamespace = ns, ns
	opts.MetricsBindAddress, opts.HealthProbeBindAddress = "0", "0"
	opts.ReleaseGracePeriod = 0
	// A gone node's record lists its blocks as retired until they may be
	// pruned: at once here.
	opts.MinGrantAge = time.Millisecond
	opts.StatusAllocationsMaxNodes = 10

	mkNode := func(i int) string {
		name := fmt.Sprintf("gpu-%02d", i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nic.hwipam.io/rail.r": "r0"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		return name
	}
	for i := range 14 {
		mkNode(i)
	}
	ip := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: ns, Labels: map[string]string{v1alpha1.LabelRail: "r0"}},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.7.0.0/16", PerNodeBlockSize: 16, Gateway: "10.7.0.1", NodeSelector: railSelector("r0")}}
	cidr := &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0c", Namespace: ns},
		Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.9.0.0/16", PerNodeNetworkPrefix: 24, GatewayIndex: new(int32(1)), NodeSelector: railSelector("r0")}}
	for _, o := range []client.Object{ip, cidr} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	stop := runController(t, opts)

	complete := func(want int) func() (bool, string) {
		return func() (bool, string) {
			bs := nodeBlocks(t, c, ns)
			full := 0
			for _, b := range bs {
				if len(b) == 2 {
					full++
				}
			}
			return full == want && len(bs) == want, fmt.Sprintf("%d of %d NodeIPAMs with 2 blocks: %v", full, want, bs)
		}
	}
	eventually(t, "every node's NodeIPAM with its 2 blocks", complete(14))
	initial := nodeBlocks(t, c, ns)
	// gpu-00 goes: its blocks are free, and the others' are not those a plan
	// from nothing would give (which a restart must not make).
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-00"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "gpu-00's NodeIPAM gone", complete(13))
	first := nodeBlocks(t, c, ns)
	checkDisjoint(t, first)
	for node, bs := range first {
		if !slices.Equal(bs, initial[node]) {
			t.Fatalf("%s's blocks changed when gpu-00 left: %v, before %v", node, bs, initial[node])
		}
	}
	for name, bs := range first {
		if !strings.HasPrefix(bs[0], "CIDRPool/rail0c=10.9.") || !strings.HasPrefix(bs[1], "IPPool/rail0=10.7.") {
			t.Fatalf("NodeIPAM %s: %v", name, bs)
		}
	}
	// The status: counts and conditions, no list, and where the blocks are.
	omitted := func() (bool, string) {
		var p v1alpha1.IPPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(ip), &p); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionListed)
		ok := len(p.Status.Allocations) == 0 && p.Status.BlocksIn == v1alpha1.BlocksInNodeIPAM && p.Status.AllocatedNodes == 13 &&
			cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == "AboveThreshold"
		return ok, fmt.Sprintf("allocations %d, blocksIn %q, allocated %d, condition %+v", len(p.Status.Allocations),
			p.Status.BlocksIn, p.Status.AllocatedNodes, cond)
	}
	eventually(t, "the IPPool's status without its list", omitted)
	eventually(t, "an AllocationsOmitted event", func() (bool, string) {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "AllocationsOmitted" && e.Regarding.Name == "rail0" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	})
	// Each NodeIPAM names its pool by UID; the PoolSpecs carry the pool's spec
	// once, without the selector, and its rail.
	var one nodeipamv1.NodeIPAM
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gpu-03"}, &one); err != nil {
		t.Fatal(err)
	}
	if b := one.Spec.Blocks[1]; b.PoolUID != ip.UID || b.Pool != "rail0" {
		t.Fatalf("gpu-03's IPPool block: %+v", b)
	}
	if !nodeipamv1.OwnedByController(&one) {
		t.Fatalf("gpu-03's NodeIPAM is not the controller's: %+v", one.ManagedFields)
	}
	var specs nodeipamv1.PoolSpecs
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeipamv1.PoolSpecsName}, &specs); err != nil {
		t.Fatal(err)
	}
	if len(specs.Spec.Pools) != 2 || !nodeipamv1.OwnedByController(&specs) {
		t.Fatalf("PoolSpecs: %+v", specs.Spec.Pools)
	}
	if e := specs.Spec.Pools[1]; e.IPPool == nil || e.IPPool.Gateway != "10.7.0.1" || e.IPPool.NodeSelector != nil ||
		e.Rail != "r0" || e.PoolUID != ip.UID {
		t.Fatalf("the IPPool's PoolSpecs entry: %+v", e)
	}
	// A spec edit (a route) writes the PoolSpecs, not one NodeIPAM.
	before := map[string]string{}
	var all nodeipamv1.NodeIPAMList
	if err := c.List(ctx, &all, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, o := range all.Items {
		before[o.Name] = o.ResourceVersion
	}
	var cur v1alpha1.IPPool
	if err := c.Get(ctx, client.ObjectKeyFromObject(ip), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Routes = []v1alpha1.Route{{Dst: "10.8.0.0/16"}}
	if err := c.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the route in the PoolSpecs", func() (bool, string) {
		var s nodeipamv1.PoolSpecs
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeipamv1.PoolSpecsName}, &s); err != nil {
			return false, err.Error()
		}
		e := s.Spec.Pools[1]
		return e.IPPool != nil && len(e.IPPool.Routes) == 1, fmt.Sprintf("%+v", e)
	})
	time.Sleep(time.Second)
	if err := c.List(ctx, &all, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, o := range all.Items {
		if before[o.Name] != o.ResourceVersion {
			t.Fatalf("a route edit wrote %s's NodeIPAM", o.Name)
		}
	}

	// A restart keeps every block: the status lists none, the NodeIPAMs hold them.
	stop()
	stop = runController(t, opts)
	time.Sleep(2 * time.Second)
	eventually(t, "the same blocks after a restart", func() (bool, string) {
		now := nodeBlocks(t, c, ns)
		return fmt.Sprint(now) == fmt.Sprint(first), fmt.Sprint(now)
	})

	// Edited by hand (another field manager): written back.
	edited := one.DeepCopy()
	edited.Spec.Blocks[1].StartIP, edited.Spec.Blocks[1].EndIP = "10.7.200.0", "10.7.200.15"
	if err := c.Update(ctx, edited, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "gpu-03's NodeIPAM written back", func() (bool, string) {
		var o nodeipamv1.NodeIPAM
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gpu-03"}, &o); err != nil {
			return false, err.Error()
		}
		return nodeipamv1.OwnedByController(&o) && o.Spec.Blocks[1].StartIP == one.Spec.Blocks[1].StartIP,
			fmt.Sprintf("%+v owned %v", o.Spec.Blocks[1], nodeipamv1.OwnedByController(&o))
	})
	// Deleted by hand: created again, the same.
	if err := c.Delete(ctx, &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-05"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "gpu-05's NodeIPAM created again", func() (bool, string) {
		now := nodeBlocks(t, c, ns)
		return slices.Equal(now["gpu-05"], first["gpu-05"]), fmt.Sprint(now["gpu-05"])
	})

	// A node that joins sends another node's NodeIPAM nothing.
	var list nodeipamv1.NodeIPAMList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &nodeipamv1.NodeIPAMList{}, client.InNamespace(ns), client.MatchingFields{"metadata.name": "gpu-01"},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	mkNode(14)
	eventually(t, "the new node's NodeIPAM", complete(14))
	checkDisjoint(t, nodeBlocks(t, c, ns))
	select {
	case ev := <-w.ResultChan():
		t.Fatalf("gpu-01's NodeIPAM changed when gpu-14 joined: %s %+v", ev.Type, ev.Object)
	case <-time.After(2 * time.Second):
	}

	// Below the threshold: the status lists the blocks again, as the NodeIPAMs do.
	for i := range 5 {
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%02d", 14-i)}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the status listing the 9 blocks the NodeIPAMs hold", func() (bool, string) {
		var p v1alpha1.IPPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(ip), &p); err != nil {
			return false, err.Error()
		}
		bs := nodeBlocks(t, c, ns)
		var fromStatus, fromObjects []string
		for _, a := range p.Status.Allocations {
			fromStatus = append(fromStatus, a.NodeName+":IPPool/rail0="+a.StartIP+"-"+a.EndIP)
		}
		for node, b := range bs {
			for _, x := range b {
				if strings.HasPrefix(x, "IPPool/") {
					fromObjects = append(fromObjects, node+":"+x)
				}
			}
		}
		slices.Sort(fromStatus)
		slices.Sort(fromObjects)
		return p.Status.BlocksIn == v1alpha1.BlocksInStatus && len(fromStatus) == 9 && slices.Equal(fromStatus, fromObjects) && len(bs) == 9,
			fmt.Sprintf("blocksIn %q status %v objects %v", p.Status.BlocksIn, fromStatus, fromObjects)
	})
	for i := range 5 {
		var o nodeipamv1.NodeIPAM
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("gpu-%02d", 14-i)}, &o)
		if !apierrors.IsNotFound(err) {
			t.Fatalf("the NodeIPAM of deleted node gpu-%02d: %v", 14-i, err)
		}
	}
}

// TestNodeIPAMWhenTheListDoesNotFit: a pool under the threshold whose list is
// too large for etcd anyway (here etcd takes 24 kB; long node names or IPv6 do
// it at 10,000 nodes) lists no block, says why, and every node gets its block
// through its NodeIPAM, where the controller used to retry the refused status
// for ever.
func TestNodeIPAMWhenTheListDoesNotFit(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{EtcdMaxRequestBytes: 24 << 10})
	c := cp.Client
	ctx := t.Context()
	const ns, nodes = "default", 400
	opts := ipamcontroller.NewOptions()
	opts.RestConfig = cp.Config
	opts.PoolsNamespace, opts.LeaderElectNamespace = ns, ns
	opts.MetricsBindAddress, opts.HealthProbeBindAddress = "0", "0"
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-node-with-a-long-name-%04d", i),
			Labels: map[string]string{"nic.hwipam.io/rail.r": "r0"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	ip := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.7.0.0/16", PerNodeBlockSize: 16, NodeSelector: railSelector("r0")}}
	if err := c.Create(ctx, ip); err != nil {
		t.Fatal(err)
	}
	runController(t, opts)
	eventually(t, "every node's NodeIPAM with its block", func() (bool, string) {
		bs := nodeBlocks(t, c, ns)
		full := 0
		for _, b := range bs {
			if len(b) == 1 {
				full++
			}
		}
		return full == nodes, fmt.Sprintf("%d of %d", full, nodes)
	})
	checkDisjoint(t, nodeBlocks(t, c, ns))
	eventually(t, "the status without its list, saying why", func() (bool, string) {
		var p v1alpha1.IPPool
		if err := c.Get(ctx, client.ObjectKeyFromObject(ip), &p); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionListed)
		return p.Status.BlocksIn == v1alpha1.BlocksInNodeIPAM && len(p.Status.Allocations) == 0 && p.Status.AllocatedNodes == nodes &&
				cond != nil && strings.Contains(cond.Message, "too large to store"),
			fmt.Sprintf("blocksIn %q, %d listed, condition %+v", p.Status.BlocksIn, len(p.Status.Allocations), cond)
	})
}
