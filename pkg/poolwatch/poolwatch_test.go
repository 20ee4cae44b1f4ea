package poolwatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// testSeed is $HWIPAM_POOLWATCH_SEED, or a fresh seed, logged so that a failure can
// be replayed.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("HWIPAM_POOLWATCH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("HWIPAM_POOLWATCH_SEED: %v", err)
		}
	}
	t.Logf("seed %d (replay with HWIPAM_POOLWATCH_SEED=%d)", seed, seed)
	return seed
}

func scheme(t testing.TB) *runtime.Scheme {
	s, err := v1alpha1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// randomMeta is the metadata of a pool as the API server sends it.
func randomMeta(r *rand.Rand, ns string, i int) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: fmt.Sprintf("pool-%d", r.IntN(5)), Namespace: ns, UID: types.UID(fmt.Sprintf("uid-%d", i)),
		ResourceVersion: strconv.Itoa(100 + i), Generation: int64(1 + r.IntN(4)),
		CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 24, 10, r.IntN(60), r.IntN(60), 0, time.UTC))}
	if r.IntN(2) == 0 {
		m.Labels = map[string]string{"rail": strconv.Itoa(r.IntN(8))}
		m.Annotations = map[string]string{"note": "a \"quoted\" \u00e9 value"}
	}
	if r.IntN(4) == 0 {
		m.Finalizers = []string{"example.com/keep"}
	}
	return m
}

func randomCommon(r *rand.Rand) v1alpha1.PoolStatusCommon {
	var c v1alpha1.PoolStatusCommon
	if r.IntN(2) == 0 {
		return c
	}
	c.ObservedGeneration = int64(r.IntN(5))
	c.SelectedNodes = int32(r.IntN(100))
	c.AllocatedNodes = int32(r.IntN(100))
	for _, typ := range []string{"Ready", "Exhausted", "OrphansHeld"}[:r.IntN(4)] {
		c.Conditions = append(c.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: "Because",
			Message: "line one\nline two", ObservedGeneration: int64(r.IntN(5)),
			LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 24, r.IntN(24), 0, 0, 0, time.UTC))})
	}
	return c
}

func randomIPPool(r *rand.Rand, ns string, i int) *v1alpha1.IPPool {
	p := &v1alpha1.IPPool{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindIPPool},
		ObjectMeta: randomMeta(r, ns, i),
		Spec:       v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/16", PerNodeBlockSize: 1 + r.IntN(64), Gateway: "10.0.0.1"}}
	if r.IntN(2) == 0 {
		p.Spec.Exclusions = []v1alpha1.ExcludeRange{{StartIP: "10.0.0.10", EndIP: "10.0.0.20"}}
		p.Spec.PerNodeExclusions = []v1alpha1.ExcludeIndexRange{{StartIndex: 0, EndIndex: r.IntN(3)}}
		p.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: "nic.hwipam.io/rail", Operator: corev1.NodeSelectorOpIn, Values: []string{"0", "1"}}}}}}
	}
	if n := r.IntN(40); n > 0 || r.IntN(2) == 0 {
		p.Status.Allocations = []v1alpha1.Allocation{}
		for j := range n {
			p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: fmt.Sprintf("node-%d", j),
				StartIP: fmt.Sprintf("10.0.%d.1", j), EndIP: fmt.Sprintf("10.0.%d.8", j)})
		}
	}
	p.Status.PoolStatusCommon = randomCommon(r)
	return p
}

func randomCIDRPool(r *rand.Rand, ns string, i int) *v1alpha1.CIDRPool {
	p := &v1alpha1.CIDRPool{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindCIDRPool},
		ObjectMeta: randomMeta(r, ns, i),
		Spec:       v1alpha1.CIDRPoolSpec{CIDR: "10.8.0.0/16", PerNodeNetworkPrefix: 24}}
	for j := range r.IntN(40) {
		p.Status.Allocations = append(p.Status.Allocations, v1alpha1.CIDRPoolAllocation{NodeName: fmt.Sprintf("node-%d", j),
			Prefix: fmt.Sprintf("10.8.%d.0/24", j), Gateway: fmt.Sprintf("10.8.%d.1", j)})
	}
	p.Status.PoolStatusCommon = randomCommon(r)
	return p
}

// randomStream encodes events as the API server does, one JSON object each, and
// returns it with how many events it holds.
func randomStream(t *testing.T, r *rand.Rand, kind string, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i := range n {
		var typ watch.EventType
		var obj any
		switch x := r.IntN(10); {
		case x == 0:
			typ = watch.Bookmark
			m := metav1.ObjectMeta{ResourceVersion: strconv.Itoa(200 + i)}
			if r.IntN(2) == 0 {
				m.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
			}
			obj = map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "metadata": m,
				"spec": map[string]any{}, "status": map[string]any{}}
		case x == 1 && i == n-1: // an ERROR ends a stream
			typ = watch.Error
			obj = &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Message: "too old resource version: 1 (417)", Reason: metav1.StatusReasonExpired, Code: http.StatusGone,
				Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Message: "why"}}}}
		default:
			typ = []watch.EventType{watch.Added, watch.Modified, watch.Deleted}[r.IntN(3)]
			if kind == v1alpha1.KindIPPool {
				obj = randomIPPool(r, "ns", i)
			} else {
				obj = randomCIDRPool(r, "ns", i)
			}
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		line, err := json.Marshal(metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}})
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// serve answers every request with body, as a watch response.
func serve(t *testing.T, body []byte) *rest.Config {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return &rest.Config{Host: srv.URL}
}

