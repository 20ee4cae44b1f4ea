package poolcontroller_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// A pool whose status outgrows etcd's request limit cannot be written. The
// controller says so on the pool (a Warning event, once an episode, again after
// an hour) and in a metric, keeps failing the reconcile so that it is retried, does
// not send the same status again before its backoff has passed, and recovers at
// once when the nodeSelector is narrowed.
func TestStatusTooLargeEvent(t *testing.T) {
	tcp := startTooLarge(t)
	ctx := t.Context()
	const ns, name, narrow = tooLargeNS, tooLargePool, tooLargeNarrow

	// The recorder ipam-controller uses (events.k8s.io), counted on the way.
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: tcp.Clientset.EventsV1()})
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broadcaster.Shutdown)
	rec := &countingRecorder{EventRecorder: broadcaster.NewRecorder(tcp.Client.Scheme(), "ipam-controller")}
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	sw := &countingWriter{StatusWriter: newStatusWriter(t, tcp)}
	r := &poolcontroller.Reconciler{Client: tcp.Client, StatusWriter: sw, Recorder: rec,
		Kind: v1alpha1.KindIPPool, Now: clock.Now}
	req := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}

	// Every reconcile fails (and is retried with backoff); one event only.
	for range 3 {
		_, err := r.Reconcile(ctx, req)
		if err == nil || !strings.Contains(err.Error(), "etcdserver: request is too large") {
			t.Fatalf("reconcile of a pool too large to store = %v, want etcd's \"request is too large\"", err)
		}
		clock.Advance(time.Minute)
	}
	if got := rec.count(poolcontroller.ReasonStatusTooLarge); got != 1 {
		t.Errorf("%d StatusTooLarge events after 3 failed writes, want 1", got)
	}
	wantTooLargeMetric(t, ns, name, 1)
	ev := waitEvent(t, tcp, ns, poolcontroller.ReasonStatusTooLarge)
	t.Logf("%s %s: %s", ev.Type, ev.Reason, ev.Note)
	if ev.Type != corev1.EventTypeWarning || ev.Regarding.Kind != v1alpha1.KindIPPool || ev.Regarding.Name != name {
		t.Errorf("event %s about %s %s, want a Warning about IPPool %s", ev.Type, ev.Regarding.Kind, ev.Regarding.Name, name)
	}
	for _, part := range []string{"selects 400 node(s)", "--max-request-bytes", "Split the pool", "narrow its nodeSelector",
		"perNodeBlockSize does not help", "Refused with: etcdserver: request is too large"} {
		if !strings.Contains(ev.Note, part) {
			t.Errorf("event note %q lacks %q", ev.Note, part)
		}
	}
	if stored := getIPPool(t, tcp, ns, name); len(stored.Status.Allocations) != 0 {
		t.Errorf("%d allocations stored, want none", len(stored.Status.Allocations))
	}

	// Still too large an hour later: the event again, so that it outlives the API
	// server's event TTL.
	clock.Advance(time.Hour)
	if _, err := r.Reconcile(ctx, req); err == nil {
		t.Fatal("reconcile of a pool too large to store succeeded")
	}
	if got := rec.count(poolcontroller.ReasonStatusTooLarge); got != 2 {
		t.Errorf("%d StatusTooLarge events after an hour, want 2", got)
	}

	// Within the backoff the same status, or a larger one, is not sent again; the
	// reconcile still fails with the refusal.
	sent := sw.sent.Load()
	wantHeld := func(what string) {
		t.Helper()
		_, err := r.Reconcile(ctx, req)
		if err == nil || !strings.Contains(err.Error(), "etcdserver: request is too large") {
			t.Fatalf("reconcile %s = %v, want etcd's \"request is too large\"", what, err)
		}
		if got := sw.sent.Load() - sent; got != 0 {
			t.Errorf("%d status writes %s, want 0", got, what)
		}
	}
	wantHeld("right after a refused one")
	if err := tcp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-extra",
		Labels: map[string]string{testLabel: "all"}}}); err != nil {
		t.Fatal(err)
	}
	wantHeld("with one more node, right after a refused one")
	wantTooLargeMetric(t, ns, name, 1)

	// Narrowed, within the backoff: the smaller status is written at once, the metric
	// drops, a Normal event says so.
	p := getIPPool(t, tcp, ns, name)
	p.Spec.NodeSelector = labelSelector(testLabel+"-rail", "0")
	if err := tcp.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatalf("reconcile after narrowing the nodeSelector: %v", err)
	}
	if got := sw.sent.Load() - sent; got != 1 {
		t.Errorf("%d status writes after narrowing the nodeSelector within the backoff, want 1", got)
	}
	if stored := getIPPool(t, tcp, ns, name); len(stored.Status.Allocations) != narrow {
		t.Errorf("%d allocations stored, want %d", len(stored.Status.Allocations), narrow)
	}
	wantTooLargeMetric(t, ns, name, 0)
	if got := rec.count(poolcontroller.ReasonStatusFits); got != 1 {
		t.Errorf("%d StatusFits events, want 1", got)
	}
	waitEvent(t, tcp, ns, poolcontroller.ReasonStatusFits)
}

