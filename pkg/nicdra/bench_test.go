package nicdra_test

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkPrepare prepares and unprepares a claim for one rail NIC (two
// addresses, IPv4 and IPv6, from the rail's pools) on the real allocation
// state over a store on disk, with the checkpoint written at each step, as
// ipam-node does for the kubelet; it reports the prepare latency's p50 and p99.
func BenchmarkPrepare(b *testing.B) {
	n := newNode(b)
	p := n.preparer()
	var took []time.Duration
	i := 0
	for b.Loop() {
		c := claim("bench-"+strconv.Itoa(i), map[string]string{"nic": "pci-0000-18-00-0"})
		i++
		start := time.Now()
		if _, err := p.Prepare(b.Context(), c); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		if err := p.Unprepare(b.Context(), c.UID); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
}
