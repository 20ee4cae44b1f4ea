package ipamnode

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

var (
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "hwipam_node_request_duration_seconds",
		Help:    "gRPC requests to the node daemon by method and status code.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"method", "code"})
	cleanupReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hwipam_node_cleanup_releases_total",
		Help: "Allocations released because their pod no longer exists.",
	})
	nicCount = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hwipam_node_nics",
		Help: "NVIDIA NIC functions (PFs and VFs) the last NIC scan found.",
	})
	nicScans = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hwipam_node_nic_scans_total",
		Help: "NIC scans (periodic, SIGHUP, link events).",
	})
	nicLabelWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hwipam_node_nic_label_writes_total",
		Help: "Times the NIC label set changed and was published (Node labels or NodeFeature).",
	})
	featureForbidden = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hwipam_node_feature_forbidden",
		Help: "1 while an optional feature is off because the API server refuses the node's service account " +
			"(RBAC, as under network-operator's NicClusterPolicy), 0 while it works: " +
			featureNICLabels + ", " + featureNodeAnnotations + ", " + featureStaleCleanup + ".",
	}, []string{"feature"})

	// current is the daemon whose state the collector reports (one per process;
	// tests run several in turn).
	current   atomic.Pointer[daemonState]
	registerM sync.Once
)

// The optional features hwipam_node_feature_forbidden reports on: each needs a
// right that network-operator's node service account lacks, and is skipped with
// one warning without it.
const (
	featureNICLabels       = "nic-labels"       // get/patch nodes, or nodefeatures rights
	featureNodeAnnotations = "node-annotations" // patch nodes: pools-in-use and held
	featureStaleCleanup    = "stale-cleanup"    // get pods
)

// setForbidden records whether feature is off for lack of permission.
func setForbidden(feature string, forbidden bool) {
	v := 0.0
	if forbidden {
		v = 1
	}
	featureForbidden.WithLabelValues(feature).Set(v)
}

type daemonState struct {
	manager *nodealloc.Manager
	store   *store.Store
	// railOf is the rail a pool (by store key) is labelled for, "" when none
	// or not known yet; nil before the pools are listed.
	railOf atomic.Pointer[func(poolKey string) string]
}

type stateCollector struct{}

var (
	descAllocated = prometheus.NewDesc("hwipam_node_pool_allocations", "Addresses held in the pool on this node.", []string{"pool", "rail"}, nil)
	descFree      = prometheus.NewDesc("hwipam_node_pool_free_addresses", "Addresses that can still be handed out (float: IPv6 blocks are huge).", []string{"pool", "rail"}, nil)
	descOrphans   = prometheus.NewDesc("hwipam_node_pool_orphaned_addresses", "Addresses held outside the block the pool hands out from on this node (all of them when it has none): kept until released, reported to the controller so no other node gets them.", []string{"pool", "rail"}, nil)
	descActive    = prometheus.NewDesc("hwipam_node_pool_active", "1 when the pool has a block for this node, 0 when it only keeps old allocations.", []string{"pool", "rail"}, nil)
	descCommits   = prometheus.NewDesc("hwipam_node_store_commits_total", "Store commits (each Allocate or Deallocate that changed something).", nil, nil)
	descTxs       = prometheus.NewDesc("hwipam_node_store_transactions_total", "Flushes (fdatasync) of the store's write-ahead log those commits shared.", nil, nil)
	descCkpts     = prometheus.NewDesc("hwipam_node_store_checkpoints_total", "Transactions that applied the write-ahead log to the bbolt file (each flushes the device twice).", nil, nil)
	descFails     = prometheus.NewDesc("hwipam_node_store_commit_failures_total", "Store commits that failed to write the log (a full or failing disk): their Allocate or Deallocate failed, nothing of them was recorded.", nil, nil)
	descCommitSec = prometheus.NewDesc("hwipam_node_store_commit_seconds_total", "Seconds the successful store commits spent writing the log, in all (divided by hwipam_node_store_commits_total: the mean commit time).", nil, nil)
)

func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAllocated, descFree, descOrphans, descActive, descCommits, descTxs, descCkpts,
		descFails, descCommitSec} {
		ch <- d
	}
}

func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := current.Load()
	if s == nil {
		return
	}
	railOf := func(string) string { return "" }
	if f := s.railOf.Load(); f != nil {
		railOf = *f
	}
	for _, p := range s.manager.Pools() {
		rail := railOf(p.Key)
		ch <- prometheus.MustNewConstMetric(descAllocated, prometheus.GaugeValue, float64(p.Allocated), p.Key, rail)
		free := float64(p.Free.Hi)*18446744073709551616 + float64(p.Free.Lo)
		ch <- prometheus.MustNewConstMetric(descFree, prometheus.GaugeValue, free, p.Key, rail)
		ch <- prometheus.MustNewConstMetric(descOrphans, prometheus.GaugeValue, float64(p.Orphans), p.Key, rail)
		active := 0.0
		if p.Active {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active, p.Key, rail)
	}
	commits, txs := s.store.Stats()
	ch <- prometheus.MustNewConstMetric(descCommits, prometheus.CounterValue, float64(commits))
	ch <- prometheus.MustNewConstMetric(descTxs, prometheus.CounterValue, float64(txs))
	ch <- prometheus.MustNewConstMetric(descCkpts, prometheus.CounterValue, float64(s.store.Checkpoints()))
	fails, secs := s.store.CommitStats()
	ch <- prometheus.MustNewConstMetric(descFails, prometheus.CounterValue, float64(fails))
	ch <- prometheus.MustNewConstMetric(descCommitSec, prometheus.CounterValue, secs)
}

func registerMetrics(m *nodealloc.Manager, st *store.Store) *daemonState {
	ds := &daemonState{manager: m, store: st}
	current.Store(ds)
	registerM.Do(func() {
		metrics.Registry.MustRegister(requestDuration, cleanupReleases, nicCount, nicScans, nicLabelWrites, featureForbidden,
			stateCollector{})
	})
	return ds
}

// setRailOf gives the pool metrics their rail label from the pools' labels.
func (s *daemonState) setRailOf(f func(poolKey string) string) { s.railOf.Store(&f) }

func requestMetrics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	requestDuration.WithLabelValues(info.FullMethod, status.Code(err).String()).Observe(time.Since(start).Seconds())
	return resp, err
}

// requestLogger logs failed requests at V(1) and every request at V(2).
func requestLogger(l logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			l.V(1).Info("request failed", "method", info.FullMethod, "code", status.Code(err).String(), "error", err.Error())
		} else {
			l.V(2).Info("request", "method", info.FullMethod)
		}
		return resp, err
	}
}

// recoverPanics turns a panic in a handler into an Internal error instead of a
// crashed daemon, and logs it with the stack.
func recoverPanics(l logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				l.Error(fmt.Errorf("panic: %v", r), "request handler panicked; please report this", "method", info.FullMethod,
					"stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "internal error in %s: %v", info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

var registerDRA sync.Once

// registerDRAMetrics adds the DRA driver's metrics to the endpoint.
func registerDRAMetrics() {
	registerDRA.Do(func() { metrics.Registry.MustRegister(nicdra.Collectors()...) })
}