// With node churn, a pool too large to store is not sent again on every Node
// event: the controller sends it at most once per backoff, and a narrowed
// nodeSelector is still written at once.
func TestStatusTooLargeNodeChurn(t *testing.T) {
	tcp := startTooLarge(t)
	ctx, cancel := context.WithCancel(t.Context())
	mgr, err := ctrl.NewManager(tcp.Config, ctrl.Options{
		Scheme:                 tcp.Client.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	sw := &countingWriter{StatusWriter: newStatusWriter(t, tcp)}
	r := &poolcontroller.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), StatusWriter: sw,
		Kind: v1alpha1.KindIPPool}
	if err := r.SetupWithManager(mgr, tooLargeNS, 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	waitFor(t, "the first refused write", func() bool { return sw.refused.Load() > 0 })
	first := time.Now()

	// A node the pool selects comes and goes, 10 events a second for 5 seconds.
	churn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-churn"}}
	if err := tcp.Client.Create(ctx, churn); err != nil {
		t.Fatal(err)
	}
	nodeEvents := 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); nodeEvents++ {
		if nodeEvents%2 == 0 {
			churn.Labels = map[string]string{testLabel: "all"}
		} else {
			churn.Labels = nil
		}
		if err := tcp.Client.Update(ctx, churn); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	// One refusal, then at most one more per backoff (1s, 2s, 4s, ...).
	elapsed, limit := time.Since(first), int32(1)
	for d, b := time.Duration(0), time.Second; d < elapsed; d, b = d+b, 2*b {
		limit++
	}
	refused := sw.refused.Load()
	t.Logf("%d node events; %d status writes refused in %s", nodeEvents, refused, elapsed.Round(time.Millisecond))
	if refused > limit {
		t.Errorf("%d status writes refused as too large in %s of node churn (%d node events), want at most %d",
			refused, elapsed.Round(time.Millisecond), nodeEvents, limit)
	}

	// Narrowed: the smaller status is written at once, whatever the backoff.
	narrowed := time.Now()
	p := getIPPool(t, tcp, tooLargeNS, tooLargePool)
	p.Spec.NodeSelector = labelSelector(testLabel+"-rail", "0")
	if err := tcp.Client.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the narrowed status", func() bool {
		return len(getIPPool(t, tcp, tooLargeNS, tooLargePool).Status.Allocations) == tooLargeNarrow
	})
	t.Logf("narrowed status written after %s", time.Since(narrowed).Round(time.Millisecond))
	wantTooLargeMetric(t, tooLargeNS, tooLargePool, 0)
}

// The pool of the too-large tests: in tooLargeNS, selecting tooLargeNodes nodes,
// tooLargeNarrow of which carry the rail label.
const tooLargeNS, tooLargePool, tooLargeNodes, tooLargeNarrow = "toolarge", "big", 400, 10

// startTooLarge starts a control plane whose etcd refuses objects over 64 KiB
// and creates a pool too large for it: 400 nodes with long names do what 20,000
// do at the default 1.5 MiB.
func startTooLarge(t *testing.T) *harness.ControlPlane {
	t.Helper()
	tcp := harness.StartControlPlane(t, harness.ControlPlaneOptions{EtcdMaxRequestBytes: 64 << 10})
	ctx := t.Context()
	if err := tcp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tooLargeNS}}); err != nil {
		t.Fatal(err)
	}
	// 197-character names: some 100 kB of status, past 64 KiB, and not past it
	// with tooLargeNarrow nodes.
	long := strings.Repeat("x", 60) + "." + strings.Repeat("y", 60) + "." + strings.Repeat("z", 60)
	for i := range tooLargeNodes {
		labels := map[string]string{testLabel: "all"}
		if i < tooLargeNarrow {
			labels[testLabel+"-rail"] = "0"
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d.%s", i, long), Labels: labels}}
		if err := tcp.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: tooLargePool, Namespace: tooLargeNS},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/8", PerNodeBlockSize: 16, NodeSelector: labelSelector(testLabel, "all")}}
	if err := tcp.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	return tcp
}

