package ipamnode_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/test/harness"
)

// daemonProcess is ipam-node running as a real process.
type daemonProcess struct {
	cmd  *exec.Cmd
	conn *grpc.ClientConn
	ipam nodev1.IPAMServiceClient
	info infov1.NodeInfoServiceClient
}

func startProcess(t *testing.T, bin, kubeconfig, dir string) *daemonProcess {
	t.Helper()
	sock := filepath.Join(dir, "daemon.sock")
	cmd := exec.Command(bin, "--node-name", node, "--kubeconfig", kubeconfig, "--ippools-namespace", "default",
		"--store-file", filepath.Join(dir, "store"), "--bind-address", "unix://"+sock,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cleanup-interval", "0",
		"--cni-skip-nv-ipam-binary-copy", "--cni-skip-nv-ipam-config-creation")
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &daemonProcess{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.conn, p.ipam, p.info = conn, nodev1.NewIPAMServiceClient(conn), infov1.NewNodeInfoServiceClient(conn)
	waitFor(t, "the daemon to serve the pool", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := p.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params("probe", "crash")})
		return err == nil
	})
	return p
}

// TestKill9DuringAllocateBurst kills the daemon with SIGKILL while 16 clients
// allocate, restarts it over the same store, and checks that every Allocate that
// returned success is still there and that no address is owned twice.
func TestKill9DuringAllocateBurst(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	if err := cp.Client.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	poolWithBlock(t, cp.Client, "crash", "10.8.0.0/16", "10.8.0.1", "10.8.64.0")
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.BuildBinary(t, "./cmd/ipam-node")
	dir := t.TempDir()
	p := startProcess(t, bin, kubeconfig, dir)

	var mu sync.Mutex
	succeeded := map[string]string{} // containerID -> address
	attempted := map[string]bool{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				cid := fmt.Sprintf("w%02d-%05d", w, i)
				mu.Lock()
				attempted[cid] = true
				mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := p.ipam.Allocate(ctx, &nodev1.AllocateRequest{Parameters: params(cid, "crash")})
				cancel()
				if err != nil {
					return // the daemon is gone
				}
				mu.Lock()
				succeeded[cid] = resp.Allocations[0].Ip
				mu.Unlock()
			}
		})
	}
	time.Sleep(700 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
	close(stop)
	wg.Wait()
	if len(succeeded) < 50 {
		t.Fatalf("only %d Allocates succeeded before the kill; the burst is too small to mean anything", len(succeeded))
	}
	t.Logf("%d Allocates succeeded, %d attempted before SIGKILL", len(succeeded), len(attempted))

	p2 := startProcess(t, bin, kubeconfig, dir)
	list, err := p2.info.ListAllocations(t.Context(), &infov1.ListAllocationsRequest{Pool: "crash"})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	stored := map[string]string{}
	for _, a := range list.Allocations {
		if other, dup := owner[a.Ip]; dup {
			t.Errorf("address %s owned by %s and %s after restart", a.Ip, other, a.ContainerId)
		}
		owner[a.Ip] = a.ContainerId
		stored[a.ContainerId] = a.Ip + "/16"
	}
	for cid, ip := range succeeded {
		if stored[cid] != ip {
			t.Errorf("Allocate for %s returned %s but after the crash the store has %q", cid, ip, stored[cid])
		}
	}
	for cid := range stored {
		if _, ok := succeeded[cid]; !ok && !attempted[cid] && cid != "probe" {
			t.Errorf("after restart the store holds %s, which no client asked for", cid)
		}
	}
}

// TestSIGTERMStopsCleanly: a real daemon stops with exit 0 on SIGTERM and leaves a
// store that opens again.
func TestSIGTERMStopsCleanly(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	poolWithBlock(t, cp.Client, "crash", "10.9.0.0/24", "10.9.0.1", "10.9.0.8")
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bin := harness.BuildBinary(t, "./cmd/ipam-node")
	dir := t.TempDir()
	p := startProcess(t, bin, kubeconfig, dir)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("ipam-node after SIGTERM: %v, want exit 0", err)
	}
	p2 := startProcess(t, bin, kubeconfig, dir)
	if _, err := p2.ipam.IsAllocated(t.Context(), &nodev1.IsAllocatedRequest{Parameters: params("probe", "crash")}); err != nil {
		t.Errorf("the allocation made before SIGTERM: %v", err)
	}
}

// TestFatalErrorExitsNonZero: a part that cannot start (the metrics port is
// taken) stops the daemon with an error, not a silent exit 0.
func TestFatalErrorExitsNonZero(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	bin := harness.BuildBinary(t, "./cmd/ipam-node")
	dir := t.TempDir()
	// An API server that is down does not stop the daemon; the taken port must.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--node-name", node, "--kubeconfig", kubeconfig, "--store-file", filepath.Join(dir, "store"),
		"--bind-address", "unix://"+filepath.Join(dir, "s.sock"), "--metrics-bind-address", l.Addr().String(),
		"--health-probe-bind-address", "0", "--cni-skip-nv-ipam-binary-copy", "--cni-skip-nv-ipam-config-creation")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() == 0 {
		t.Fatalf("ipam-node with its metrics port taken: %v, want a non-zero exit\n%s", err, out)
	}
	if !strings.Contains(string(out), "address already in use") {
		t.Errorf("the failure does not say what went wrong:\n%s", out)
	}
}
