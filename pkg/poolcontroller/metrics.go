package poolcontroller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/hwipam/hwipam/pkg/blocks"
)

// Metrics on the controller-runtime registry, served on --metrics-bind-address.
var (
	poolLabels = []string{"kind", "namespace", "pool"}

	blocksTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hwipam_pool_blocks",
		Help: "Blocks the pool's range is cut into (capped at 2^63 for huge IPv6 pools).",
	}, poolLabels)
	blocksAssigned = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hwipam_pool_blocks_assigned",
		Help: "Blocks assigned to nodes, including blocks kept through their release grace period.",
	}, poolLabels)
	nodesWithoutBlock = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hwipam_pool_selected_nodes_without_block",
		Help: "Nodes that match the pool's nodeSelector but have no block because the pool is exhausted.",
	}, poolLabels)
	statusTooLarge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hwipam_pool_status_too_large",
		Help: "1 while the API server refuses the pool's status as too large to store (etcd's --max-request-bytes), else 0.",
	}, poolLabels)
	reconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "hwipam_pool_reconcile_duration_seconds",
		Help:    "Time to reconcile one pool.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"kind"})
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwipam_pool_reconcile_errors_total",
		Help: "Pool reconciles that returned an error.",
	}, []string{"kind"})
	heldReportsIgnored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwipam_controller_held_reports_ignored_total",
		Help: "Parts of nodes' held reports ignored for planning, counted once per report: oversized or malformed " +
			"reports, pools the node has no block in (noBlock), ranges outside its blocks (outsideBlocks).",
	}, []string{"reason"})
	statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwipam_pool_status_writes_total",
		Help: "Pool status updates sent to the API server.",
	}, []string{"kind"})
	writeFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwipam_controller_write_failures_total",
		Help: "Writes to the API server that failed (conflicts included; each is retried), by resource: pool-status, " +
			"nodeipam (a node's record), poolspecs, lease (the held-reports Lease of an earlier version's format).",
	}, []string{"resource"})
)

// Resources of hwipam_controller_write_failures_total.
const (
	failedPoolStatus = "pool-status"
	failedNodeIPAM   = "nodeipam"
	failedPoolSpecs  = "poolspecs"
	failedLease      = "lease"
)

func init() {
	metrics.Registry.MustRegister(blocksTotal, blocksAssigned, nodesWithoutBlock, statusTooLarge,
		reconcileDuration, reconcileErrors, statusWrites, heldReportsIgnored, writeFailures)
	for _, r := range []string{failedPoolStatus, failedNodeIPAM, failedPoolSpecs, failedLease} {
		writeFailures.WithLabelValues(r) // exported at 0 from the start: rate() sees the first failure
	}
	for _, r := range []string{ignoredOversized, ignoredMalformed, ignoredNoBlock, ignoredOutside} {
		heldReportsIgnored.WithLabelValues(r)
	}
}

func updateMetrics(kind string, obj client.Object, l blocks.Layout, assigned, without int) {
	labels := []string{kind, obj.GetNamespace(), obj.GetName()}
	blocksTotal.WithLabelValues(labels...).Set(float64(l.Count()))
	blocksAssigned.WithLabelValues(labels...).Set(float64(assigned))
	nodesWithoutBlock.WithLabelValues(labels...).Set(float64(without))
}

func forgetMetrics(kind, namespace, name string) {
	for _, g := range []*prometheus.GaugeVec{blocksTotal, blocksAssigned, nodesWithoutBlock, statusTooLarge} {
		g.DeleteLabelValues(kind, namespace, name)
	}
}
