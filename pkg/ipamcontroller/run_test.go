package ipamcontroller_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/test/harness"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func railSelector(rail string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "nic.hwipam.io/rail.r", Operator: corev1.NodeSelectorOpIn, Values: []string{rail}}}}}}
}

// eventually polls cond every 100ms for up to 30s.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last state: %s", what, last)
}

// TestRunEndToEnd runs the whole controller (manager, leader election, webhooks,
// metrics, health) against the real apiserver.
func TestRunEndToEnd(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{
		WebhookDirs: []string{filepath.Join(harness.RepoRoot(), "deploy", "webhook")},
	})
	c := cp.Client
	ctx := t.Context()
	metricsPort, healthPort := freePort(t), freePort(t)
	opts := ipamcontroller.NewOptions()
	opts.RestConfig = cp.Config
	opts.PoolsNamespace = "default"
	opts.LeaderElect = true
	opts.LeaderElectNamespace = "default"
	opts.Webhook = true
	opts.WebhookHost = cp.Webhook.LocalServingHost
	opts.WebhookPort = cp.Webhook.LocalServingPort
	opts.WebhookCertDir = cp.Webhook.LocalServingCertDir
	opts.MetricsBindAddress = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	opts.HealthProbeBindAddress = fmt.Sprintf("127.0.0.1:%d", healthPort)
	opts.ReleaseGracePeriod = 0

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ipamcontroller.Run(runCtx, opts) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of cancel")
		}
	})

	for i := range 20 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%02d", i),
			Labels: map[string]string{"nic.hwipam.io/rail.r": "r0"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// The webhook must be serving before pools are created (failurePolicy Fail).
	eventually(t, "readyz", func() (bool, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort))
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})

	create := func(obj client.Object) error { return c.Create(ctx, obj) }
	if err := create(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rail0", Namespace: "default"},
		Spec: v1alpha1.IPPoolSpec{Subnet: "10.10.0.0/16", PerNodeBlockSize: 64, Gateway: "10.10.0.1", NodeSelector: railSelector("r0")}}); err != nil {
		t.Fatalf("creating a valid IPPool: %v", err)
	}
	if err := create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "rail1", Namespace: "default"},
		Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.20.0.0/16", PerNodeNetworkPrefix: 24, NodeSelector: railSelector("r1")}}); err != nil {
		t.Fatalf("creating a valid CIDRPool: %v", err)
	}

	t.Run("webhook rejects an invalid pool with the field named", func(t *testing.T) {
		err := create(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "default"},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.30.0.0/24", PerNodeBlockSize: 8, Gateway: "10.31.0.1"}})
		if err == nil || !strings.Contains(err.Error(), "spec.gateway") {
			t.Errorf("invalid pool: err = %v, want a rejection naming spec.gateway", err)
		}
	})
	t.Run("webhook rejects an overlapping pool", func(t *testing.T) {
		err := create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "overlap", Namespace: "default"},
			Spec: v1alpha1.CIDRPoolSpec{CIDR: "10.10.128.0/17", PerNodeNetworkPrefix: 24}})
		if err == nil || !strings.Contains(err.Error(), "overlaps IPPool rail0") {
			t.Errorf("overlapping pool: err = %v, want a rejection naming IPPool rail0", err)
		}
	})

	var rail0 v1alpha1.IPPool
	eventually(t, "20 blocks in rail0", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rail0"}, &rail0); err != nil {
			return false, err.Error()
		}
		return len(rail0.Status.Allocations) == 20, fmt.Sprint(len(rail0.Status.Allocations))
	})
	if a := rail0.Status.Allocations[0]; a.NodeName != "gpu-00" || a.StartIP != "10.10.0.1" || a.EndIP != "10.10.0.64" {
		t.Errorf("first block = %+v", a)
	}
	// The controller caches pools without managedFields; its status updates must
	// leave the stored ones (the spec's manager) as they are.
	var spec, status bool
	for _, m := range rail0.ManagedFields {
		spec = spec || m.Subresource == ""
		status = status || m.Subresource == "status"
	}
	if !spec || !status {
		t.Errorf("managedFields after the controller's status update = %+v, want the spec's manager and the status's", rail0.ManagedFields)
	}

	t.Run("a node event reaches only the pools it concerns", func(t *testing.T) {
		before := rail0.ResourceVersion
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ib-00", Labels: map[string]string{"nic.hwipam.io/rail.r": "r1"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		var rail1 v1alpha1.CIDRPool
		eventually(t, "a prefix for ib-00 in rail1", func() (bool, string) {
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rail1"}, &rail1); err != nil {
				return false, err.Error()
			}
			return len(rail1.Status.Allocations) == 1, fmt.Sprintf("%+v", rail1.Status.Allocations)
		})
		if rail1.Status.Allocations[0].Prefix != "10.20.0.0/24" {
			t.Errorf("ib-00 got %+v", rail1.Status.Allocations[0])
		}
		time.Sleep(500 * time.Millisecond)
		var after v1alpha1.IPPool
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rail0"}, &after); err != nil {
			t.Fatal(err)
		}
		if after.ResourceVersion != before {
			t.Errorf("rail0 was rewritten by an event for a node it does not select")
		}
	})

	t.Run("a deleted node's block is released", func(t *testing.T) {
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-05"}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "gpu-05's block released", func() (bool, string) {
			var p v1alpha1.IPPool
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "rail0"}, &p); err != nil {
				return false, err.Error()
			}
			return len(p.Status.Allocations) == 19, fmt.Sprint(len(p.Status.Allocations))
		})
	})

	t.Run("exhaustion is reported as an event", func(t *testing.T) {
		if err := create(&v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "tiny", Namespace: "default"},
			Spec: v1alpha1.IPPoolSpec{Subnet: "10.40.0.0/30", PerNodeBlockSize: 2, NodeSelector: railSelector("r0")}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a PoolExhausted event", func() (bool, string) {
			var evs eventsv1.EventList
			if err := c.List(ctx, &evs, client.InNamespace("default")); err != nil {
				return false, err.Error()
			}
			for _, e := range evs.Items {
				if e.Reason == "PoolExhausted" && e.Regarding.Name == "tiny" {
					return strings.Contains(e.Note, "18 selected node(s) have no block"), e.Note
				}
			}
			return false, fmt.Sprintf("%d events", len(evs.Items))
		})
	})

	t.Run("metrics and leader lease", func(t *testing.T) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`hwipam_pool_blocks_assigned{kind="IPPool",namespace="default",pool="rail0"} 19`,
			`hwipam_pool_blocks{kind="IPPool",namespace="default",pool="rail0"} 1023`,
			`hwipam_pool_selected_nodes_without_block{kind="IPPool",namespace="default",pool="tiny"} 18`,
			`hwipam_pool_reconcile_duration_seconds_count{kind="CIDRPool"}`,
			`hwipam_pool_status_writes_total{kind="IPPool"}`,
		} {
			if !strings.Contains(string(body), want) {
				t.Errorf("metrics lack %q", want)
			}
		}
		var lease coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: ipamcontroller.LeaderElectionID}, &lease); err != nil {
			t.Errorf("leader election lease: %v", err)
		}
	})
}
