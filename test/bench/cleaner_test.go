package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/test/harness"
)

// BenchmarkCleaner counts the pod requests the real ipam-node binary's
// stale-allocation cleaner makes to the API server per --cleanup-interval with
// 2,000 live allocations whose pods all exist on its node: the API server's own
// apiserver_request_total (resource pods, by verb) over three intervals, and the
// daemon's pod watches open at the end (apiserver_longrunning_requests). Nothing
// else in the run reads pods. The daemon finds its kubeconfig in $KUBECONFIG, so
// that its client is not rate-limited, as with the in-cluster configuration
// (with --kubeconfig client-go would hold it to 5 requests/s). Every allocation
// must still be there at the end.
func BenchmarkCleaner(b *testing.B) {
	const (
		allocations = 2000
		// Long enough for the old cleaner's 2,000 sequential GETs to fit in one
		// interval on two busy cores (about 2.4 s), so that it is not the sweep's
		// length that is measured.
		interval  = 4 * time.Second
		intervals = 3
	)
	ctx := context.Background()
	cp, kubeconfig := benchPool(b, "10.0.0.0/16", 4096, "10.0.0.1", "10.0.16.0")
	// The pods fill names (benchParams: pod-<prefix>-<i>), all bound to the node.
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < allocations; i = next.Add(1) - 1 {
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-live-%d", i), Namespace: "default"},
					Spec: corev1.PodSpec{NodeName: benchNode, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
				if err := cp.Client.Create(ctx, pod); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("creating pods: %v", err)
	}
	b.Setenv("KUBECONFIG", kubeconfig)
	bin := harness.BuildBinary(b, "./cmd/ipam-node")

	for b.Loop() {
		// The API server has a pod watch of its own open.
		ownWatches := podRequests(b, cp, "apiserver_longrunning_requests")["WATCH"]
		d, _ := startNodeDaemonArgs(b, bin, "", b.TempDir(), "--cni-skip-nv-ipam-binary-copy",
			"--cni-skip-nv-ipam-config-creation", "--cleanup-interval", interval.String())
		d.waitForPool(b)
		fill(b, d, "live", allocations)
		time.Sleep(interval + time.Second) // the informer synced, the first sweep done
		before := podRequests(b, cp, "apiserver_request_total")
		start := time.Now()
		time.Sleep(intervals * interval)
		after := podRequests(b, cp, "apiserver_request_total")
		watches := podRequests(b, cp, "apiserver_longrunning_requests")["WATCH"] - ownWatches
		n := time.Since(start).Seconds() / interval.Seconds()
		for i := range allocations {
			if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{
				Parameters: benchParams(fmt.Sprintf("live-%d", i))}); err != nil {
				b.Fatalf("the allocation of live pod %d was released: %v", i, err)
			}
		}
		d.stop()
		b.ReportMetric(float64(after["GET"]-before["GET"])/n, "pod-GETs/interval")
		b.ReportMetric(float64(after["LIST"]-before["LIST"]+after["WATCH"]-before["WATCH"])/n, "pod-LIST+WATCH/interval")
		b.ReportMetric(watches, "pod-watches-open")
	}
}

// podRequests reads one of the API server's request metrics (apiserver_request_total,
// or apiserver_longrunning_requests: the watches open now) for pods, the resource
// itself (no subresource), summed by verb. A watch counts in apiserver_request_total
// when it ends.
func podRequests(b *testing.B, cp *harness.ControlPlane, metric string) map[string]float64 {
	b.Helper()
	raw, err := cp.Clientset.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("reading the API server's metrics: %v", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") || !strings.Contains(line, `resource="pods"`) ||
			!strings.Contains(line, `subresource=""`) {
			continue
		}
		_, verb, ok := strings.Cut(line, `verb="`)
		if !ok {
			continue
		}
		verb, _, _ = strings.Cut(verb, `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			b.Fatalf("metric line %q: %v", line, err)
		}
		out[verb] += v
	}
	return out
}
