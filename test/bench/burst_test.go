package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// burstSettings returns the joins a second and the seconds of
// BenchmarkRailScale's burst (HWIPAM_BENCH_BURST_RATE, default 100, and
// HWIPAM_BENCH_BURST_SECONDS, default 60; 0 seconds: no burst).
func burstSettings(b *testing.B) (rate, seconds int) {
	b.Helper()
	get := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: want a whole number, 0 or more", name, v)
		}
		return n
	}
	return get("HWIPAM_BENCH_BURST_RATE", 100), get("HWIPAM_BENCH_BURST_SECONDS", 60)
}

// burstTimeout is how long after the last create every burst node must have
// its blocks.
const burstTimeout = 3 * time.Minute

// burst creates rate Nodes a second for seconds, labelled for the rail pools,
// as a cluster autoscaler adds them, and measures for each how long after its
// create returned its NodeIPAM listed its blocks of every pool (a watch of the
// namespace's NodeIPAMs). It adds to out burst-joins/s (the rate the creates
// reached), burst-s-median, -p99 and -max, and burst-over-5s (joins served in
// more than 5 s, or not within burstTimeout); it returns the nodes created,
// for removal.
func (w *scaleWorld) burst(b *testing.B, ns string, nodes int, out map[string]float64) []string {
	b.Helper()
	rate, seconds := burstSettings(b)
	if seconds == 0 || rate == 0 {
		return nil
	}
	total := rate * seconds
	names := make([]string, total)
	for i := range names {
		names[i] = fmt.Sprintf("burst-%d-%05d", nodes, i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	created := make(map[string]time.Time, total)
	served := make(map[string]time.Time, total)
	all := make(chan struct{})
	// The watch starts before the first create.
	_, rv, err := w.listNodeIPAMs(ctx, ns, "-")
	if err != nil {
		b.Fatal(err)
	}
	seen := func(o *nodeIPAMFields) bool {
		if !strings.HasPrefix(o.Metadata.Name, "burst-") || len(o.Spec.Blocks) < railPools {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if _, ok := served[o.Metadata.Name]; !ok {
			served[o.Metadata.Name] = time.Now()
			if len(served) == total {
				close(all)
				return true
			}
		}
		return false
	}
	watchErr := make(chan error, 1)
	go func() {
		for {
			at, err := w.watchNodeIPAMs(ctx, ns, "", &rv, seen, nil)
			if errors.Is(err, errExpired) {
				// Listed whole again: what the watch missed is seen now.
				var items []nodeIPAMFields
				if items, rv, err = w.listNodeIPAMs(ctx, ns, ""); err == nil {
					for i := range items {
						if seen(&items[i]) {
							at = time.Now()
						}
					}
				}
			}
			if err != nil || !at.IsZero() {
				watchErr <- err
				return
			}
		}
	}()

	// Creates paced at rate, from a few goroutines: one create takes longer
	// than the pace at 100 a second.
	start := time.Now()
	next := make(chan string)
	var wg sync.WaitGroup
	var createErr error
	var errOnce sync.Once
	for range 16 {
		wg.Go(func() {
			for name := range next {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{railLabel: "true"}}}
				if err := w.cp.Client.Create(ctx, n); err != nil {
					errOnce.Do(func() { createErr = fmt.Errorf("creating %s: %w", name, err) })
					continue
				}
				mu.Lock()
				created[name] = time.Now()
				mu.Unlock()
			}
		})
	}
	for i, name := range names {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		next <- name
	}
	close(next)
	wg.Wait()
	createdIn := time.Since(start)
	if createErr != nil {
		b.Fatal(createErr)
	}
	select {
	case <-all:
	case err := <-watchErr:
		b.Fatalf("watching the burst's NodeIPAMs: %v", err)
	case <-time.After(burstTimeout):
	}
	mu.Lock()
	defer mu.Unlock()
	var took []time.Duration
	late := 0
	for _, n := range names {
		s, ok := served[n]
		if !ok {
			late++
			continue
		}
		d := max(s.Sub(created[n]), 0)
		if d > 5*time.Second {
			late++
		}
		took = append(took, d)
	}
	slices.Sort(took)
	out["burst-joins/s"] = float64(total) / createdIn.Seconds()
	out["burst-over-5s"] = float64(late)
	if len(took) > 0 {
		out["burst-s-median"] = took[len(took)/2].Seconds()
		out["burst-s-p99"] = took[min(len(took)-1, len(took)*99/100)].Seconds()
		out["burst-s-max"] = took[len(took)-1].Seconds()
	}
	b.Logf("nodes=%d new: %d nodes joined at %.1f/s over %s; served median %.3fs, p99 %.3fs, max %.3fs; %d over 5 s or not served within %s",
		nodes, total, out["burst-joins/s"], createdIn.Round(time.Millisecond), out["burst-s-median"], out["burst-s-p99"],
		out["burst-s-max"], late, burstTimeout)
	return names
}
