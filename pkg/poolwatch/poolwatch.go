// Package poolwatch watches IPPools and CIDRPools with a decoder that reads each
// watch event in one pass, for the informers of ipam-controller and ipam-node.
//
// A pool's status lists one block per node: with 5,000 nodes a watch event is some
// 400 kB of JSON, and every status write of every pool reaches the controller (as
// the echo of its own write) and every node daemon. client-go's watch frames the
// event, decodes the event envelope, sniffs the object's apiVersion and kind and
// then decodes the object, scanning the bytes some seven times; that was two thirds
// of the controller's CPU while 8 such pools converged. Here the event and its
// object are decoded straight from the stream into the pool type: one scan to find
// the event's end, one decode.
//
// The informer fills its cache through this watch too: client-go's reflector
// (WatchListClient, on by default) asks the watch for the initial events
// (sendInitialEvents) and lists only when the server cannot stream them.
package poolwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// failure holds the fields of the metav1.Status that an ERROR event carries (for
// example 410 Gone when the watch's resourceVersion is too old). Its "status" is
// the string "Failure", which does not fit the pool's status struct; encoding/json
// reports that as an *UnmarshalTypeError after decoding everything else.
type failure struct {
	Message string                `json:"message,omitempty"`
	Reason  metav1.StatusReason   `json:"reason,omitempty"`
	Details *metav1.StatusDetails `json:"details,omitempty"`
	Code    int32                 `json:"code,omitempty"`
}

var statusType = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}

func (f failure) status() *metav1.Status {
	return &metav1.Status{TypeMeta: statusType, Status: metav1.StatusFailure,
		Message: f.Message, Reason: f.Reason, Details: f.Details, Code: f.Code}
}

// A frame is one watch event as the API server encodes it: {"type":...,"object":...}.
// The object's fields are those of the pool and of a failure side by side.
type ipPoolFrame struct {
	Type   watch.EventType `json:"type"`
	Object struct {
		v1alpha1.IPPool
		failure
	} `json:"object"`
}

func (f *ipPoolFrame) parts() (watch.EventType, *metav1.TypeMeta, runtime.Object, *failure) {
	return f.Type, &f.Object.TypeMeta, &f.Object.IPPool, &f.Object.failure
}

type cidrPoolFrame struct {
	Type   watch.EventType `json:"type"`
	Object struct {
		v1alpha1.CIDRPool
		failure
	} `json:"object"`
}

func (f *cidrPoolFrame) parts() (watch.EventType, *metav1.TypeMeta, runtime.Object, *failure) {
	return f.Type, &f.Object.TypeMeta, &f.Object.CIDRPool, &f.Object.failure
}

// decoded is a frame after decoding: parts returns the event's type, and its
// object's type, the object as a pool, and as a failure.
type decoded interface {
	parts() (watch.EventType, *metav1.TypeMeta, runtime.Object, *failure)
}

// frame is implemented by the pointer to each frame type.
type frame[F any] interface {
	*F
	decoded
}

// decodeEvent reads the next event of a watch stream of pools of kind.
func decodeEvent[F any, PF frame[F]](kind string) func(*json.Decoder) (watch.Event, error) {
	want := metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind}
	return func(dec *json.Decoder) (watch.Event, error) {
		f := PF(new(F))
		return event(dec.Decode(f), want, f)
	}
}

func event(err error, want metav1.TypeMeta, f decoded) (watch.Event, error) {
	typ, tm, obj, fail := f.parts()
	var typeErr *json.UnmarshalTypeError
	if typ == watch.Error && errors.As(err, &typeErr) {
		err = nil // the Status's "status": "Failure" (see failure)
	}
	if err != nil {
		return watch.Event{}, err
	}
	switch typ {
	case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
		if *tm != want {
			return watch.Event{}, fmt.Errorf("unable to decode watch event: the object is a %q of %q, not a %q of %q",
				tm.Kind, tm.APIVersion, want.Kind, want.APIVersion)
		}
		*tm = metav1.TypeMeta{} // as client-go's decoder leaves typed objects
		return watch.Event{Type: typ, Object: obj}, nil
	case watch.Error:
		// client-go wants an apiVersion here, but any will do.
		if tm.Kind != statusType.Kind || tm.APIVersion == "" {
			return watch.Event{}, fmt.Errorf("unable to decode watch event: an ERROR holding a %q of %q, not a Status",
				tm.Kind, tm.APIVersion)
		}
		return watch.Event{Type: typ, Object: fail.status()}, nil
	default:
		return watch.Event{}, fmt.Errorf("got invalid watch event type: %q", typ)
	}
}

// decodingError makes the Status of an ERROR event for a stream that cannot be
// decoded, as client-go's watch does.
var decodingError = apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")

// streamWatch is a watch.Interface over one watch response, like client-go's
// StreamWatcher: events in order on an unbuffered channel, closed when the stream
// ends or Stop is called.
type streamWatch struct {
	body     io.ReadCloser
	result   chan watch.Event
	done     chan struct{}
	stopOnce sync.Once
}

func newStreamWatch(body io.ReadCloser, next func(*json.Decoder) (watch.Event, error)) *streamWatch {
	w := &streamWatch{body: body, result: make(chan watch.Event), done: make(chan struct{})}
	go w.receive(next)
	return w
}

func (w *streamWatch) ResultChan() <-chan watch.Event { return w.result }

