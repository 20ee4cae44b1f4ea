package nicdra

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The driver's metrics; ipam-node registers them (Collectors) when the driver
// runs. Labels are bounded: an operation or a state, never a claim or a pod.
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
	failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwipam_dra_failures_total",
		Help: "Prepares, unprepares, attaches (a port into its pod at sandbox start) and detaches that failed, by " +
			"operation; each is retried by the kubelet or the runtime, and ipamctl check shows the last of each.",
	}, []string{"op"})
	claimsDesc = prometheus.NewDesc("hwipam_dra_claims",
		"Claims in the driver's checkpoint by state: prepared; preparing (a prepare cut short); unpreparing (an "+
			"unprepare cut short); ports_held (unprepared with a port in a namespace that outlived its pod: its "+
			"addresses stay held); waiting_release (deleted while its pod runs: released when the pod's sandbox stops).",
		[]string{"state"}, nil)
)

// claimStates are the states of hwipam_dra_claims.
var claimStates = []string{"prepared", "preparing", "unpreparing", "ports_held", "waiting_release"}

// claimsCollector reports the driver's claims at each scrape, from memory.
type claimsCollector struct{}

// metricsDriver is the driver whose claims hwipam_dra_claims reports (one
// per process).
var metricsDriver atomic.Pointer[Driver]

func (claimsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- claimsDesc }

func (claimsCollector) Collect(ch chan<- prometheus.Metric) {
	d := metricsDriver.Load()
	if d == nil {
		return
	}
	claims, err := d.Preparer.Claims()
	if err != nil {
		return // the checkpoint cannot be read: nothing known (ipamctl check says why)
	}
	n := map[string]int{}
	for _, pc := range claims {
		switch {
		case pc.PortsHeld:
			n["ports_held"]++
		case pc.Unpreparing:
			n["unpreparing"]++
		case pc.State == PrepareCompleted:
			n["prepared"]++
		default:
			n["preparing"]++
		}
	}
	n["waiting_release"] = int(d.waitingRelease.Load())
	for _, s := range claimStates {
		ch <- prometheus.MustNewConstMetric(claimsDesc, prometheus.GaugeValue, float64(n[s]), s)
	}
}

func init() {
	for _, op := range []string{FailedPrepare, FailedUnprepare, FailedAttach, FailedDetach} {
		failures.WithLabelValues(op) // exported at 0 from the start: rate() sees the first failure
	}
}

// Collectors are the driver's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{prepareSeconds, gcReleases, failures, claimsCollector{}}
}
