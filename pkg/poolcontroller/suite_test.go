package poolcontroller_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

// cp is the control plane every test of this package shares. Nodes are
// cluster-scoped, so each test selects only nodes carrying its own label value and
// keeps its pools in a namespace of its own.
var cp *harness.ControlPlane

func TestMain(m *testing.M) {
	var err error
	cp, err = harness.NewControlPlane(harness.ControlPlaneOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if err := cp.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// fixture is one test's world: a namespace, a label value that its nodes carry, a
// clock, and a reconciler per kind using a direct (uncached) client so that every
// Reconcile sees the previous one's writes, and the controller's status writer.
type fixture struct {
	t        *testing.T
	c        client.Client
	ns       string
	label    string
	clock    *fakeClock
	recorder *events.FakeRecorder
	ip, cidr *poolcontroller.Reconciler
}

const testLabel = "test.hwipam.io/suite"

func newFixture(t *testing.T, grace time.Duration) *fixture {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-")
	f := &fixture{t: t, c: cp.Client, ns: name, label: name, clock: &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		recorder: events.NewFakeRecorder(1000)}
	if err := f.c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	sw := newStatusWriter(t, cp)
	mk := func(kind string) *poolcontroller.Reconciler {
		return &poolcontroller.Reconciler{Client: cp.Client, StatusWriter: sw, Recorder: f.recorder, Kind: kind,
			ReleaseGracePeriod: grace, Now: f.clock.Now}
	}
	f.ip, f.cidr = mk(v1alpha1.KindIPPool), mk(v1alpha1.KindCIDRPool)
	return f
}

// newStatusWriter returns the status writer ipam-controller uses, for cp.
func newStatusWriter(t *testing.T, cp *harness.ControlPlane) poolcontroller.StatusWriter {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := poolcontroller.NewStatusWriter(cp.Config, httpClient, cp.Client.Scheme())
	if err != nil {
		t.Fatal(err)
	}
	return sw
}

// selector selects the fixture's nodes.
func (f *fixture) selector() *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: testLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{f.label}}}}}}
}

// node creates a node carrying the fixture's label (when selected) and deletes it at
// the end of the test.
func (f *fixture) node(name string, selected bool, annotations map[string]string) *corev1.Node {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + name, Annotations: annotations}}
	if selected {
		n.Labels = map[string]string{testLabel: f.label}
	}
	if err := f.c.Create(f.t.Context(), n); err != nil {
		f.t.Fatalf("creating node %s: %v", n.Name, err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), n) })
	return n
}

func (f *fixture) nodeName(short string) string { return f.ns + "-" + short }

func (f *fixture) deleteNode(short string) {
	f.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.nodeName(short)}}
	if err := f.c.Delete(f.t.Context(), n); err != nil {
		f.t.Fatalf("deleting node: %v", err)
	}
}

func (f *fixture) create(obj client.Object) {
	f.t.Helper()
	obj.SetNamespace(f.ns)
	if err := f.c.Create(f.t.Context(), obj); err != nil {
		f.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func (f *fixture) reconcile(r *poolcontroller.Reconciler, name string) ctrl.Result {
	f.t.Helper()
	res, err := r.Reconcile(f.t.Context(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: f.ns, Name: name}})
	if err != nil {
		f.t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func (f *fixture) ipPool(name string) *v1alpha1.IPPool {
	f.t.Helper()
	var p v1alpha1.IPPool
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, &p); err != nil {
		f.t.Fatalf("getting IPPool %s: %v", name, err)
	}
	return &p
}

func (f *fixture) cidrPool(name string) *v1alpha1.CIDRPool {
	f.t.Helper()
	var p v1alpha1.CIDRPool
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, &p); err != nil {
		f.t.Fatalf("getting CIDRPool %s: %v", name, err)
	}
	return &p
}

// blocksOf renders an IPPool's allocations as "node=start-end" with the fixture's
// node prefix removed, in status order.
func (f *fixture) blocksOf(p *v1alpha1.IPPool) []string {
	out := make([]string, 0, len(p.Status.Allocations))
	for _, a := range p.Status.Allocations {
		out = append(out, strings.TrimPrefix(a.NodeName, f.ns+"-")+"="+a.StartIP+"-"+a.EndIP)
	}
	return out
}

func (f *fixture) prefixesOf(p *v1alpha1.CIDRPool) []string {
	out := make([]string, 0, len(p.Status.Allocations))
	for _, a := range p.Status.Allocations {
		s := strings.TrimPrefix(a.NodeName, f.ns+"-") + "=" + a.Prefix
		if a.Gateway != "" {
			s += "@" + a.Gateway
		}
		out = append(out, s)
	}
	return out
}

// events drains the fake recorder.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