func (w *streamWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.done)
		_ = w.body.Close()
	})
}

func (w *streamWatch) receive(next func(*json.Decoder) (watch.Event, error)) {
	defer close(w.result)
	defer w.Stop()
	dec := json.NewDecoder(w.body)
	for {
		ev, err := next(dec)
		if err != nil {
			// The end of the stream (the server's timeout, Stop, a dropped
			// connection) ends the watch quietly, and the informer starts another;
			// anything else is reported as client-go reports it, as an ERROR event.
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || utilnet.IsProbableEOF(err) || utilnet.IsTimeout(err) {
				return
			}
			ev = watch.Event{Type: watch.Error, Object: decodingError.AsObject(
				fmt.Errorf("unable to decode an event from the watch stream: %w", err))}
		}
		select {
		case <-w.done:
			return
		case w.result <- ev:
		}
		if err != nil {
			return
		}
	}
}

// Watcher starts watches of one pool kind in one namespace.
type Watcher struct {
	rc        rest.Interface
	namespace string
	resource  string
	next      func(*json.Decoder) (watch.Event, error)
}

// NewWatcher returns a Watcher of the pools of kind (v1alpha1.KindIPPool or
// KindCIDRPool) in namespace.
func NewWatcher(cfg *rest.Config, httpClient *http.Client, scheme *runtime.Scheme, kind, namespace string) (*Watcher, error) {
	w := &Watcher{namespace: namespace}
	switch kind {
	case v1alpha1.KindIPPool:
		w.resource, w.next = "ippools", decodeEvent[ipPoolFrame](kind)
	case v1alpha1.KindCIDRPool:
		w.resource, w.next = "cidrpools", decodeEvent[cidrPoolFrame](kind)
	default:
		return nil, fmt.Errorf("watching %s: not a pool kind", kind)
	}
	// Like client-go's Request.Watch, which is not rate limited: a watch is
	// started rarely, and a throttled start only delays the informer.
	cfg = rest.CopyConfig(cfg)
	cfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	rc, err := apiutil.RESTClientForGVK(v1alpha1.GroupVersion.WithKind(kind), false, false, cfg,
		serializer.NewCodecFactory(scheme), httpClient)
	if err != nil {
		return nil, fmt.Errorf("creating a REST client for %s: %w", kind, err)
	}
	w.rc = rc
	return w, nil
}

// Watch starts a watch with opts. Like client-go's Request.Watch, a connection that
// ends before the server answers gives an empty watch, after which the informer
// lists again; an answer other than 200 is the server's error.
func (w *Watcher) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	body, err := w.rc.Get().Namespace(w.namespace).Resource(w.resource).
		VersionedParams(&opts, metav1.ParameterCodec).Stream(ctx)
	if err != nil {
		if utilnet.IsProbableEOF(err) || utilnet.IsTimeout(err) {
			return watch.NewEmptyWatch(), nil
		}
		return nil, err
	}
	return newStreamWatch(body, w.next), nil
}

// CacheOptions returns controller-runtime cache options that cache IPPools and
// CIDRPools of namespace only, and watch them with a Watcher. Other types are
// cached as controller-runtime does by default. Callers may add to the options but
// must not give pools label or field selectors or other namespaces:
// controller-runtime applies those in the watch it builds, which a Watcher
// replaces (the list would keep them, so the cache would list one set of pools
// and watch another).
func CacheOptions(cfg *rest.Config, scheme *runtime.Scheme, namespace string) (ctrlcache.Options, error) {
	newInformer, err := newInformerFunc(cfg, scheme, namespace)
	if err != nil {
		return ctrlcache.Options{}, err
	}
	inNamespace := ctrlcache.ByObject{Namespaces: map[string]ctrlcache.Config{namespace: {}}}
	return ctrlcache.Options{NewInformer: newInformer, ByObject: map[client.Object]ctrlcache.ByObject{
		&v1alpha1.IPPool{}:   inNamespace,
		&v1alpha1.CIDRPool{}: inNamespace,
	}}, nil
}

// newInformerFunc returns a cache.Options.NewInformer whose informers of IPPools
// and CIDRPools watch with a Watcher of namespace; informers of other types are
// client-go's.
func newInformerFunc(cfg *rest.Config, scheme *runtime.Scheme, namespace string) (
	func(toolscache.ListerWatcher, runtime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating an HTTP client for pool watches: %w", err)
	}
	watchers := map[string]*Watcher{}
	for _, kind := range []string{v1alpha1.KindIPPool, v1alpha1.KindCIDRPool} {
		w, err := NewWatcher(cfg, httpClient, scheme, kind, namespace)
		if err != nil {
			return nil, err
		}
		watchers[kind] = w
	}
	return func(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
		var w *Watcher
		switch obj.(type) {
		case *v1alpha1.IPPool:
			w = watchers[v1alpha1.KindIPPool]
		case *v1alpha1.CIDRPool:
			w = watchers[v1alpha1.KindCIDRPool]
		}
		if w != nil {
			list := toolscache.ToListerWatcherWithContext(lw)
			lw = &toolscache.ListWatch{
				ListWithContextFunc: list.ListWithContext,
				WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
					// As controller-runtime's own watch asks (its default).
					opts.AllowWatchBookmarks = true
					return w.Watch(ctx, opts)
				},
			}
		}
		return toolscache.NewSharedIndexInformer(lw, obj, resync, indexers)
	}, nil
}