// clientGoWatch is the watch controller-runtime's informers start, through client-go.
func clientGoWatch(t *testing.T, cfg *rest.Config, httpClient *http.Client, s *runtime.Scheme, kind, ns string, opts metav1.ListOptions) watch.Interface {
	t.Helper()
	rc, err := apiutil.RESTClientForGVK(v1alpha1.GroupVersion.WithKind(kind), false, false, cfg, serializer.NewCodecFactory(s), httpClient)
	if err != nil {
		t.Fatal(err)
	}
	opts.Watch = true
	resource := map[string]string{v1alpha1.KindIPPool: "ippools", v1alpha1.KindCIDRPool: "cidrpools"}[kind]
	w, err := rc.Get().Namespace(ns).Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func ourWatch(t *testing.T, cfg *rest.Config, s *runtime.Scheme, kind, ns string, opts metav1.ListOptions) watch.Interface {
	t.Helper()
	wr, err := NewWatcher(cfg, http.DefaultClient, s, kind, ns)
	if err != nil {
		t.Fatal(err)
	}
	w, err := wr.Watch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// collect reads w until it closes, or until n events (n > 0) came.
func collect(t *testing.T, w watch.Interface, n int) []watch.Event {
	t.Helper()
	defer w.Stop()
	var got []watch.Event
	timeout := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return got
			}
			got = append(got, ev)
			if len(got) == n {
				return got
			}
		case <-timeout:
			t.Fatalf("the watch neither closed nor sent %d events in a minute; %d came", n, len(got))
		}
	}
}

// sameEvents fails t unless ours are client-go's events: same types, same objects.
// An ERROR's Status is compared by what the informer reads of it.
func sameEvents(t *testing.T, ours, theirs []watch.Event) {
	t.Helper()
	if len(ours) != len(theirs) {
		t.Fatalf("%d events, client-go's watch gave %d:\nours:   %s\ntheirs: %s", len(ours), len(theirs), eventTypes(ours), eventTypes(theirs))
	}
	for i := range ours {
		o, c := ours[i], theirs[i]
		if o.Type != c.Type {
			t.Fatalf("event %d is %s, client-go's %s", i, o.Type, c.Type)
		}
		if o.Type == watch.Error {
			ost, ok1 := o.Object.(*metav1.Status)
			cst, ok2 := c.Object.(*metav1.Status)
			if !ok1 || !ok2 {
				t.Fatalf("ERROR event %d holds %T, client-go's %T", i, o.Object, c.Object)
			}
			// A stream that cannot be decoded: both say so, in their own words.
			if decodingFailure(ost) && decodingFailure(cst) {
				continue
			}
			if ost.Code != cst.Code || ost.Reason != cst.Reason || !reflect.DeepEqual(ost.Details, cst.Details) ||
				ost.Message != cst.Message {
				t.Fatalf("ERROR event %d: %+v, client-go's %+v", i, ost, cst)
			}
			continue
		}
		if !reflect.DeepEqual(o.Object, c.Object) {
			a, _ := json.Marshal(o.Object)
			b, _ := json.Marshal(c.Object)
			t.Fatalf("event %d (%s) differs from client-go's:\nours:   %s\ntheirs: %s", i, o.Type, a, b)
		}
	}
}

// decodingFailure tells whether st is the Status of a watch event that could not
// be decoded.
func decodingFailure(st *metav1.Status) bool {
	if st.Code != http.StatusInternalServerError || st.Details == nil {
		return false
	}
	for _, c := range st.Details.Causes {
		if c.Type == "ClientWatchDecoding" {
			return true
		}
	}
	return false
}

func eventTypes(evs []watch.Event) string {
	var b bytes.Buffer
	for _, ev := range evs {
		fmt.Fprintf(&b, "%s ", ev.Type)
		if ev.Type == watch.Error {
			fmt.Fprintf(&b, "(%v) ", ev.Object)
		}
	}
	return b.String()
}

// TestDecodesAsClientGo feeds random streams of pool events, some cut short or
// corrupted, to both decoders and compares what they deliver.
func TestDecodesAsClientGo(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 0))
	s := scheme(t)
	for round := range 60 {
		kind := []string{v1alpha1.KindIPPool, v1alpha1.KindCIDRPool}[round%2]
		body := randomStream(t, r, kind, 1+r.IntN(12))
		switch round % 5 {
		case 3: // cut anywhere: both end quietly after the last whole event
			body = body[:r.IntN(len(body))]
		case 4: // a broken byte: both report an ERROR after the events before it
			body = bytes.Clone(body)
			body[r.IntN(len(body))] = '}'
		}
		cfg := serve(t, body)
		ours := collect(t, ourWatch(t, cfg, s, kind, "ns", metav1.ListOptions{}), 0)
		theirs := collect(t, clientGoWatch(t, cfg, http.DefaultClient, s, kind, "ns", metav1.ListOptions{}), 0)
		t.Run(fmt.Sprintf("round-%d-%s-%d-bytes", round, kind, len(body)), func(t *testing.T) {
			sameEvents(t, ours, theirs)
		})
	}
}

