package ipamnode_test

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/test/harness"
)

// TestTakesOverAnNVIPAMNode starts the daemon, over TCP, on a node where nv-ipam
// left its JSON store: the allocations nv-ipam made are still there and are not
// handed out again, and the original file is kept.
func TestTakesOverAnNVIPAMNode(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	if err := cp.Client.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	poolWithBlock(t, cp.Client, "rail0", "10.3.0.0/24", "10.3.0.1", "10.3.0.4")
	dir := t.TempDir()
	// nv-ipam's store as its daemon writes it; the checksum is FNV-32a over the
	// encoding with checksum 0.
	canonical := `{"version":1,"checksum":0,"pools":{"rail0":{"name":"rail0","entries":{` +
		`"aaa_net1":{"container_id":"aaa","interface_name":"net1","ip_address":"10.3.0.1","metadata":{"create_time":"2025-05-01T00:00:00Z","pod_uuid":"u1","pod_name":"p1","pod_namespace":"default","device_id":"","pool_config_snapshot":""}},` +
		`"bbb_net1":{"container_id":"bbb","interface_name":"net1","ip_address":"10.3.0.3","metadata":{"create_time":"2025-05-01T00:00:00Z","pod_uuid":"u2","pod_name":"p2","pod_namespace":"default","device_id":"","pool_config_snapshot":""}}` +
		`},"last_pool_config":"","last_reserved_ip":"10.3.0.3"}}}`
	h := fnv.New32a()
	h.Write([]byte(canonical))
	file := strings.Replace(canonical, `"checksum":0`, fmt.Sprintf(`"checksum":%d`, h.Sum32()), 1)
	if err := os.WriteFile(filepath.Join(dir, "store"), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freeTCPPort(t)
	d := startDaemonTCP(t, cp, dir, port)
	ctx := t.Context()
	for _, cid := range []string{"aaa", "bbb"} {
		if _, err := d.ipam.IsAllocated(ctx, &nodev1.IsAllocatedRequest{Parameters: params(cid, "rail0")}); err != nil {
			t.Errorf("nv-ipam's allocation for %s is gone after the switch: %v", cid, err)
		}
	}
	var got []string
	for _, cid := range []string{"new1", "new2"} {
		var resp *nodev1.AllocateResponse
		waitFor(t, "the pool to sync", func() bool {
			var err error
			resp, err = d.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(cid, "rail0")})
			return err == nil
		})
		got = append(got, resp.Allocations[0].Ip)
	}
	if fmt.Sprint(got) != "[10.3.0.4/24 10.3.0.2/24]" {
		t.Errorf("new allocations = %v, want the two addresses nv-ipam did not hold, after its last reserved one", got)
	}
	backup, err := os.ReadFile(filepath.Join(dir, "store") + store.BackupSuffix)
	if err != nil || string(backup) != file {
		t.Errorf("nv-ipam's store was not kept as a backup: %v", err)
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	return freePortFor(t)
}

func startDaemonTCP(t *testing.T, cp *harness.ControlPlane, dir string, port int) *daemon {
	t.Helper()
	return startDaemon(t, cp.Config, dir, func(o *ipamnode.Options) {
		o.BindAddress = fmt.Sprintf("tcp://127.0.0.1:%d", port)
	})
}
