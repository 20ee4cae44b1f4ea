package ipamnode_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/test/harness"
)

// TestNetworkOperatorRBAC runs the daemon with only what network-operator grants
// its node service account (get/list/watch pods, ippools, cidrpools): allocation
// works, the pools-in-use annotation is skipped with one warning, and the metrics
// endpoint reports the pool and the requests.
func TestNetworkOperatorRBAC(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	c := cp.Client
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	read := []string{"get", "list", "watch"}
	if err := c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nv-ipam-node"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: read},
		{APIGroups: []string{"nv-ipam.nvidia.com"}, Resources: []string{"ippools", "cidrpools"}, Verbs: read},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nv-ipam-node"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nv-ipam-node"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "nv-ipam-node"}},
	}); err != nil {
		t.Fatal(err)
	}
	restricted, err := cp.AddUser("nv-ipam-node")
	if err != nil {
		t.Fatal(err)
	}
	poolWithBlock(t, c, "p", "10.10.0.0/24", "10.10.0.1", "10.10.0.8")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	healthAddr := fmt.Sprintf("127.0.0.1:%d", freePortFor(t))
	var mu sync.Mutex
	var logs []string
	tree, err := fakesysfs.DGXH100(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemonLogged(t, restricted, t.TempDir(), func(o *ipamnode.Options) {
		o.AnnotationInterval = 100 * time.Millisecond
		o.SysfsRoot = tree.Root
		o.NICRescanInterval = 100 * time.Millisecond
		o.MetricsBindAddress = metricsAddr
		o.HealthProbeBindAddress = healthAddr
	}, func(line string) {
		mu.Lock()
		logs = append(logs, line)
		mu.Unlock()
	})
	waitFor(t, "an allocation under restricted RBAC", func() bool {
		_, err := d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("c1", "p")})
		return err == nil
	})
	count := func(subs ...string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range logs {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(l, s)
			}
			if all {
				n++
			}
		}
		return n
	}
	annotation := []string{"cannot annotate this node", "patch on nodes"}
	labels := []string{"cannot publish the NIC labels (allocation is not affected)", "patch on nodes"}
	waitFor(t, "the RBAC warnings", func() bool { return count(annotation...) > 0 && count(labels...) > 0 })
	time.Sleep(500 * time.Millisecond) // several more annotation attempts and NIC scans
	if n := count(annotation...); n != 1 {
		t.Errorf("%d pools-in-use RBAC warnings, want exactly one", n)
	}
	if n := count(labels...); n != 1 {
		t.Errorf("%d NIC label RBAC warnings, want exactly one", n)
	}
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[v1alpha1.PoolsInUseAnnotation]; ok {
		t.Errorf("annotation written without RBAC: %v", n.Annotations)
	}
	if len(n.Labels) != 0 {
		t.Errorf("labels written without RBAC: %v", n.Labels)
	}

	waitFor(t, "/readyz", func() bool {
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	body := scrape()
	for _, want := range []string{
		`hwipam_node_pool_allocations{pool="p",rail=""} 1`,
		`hwipam_node_pool_free_addresses{pool="p",rail=""} 7`,
		`hwipam_node_pool_active{pool="p",rail=""} 1`,
		`hwipam_node_store_commit_failures_total 0`,
		`hwipam_node_store_commit_seconds_total`,
		`hwipam_node_request_duration_seconds_count{code="OK",method="/nvidia.ipam.node.v1.IPAMService/Allocate"}`,
		`hwipam_node_store_transactions_total`,
		`hwipam_node_store_checkpoints_total`,
		`hwipam_node_nics 10`,
		// What the warnings say, for alerts: off for lack of RBAC.
		`hwipam_node_feature_forbidden{feature="nic-labels"} 1`,
		`hwipam_node_feature_forbidden{feature="node-annotations"} 1`,
		`hwipam_node_feature_forbidden{feature="stale-cleanup"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// What an admin adds (docs/nicclusterpolicy.md): get and patch on nodes. The
	// annotation and the labels then appear, and the gauges return to 0.
	if err := c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nv-ipam-node-labels"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nv-ipam-node-labels"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "nv-ipam-node-labels"},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "nv-ipam-node"}},
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the annotation and the NIC labels once patch on nodes is granted", func() bool {
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			t.Fatal(err)
		}
		return n.Annotations[v1alpha1.PoolsInUseAnnotation] == "p" && n.Labels["nic.hwipam.io/present"] == "true"
	})
	waitFor(t, "the forbidden gauges to return to 0", func() bool {
		body := scrape()
		return strings.Contains(body, `hwipam_node_feature_forbidden{feature="nic-labels"} 0`) &&
			strings.Contains(body, `hwipam_node_feature_forbidden{feature="node-annotations"} 0`)
	})
}