func labelSelector(key, value string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{value}}}}}}
}

// countingWriter counts the status writes it passes on, and those refused as too
// large.
type countingWriter struct {
	poolcontroller.StatusWriter
	sent, refused atomic.Int32
}

func (w *countingWriter) UpdateStatus(ctx context.Context, pool client.Object) (string, error) {
	w.sent.Add(1)
	rv, err := w.StatusWriter.UpdateStatus(ctx, pool)
	if err != nil && strings.Contains(err.Error(), "request is too large") {
		w.refused.Add(1)
	}
	return rv, err
}

// waitFor waits up to 30 seconds for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 30s", what)
		}
	}
}

// A 413 from the API server's own limit on a request body (3 MiB, which 40,000
// nodes would be needed to reach) counts as too large too.
func TestStatusTooLargeRequestEntity(t *testing.T) {
	f := newFixture(t, 0)
	f.node("a", true, nil)
	f.newIPPool("p", "10.98.0.0/24", 8, nil)
	serverWriter := f.ip.StatusWriter
	f.ip.StatusWriter = refusingWriter{apierrors.NewRequestEntityTooLargeError("limit is 3145728")}
	if _, err := f.ip.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: f.ns, Name: "p"}}); err == nil {
		t.Fatal("reconcile succeeded with a status writer that refuses every write")
	}
	wantTooLargeMetric(t, f.ns, "p", 1)
	f.ip.StatusWriter = serverWriter
	f.clock.Advance(time.Second) // past the refusal's backoff: the same status is sent again
	f.reconcile(f.ip, "p")
	wantTooLargeMetric(t, f.ns, "p", 0)
	got := f.events()
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning StatusTooLarge the pool's status could not be written: "+
		"the pool selects 1 node(s)") || !strings.Contains(got[0], "Refused with: Request entity too large: limit is 3145728") ||
		!strings.HasPrefix(got[1], "Normal StatusFits ") {
		t.Errorf("events %q, want StatusTooLarge with the 413's message, then StatusFits", got)
	}
}

type refusingWriter struct{ err error }

func (w refusingWriter) UpdateStatus(context.Context, client.Object) (string, error) {
	return "", w.err
}

// countingRecorder counts events by reason and passes them on.
type countingRecorder struct {
	events.EventRecorder
	mu       sync.Mutex
	byReason map[string]int
}

func (r *countingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.mu.Lock()
	if r.byReason == nil {
		r.byReason = map[string]int{}
	}
	r.byReason[reason]++
	r.mu.Unlock()
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func (r *countingRecorder) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byReason[reason]
}

func getIPPool(t *testing.T, tcp *harness.ControlPlane, ns, name string) *v1alpha1.IPPool {
	t.Helper()
	var p v1alpha1.IPPool
	if err := tcp.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// waitEvent waits for the events.k8s.io Event of a reason in a namespace.
func waitEvent(t *testing.T, tcp *harness.ControlPlane, ns, reason string) eventsv1.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := tcp.Clientset.EventsV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == reason {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in namespace %s after 30s (%d events)", reason, ns, len(list.Items))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantTooLargeMetric waits (up to 10 s) for hwipam_pool_status_too_large of
// an IPPool to be want: the reconciler sets it once the status write returns,
// which comes after the API server has the status the test may have seen.
func wantTooLargeMetric(t *testing.T, ns, name string, want float64) {
	t.Helper()
	var got string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		v, ok := tooLargeMetric(t, ns, name)
		if ok && v == want {
			return
		}
		got = "none"
		if ok {
			got = fmt.Sprint(v)
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Errorf("hwipam_pool_status_too_large{namespace=%q,pool=%q} = %s after 10 s, want %v", ns, name, got, want)
}

// tooLargeMetric reads hwipam_pool_status_too_large of an IPPool.
func tooLargeMetric(t *testing.T, ns, name string) (float64, bool) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "hwipam_pool_status_too_large" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["kind"] == v1alpha1.KindIPPool && labels["namespace"] == ns && labels["pool"] == name {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}
