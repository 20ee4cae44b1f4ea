package poolwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// TestAgainstTheAPIServer drives random creates, status writes (up to 3,000 nodes)
// and deletes of IPPools and CIDRPools through a real API server, watches them from
// the same resourceVersion with client-go's watch and with poolwatch's, and
// requires the same events; a watch from a resourceVersion the server no longer
// has must end with the same 410 Gone; and a controller-runtime cache built with
// CacheOptions must hold what the server holds.
func TestAgainstTheAPIServer(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 1))

	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	const ns = "pools"
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	s := cp.Client.Scheme()
	httpClient, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}

	// The cache, started before anything exists.
	opts, err := CacheOptions(cp.Config, s, ns)
	if err != nil {
		t.Fatal(err)
	}
	opts.Scheme = s
	c, err := ctrlcache.New(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	cacheCtx, stopCache := context.WithCancel(ctx)
	defer stopCache()
	go func() { _ = c.Start(cacheCtx) }()
	for _, obj := range []client.Object{&v1alpha1.IPPool{}, &v1alpha1.CIDRPool{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}

	var list v1alpha1.IPPoolList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	from := metav1.ListOptions{ResourceVersion: list.ResourceVersion}
	type pair struct{ ours, theirs watch.Interface }
	watches := map[string]pair{}
	for _, kind := range []string{v1alpha1.KindIPPool, v1alpha1.KindCIDRPool} {
		w, err := NewWatcher(cp.Config, httpClient, s, kind, ns)
		if err != nil {
			t.Fatal(err)
		}
		ours, err := w.Watch(ctx, from)
		if err != nil {
			t.Fatal(err)
		}
		watches[kind] = pair{ours, clientGoWatch(t, cp.Config, httpClient, s, kind, ns, from)}
	}

	// Random operations; how many events each kind's watch must deliver.
	want := map[string]int{}
	for step := range 40 {
		name := fmt.Sprintf("p%d", r.IntN(4))
		var obj client.Object
		kind := []string{v1alpha1.KindIPPool, v1alpha1.KindCIDRPool}[r.IntN(2)]
		if kind == v1alpha1.KindIPPool {
			obj = &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: v1alpha1.IPPoolSpec{Subnet: fmt.Sprintf("10.%d.0.0/16", r.IntN(200)), PerNodeBlockSize: 4}}
		} else {
			obj = &v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: v1alpha1.CIDRPoolSpec{CIDR: fmt.Sprintf("10.%d.0.0/16", r.IntN(200)), PerNodeNetworkPrefix: 24}}
		}
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		switch {
		case err != nil: // absent: create it
			if err := cp.Client.Create(ctx, obj); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		case r.IntN(4) == 0:
			if err := cp.Client.Delete(ctx, obj); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		default:
			nodes := r.IntN(3000)
			switch p := obj.(type) {
			case *v1alpha1.IPPool:
				p.Status.Allocations = nil
				for i := range nodes {
					p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: fmt.Sprintf("node-%d", i),
						StartIP: fmt.Sprintf("10.1.%d.%d", i/64, i%64*4), EndIP: fmt.Sprintf("10.1.%d.%d", i/64, i%64*4+3)})
				}
				p.Status.SelectedNodes = int32(nodes)
			case *v1alpha1.CIDRPool:
				p.Status.Allocations = nil
				for i := range nodes {
					p.Status.Allocations = append(p.Status.Allocations, v1alpha1.CIDRPoolAllocation{NodeName: fmt.Sprintf("node-%d", i),
						Prefix: fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), Gateway: fmt.Sprintf("10.%d.%d.1", i/256, i%256)})
				}
				p.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Assigned",
					Message: fmt.Sprintf("%d nodes", nodes), LastTransitionTime: metav1.Now()}}
			}
			if err := cp.Client.Status().Update(ctx, obj); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		want[kind]++
	}
	for kind, w := range watches {
		ours := collect(t, w.ours, want[kind])
		theirs := collect(t, w.theirs, want[kind])
		if len(ours) != want[kind] || len(theirs) != want[kind] {
			t.Fatalf("%s: %d events, client-go's watch %d; want %d", kind, len(ours), len(theirs), want[kind])
		}
		for i := range ours {
			if ours[i].Type != theirs[i].Type || !reflect.DeepEqual(ours[i].Object, theirs[i].Object) {
				a, _ := json.Marshal(ours[i].Object)
				b, _ := json.Marshal(theirs[i].Object)
				t.Fatalf("%s event %d:\nours:   %s %s\ntheirs: %s %s", kind, i, ours[i].Type, a, theirs[i].Type, b)
			}
		}
		t.Logf("%s: %d events alike", kind, len(ours))
	}

	// The cache holds what the server holds.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var fromServer, fromCache v1alpha1.IPPoolList
		if err := cp.Client.List(ctx, &fromServer, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if err := c.List(ctx, &fromCache, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if sameVersions(fromServer.Items, fromCache.Items) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s the cache holds %d IPPools, the server %d", len(fromCache.Items), len(fromServer.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// An informer started now, with pools in place, fills its cache through the
	// watch (client-go's WatchListClient: the initial events, then a bookmark that
	// ends them), not through a list; a watch that failed at it would go unnoticed
	// otherwise, as the reflector then lists instead.
	extra := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "initial", Namespace: ns},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.250.0.0/16", PerNodeBlockSize: 4}}
	if err := cp.Client.Create(ctx, extra); err != nil {
		t.Fatal(err)
	}
	var lists atomic.Int32
	inf := opts.NewInformer(&toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			var l v1alpha1.IPPoolList
			err := cp.Client.List(ctx, &l, client.InNamespace(ns), &client.ListOptions{Raw: &opts})
			return &l, err
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			t.Error("the informer watched through the ListWatch it was given, not poolwatch's")
			return nil, errors.New("not this watch")
		},
	}, &v1alpha1.IPPool{}, 0, toolscache.Indexers{})
	infCtx, stopInf := context.WithTimeout(ctx, 30*time.Second)
	defer stopInf()
	go inf.RunWithContext(infCtx)
	if !toolscache.WaitForCacheSync(infCtx.Done(), inf.HasSynced) {
		t.Fatal("the informer did not sync within 30 s")
	}
	var fromServer v1alpha1.IPPoolList
	if err := cp.Client.List(ctx, &fromServer, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var fromInformer []v1alpha1.IPPool
	for _, obj := range inf.GetStore().List() {
		fromInformer = append(fromInformer, *obj.(*v1alpha1.IPPool))
	}
	if !sameVersions(fromServer.Items, fromInformer) {
		t.Fatalf("the informer synced %d IPPools, the server holds %d", len(fromInformer), len(fromServer.Items))
	}
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) && lists.Load() != 0 {
		t.Fatalf("the informer listed %d times: its watch did not deliver the initial events", lists.Load())
	}
	t.Logf("a new informer synced %d IPPools, listing %d times", len(fromInformer), lists.Load())

	// Too old a resourceVersion: the server ends the watch with 410 Gone.
	w, err := NewWatcher(cp.Config, httpClient, s, v1alpha1.KindIPPool, ns)
	if err != nil {
		t.Fatal(err)
	}
	old := metav1.ListOptions{ResourceVersion: "1"}
	ours, err := w.Watch(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	o, th := collect(t, ours, 1), collect(t, clientGoWatch(t, cp.Config, httpClient, s, v1alpha1.KindIPPool, ns, old), 1)
	if len(o) != 1 || len(th) != 1 || o[0].Type != watch.Error || th[0].Type != watch.Error {
		t.Fatalf("a watch from resourceVersion 1: %v, client-go's %v", o, th)
	}
	st, cst := o[0].Object.(*metav1.Status), th[0].Object.(*metav1.Status)
	if st.Code != http.StatusGone || st.Code != cst.Code || st.Reason != cst.Reason || st.Message != cst.Message {
		t.Fatalf("a watch from resourceVersion 1 ends with %d %s %q, client-go's with %d %s %q",
			st.Code, st.Reason, st.Message, cst.Code, cst.Reason, cst.Message)
	}
}

func sameVersions(a, b []v1alpha1.IPPool) bool {
	if len(a) != len(b) {
		return false
	}
	versions := map[string]string{}
	for _, p := range a {
		versions[p.Name] = p.ResourceVersion
	}
	for _, p := range b {
		if versions[p.Name] != p.ResourceVersion {
			return false
		}
	}
	return true
}
