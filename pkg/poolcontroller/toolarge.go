package poolcontroller

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Event reasons about a pool whose status is too large to store.
const (
	// ReasonStatusTooLarge (Warning): the API server refused the pool's status
	// because the pool object is larger than etcd stores.
	ReasonStatusTooLarge = "StatusTooLarge"
	// ReasonStatusFits (Normal): the status was written again after that.
	ReasonStatusFits = "StatusFits"
)

// tooLargeRepeat is how often the StatusTooLarge event is emitted again while the
// pool stays too large: the API server keeps events for an hour (--event-ttl), and
// a pool that cannot be fixed in minutes should not drop out of `kubectl describe`.
const tooLargeRepeat = time.Hour

// A status refused as too large is not sent again before a backoff has passed
// unless it is smaller than every one refused: a Node event starts a reconcile at
// once, whatever the controller's backoff, and with node churn each would send a
// status of some 1.5 MiB only to be refused again. The backoff doubles with every
// refusal, from tooLargeRetryMin to tooLargeRetryMax: a pool that stays too large
// is sent at most every five minutes, and is still written within minutes of
// etcd's limit being raised while node events come.
const (
	tooLargeRetryMin = time.Second
	tooLargeRetryMax = 5 * time.Minute
)

// refusal is what holdTooLarge needs of the status writes refused as too large
// since the pool's status was last stored.
type refusal struct {
	// err is the last refused write's error.
	err error
	// size is the JSON size of the smallest pool refused.
	size int
	// backoff is how long the last refusal holds writes; until is when it ends.
	backoff time.Duration
	until   time.Time
}

// isTooLarge reports whether a status update failed because the pool object is too
// large to store. The API server reports it in one of three ways:
//   - etcd's own limit (--max-request-bytes, 1.5 MiB by default): a 500 whose
//     message is etcd's "etcdserver: request is too large" (seen against
//     kube-apiserver v1.37 and etcd v3.5 in TestStatusTooLargeEvent);
//   - the API server's etcd client, which sends at most 2 MiB whatever etcd's
//     limit: gRPC's "trying to send message larger than max";
//   - the API server's own limit on a request body (3 MiB): 413 Request Entity
//     Too Large.
func isTooLarge(err error) bool {
	if apierrors.IsRequestEntityTooLargeError(err) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "etcdserver: request is too large") ||
		strings.Contains(msg, "trying to send message larger than max")
}

// holdTooLarge returns an error, wrapping the last refusal's, when obj is not to be
// sent: a status was refused as too large less than its backoff ago and obj is no
// smaller than any refused. A smaller one (the nodeSelector was narrowed, nodes
// left) may fit, and is sent at once.
func (r *Reconciler) holdTooLarge(st *poolState, obj client.Object) error {
	f := st.refused
	if f == nil || !r.now().Before(f.until) || jsonSize(obj) < f.size {
		return nil
	}
	return fmt.Errorf("not sending the status of %s %s again before %s: one no smaller was refused: %w",
		r.Kind, obj.GetName(), f.until.Format(time.RFC3339), f.err)
}

// refusedTooLarge remembers, for holdTooLarge, that the write of obj was refused
// as too large with err, and doubles the backoff.
func (r *Reconciler) refusedTooLarge(st *poolState, obj client.Object, err error) {
	if st.refused == nil {
		st.refused = &refusal{size: math.MaxInt}
	}
	f := st.refused
	f.err = err
	f.size = min(f.size, jsonSize(obj))
	f.backoff = min(max(2*f.backoff, tooLargeRetryMin), tooLargeRetryMax)
	f.until = r.now().Add(f.backoff)
}

// jsonSize is the size of obj in JSON, 0 when it cannot be encoded: such a pool
// is never held, and its refusal holds every write for the backoff.
func jsonSize(obj client.Object) int {
	raw, err := json.Marshal(obj)
	if err != nil {
		return 0
	}
	return len(raw)
}

// statusTooLarge records that desired's status was refused as too large: the
// metric, and a Warning event when the pool was not too large before or the last
// event is older than tooLargeRepeat. Every reconcile fails, so that the
// controller retries it with its backoff as after any failed write; holdTooLarge
// decides whether the retry sends the status again.
func (r *Reconciler) statusTooLarge(st *poolState, desired pool, err error) {
	obj := desired.object()
	statusTooLarge.WithLabelValues(r.Kind, obj.GetNamespace(), obj.GetName()).Set(1)
	now := r.now()
	if st.tooLarge && now.Sub(st.tooLargeEvent) < tooLargeRepeat {
		return
	}
	st.tooLarge, st.tooLargeEvent = true, now
	size := "?"
	if raw, err := json.Marshal(obj); err == nil {
		size = formatBytes(len(raw))
	}
	cause := err.Error()
	if status, ok := errors.AsType[*apierrors.StatusError](err); ok {
		cause = status.ErrStatus.Message // the server's words, without sendStatus's wrapping
	}
	if len(cause) > 200 {
		cause = cause[:200] + "..."
	}
	r.event(desired, corev1.EventTypeWarning, ReasonStatusTooLarge, "WriteStatus",
		"the pool's status could not be written: the pool selects %d node(s) and its status lists a block for "+
			"each (%d), %s of JSON, more than etcd stores in one object (--max-request-bytes, 1.5 MiB by default, "+
			"about 20,000 nodes). Until it fits, the stored status keeps its last blocks and nodes without one get "+
			"none. Split the pool (a pool per rail or zone) or narrow its nodeSelector; a larger perNodeBlockSize "+
			"does not help (one entry per node whatever the block size). Refused with: %s",
		desired.common().SelectedNodes, desired.allocationCount(), size, cause)
}

// statusFits records that desired's status is stored: the metric, and a Normal
// event when it had been refused as too large.
func (r *Reconciler) statusFits(st *poolState, desired pool) {
	obj := desired.object()
	statusTooLarge.WithLabelValues(r.Kind, obj.GetNamespace(), obj.GetName()).Set(0)
	st.refused = nil
	if !st.tooLarge {
		return
	}
	st.tooLarge, st.tooLargeEvent = false, time.Time{}
	r.event(desired, corev1.EventTypeNormal, ReasonStatusFits, "WriteStatus",
		"the pool's status was written again after being refused as too large; it lists %d block(s)",
		desired.allocationCount())
}

func formatBytes(n int) string {
	const mib = 1 << 20
	if n >= mib/10 {
		return strconv.FormatFloat(float64(n)/mib, 'f', 2, 64) + " MiB"
	}
	return strconv.Itoa(n) + " bytes"
}