func TestUnknownEventTypeIsAnError(t *testing.T) {
	cfg := serve(t, []byte(`{"type":"RENAMED","object":{"metadata":{"name":"a"}}}`))
	got := collect(t, ourWatch(t, cfg, scheme(t), v1alpha1.KindIPPool, "ns", metav1.ListOptions{}), 0)
	if len(got) != 1 || got[0].Type != watch.Error {
		t.Fatalf("got %v, want one ERROR event", got)
	}
	if st := got[0].Object.(*metav1.Status); !decodingFailure(st) ||
		!strings.Contains(st.Message, "invalid watch event type") || !strings.Contains(st.Message, "RENAMED") {
		t.Fatalf("ERROR says %d %q", st.Code, st.Message)
	}
}

func TestStopEndsTheWatch(t *testing.T) {
	// A server that sends one event and then holds the stream open.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"ADDED","object":{"apiVersion":"nv-ipam.nvidia.com/v1alpha1","kind":"IPPool","metadata":{"name":"a","namespace":"ns"}}}` + "\n"))
		w.(http.Flusher).Flush()
		<-req.Context().Done()
	}))
	defer srv.Close()
	w := ourWatch(t, &rest.Config{Host: srv.URL}, scheme(t), v1alpha1.KindIPPool, "ns", metav1.ListOptions{})
	ev := <-w.ResultChan()
	if p, ok := ev.Object.(*v1alpha1.IPPool); !ok || p.Name != "a" {
		t.Fatalf("first event %v", ev)
	}
	w.Stop()
	w.Stop() // twice is fine
	select {
	case _, ok := <-w.ResultChan():
		if ok {
			t.Fatal("an event after Stop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the result channel is open 10 s after Stop")
	}
}

// BenchmarkDecode decodes a MODIFIED event of an IPPool with 5,000 nodes, as the
// controller and every node daemon do for each status write, with client-go's
// watch and with this package's.
func BenchmarkDecode(b *testing.B) {
	p := &v1alpha1.IPPool{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindIPPool},
		ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: "ns", ResourceVersion: "1234", Generation: 1},
		Spec:       v1alpha1.IPPoolSpec{Subnet: "10.0.0.0/14", PerNodeBlockSize: 8}}
	for i := range 5000 {
		p.Status.Allocations = append(p.Status.Allocations, v1alpha1.Allocation{NodeName: fmt.Sprintf("bench-node-%05d", i),
			StartIP: fmt.Sprintf("10.%d.%d.%d", i>>13, (i>>5)&255, (i&31)*8), EndIP: fmt.Sprintf("10.%d.%d.%d", i>>13, (i>>5)&255, (i&31)*8+7)})
	}
	raw, err := json.Marshal(p)
	if err != nil {
		b.Fatal(err)
	}
	event, err := json.Marshal(metav1.WatchEvent{Type: string(watch.Modified), Object: runtime.RawExtension{Raw: raw}})
	if err != nil {
		b.Fatal(err)
	}
	body := append(slices.Clip(event), '\n')
	s := scheme(b)
	for _, c := range []struct {
		name  string
		watch func(*rest.Config) (watch.Interface, error)
	}{
		{"client-go", func(cfg *rest.Config) (watch.Interface, error) {
			rc, err := apiutil.RESTClientForGVK(v1alpha1.GroupVersion.WithKind(v1alpha1.KindIPPool), false, false, cfg,
				serializer.NewCodecFactory(s), http.DefaultClient)
			if err != nil {
				return nil, err
			}
			return rc.Get().Namespace("ns").Resource("ippools").Param("watch", "true").Watch(context.Background())
		}},
		{"poolwatch", func(cfg *rest.Config) (watch.Interface, error) {
			wr, err := NewWatcher(cfg, http.DefaultClient, s, v1alpha1.KindIPPool, "ns")
			if err != nil {
				return nil, err
			}
			return wr.Watch(context.Background(), metav1.ListOptions{})
		}},
	} {
		// One op: a watch whose stream is the one event, read to its end.
		b.Run(c.name, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(body)
			}))
			defer srv.Close()
			cfg := &rest.Config{Host: srv.URL}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				w, err := c.watch(cfg)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for ev := range w.ResultChan() {
					if pool, ok := ev.Object.(*v1alpha1.IPPool); !ok || len(pool.Status.Allocations) != 5000 {
						b.Fatalf("event %s of %T", ev.Type, ev.Object)
					}
					n++
				}
				if n != 1 {
					b.Fatalf("%d events, want 1", n)
				}
			}
		})
	}
}
