package poolcontroller

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// statusTooLarge records that desired's status was refused as too large: the
// metric, and a Warning event when the pool was not too large before or the last
// event is older than tooLargeRepeat. Every reconcile retries the write, with the
// controller's backoff, as with any failed write.
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
