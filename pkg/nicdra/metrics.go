package nicdra

import "github.com/prometheus/client_golang/prometheus"

// The driver's metrics; ipam-node registers them (Collectors) when the driver
// runs.
var (
	prepareSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "hwipam_dra_prepare_duration_seconds",
		Help:    "Time to prepare one ResourceClaim: its addresses allocated and its status written.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
	gcReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hwipam_dra_gc_releases_total",
		Help: "Claims (or their allocations) released because the ResourceClaim no longer exists.",
	})
)

// Collectors are the driver's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{prepareSeconds, gcReleases} }
