package harness

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/nodeservice"
	"github.com/hwipam/hwipam/pkg/store"
)

// ServeNode runs the node daemon's gRPC services in-process, over a real store in
// a temporary directory, on a unix socket, with the given pools active on node
// "n1", and the plugin's compact endpoint beside it, as ipam-node does. It returns
// the socket as a unix:// address and the allocation state; both are torn down
// when the test ends. Tests of the daemon's clients (the CNI plugin, ipamctl) use
// it where the whole daemon process is not the point.
func ServeNode(tb testing.TB, pools ...*nodealloc.PoolConfig) (string, *nodealloc.Manager) {
	tb.Helper()
	return ServeNodeIn(tb, tb.TempDir(), nil, pools...)
}

// ServeNodeIn is ServeNode with the store and socket in dir (dir/store,
// dir/d.sock) and info as the service's GetInfo answer.
func ServeNodeIn(tb testing.TB, dir string, info *infov1.GetInfoResponse, pools ...*nodealloc.PoolConfig) (string, *nodealloc.Manager) {
	tb.Helper()
	return serveNode(tb, dir, info, nil, true, pools...)
}

// ServeNodeWithNICs is ServeNodeIn with nics as the daemon's NIC inventory
// (ListNICs).
func ServeNodeWithNICs(tb testing.TB, dir string, info *infov1.GetInfoResponse, nics nodeservice.NICSource,
	pools ...*nodealloc.PoolConfig) (string, *nodealloc.Manager) {
	tb.Helper()
	return serveNode(tb, dir, info, nics, true, pools...)
}

// ServeNodeGRPCOnly is ServeNode without the compact endpoint: a daemon of a
// version before it, or nv-ipam's.
func ServeNodeGRPCOnly(tb testing.TB, pools ...*nodealloc.PoolConfig) (string, *nodealloc.Manager) {
	tb.Helper()
	return serveNode(tb, tb.TempDir(), nil, nil, false, pools...)
}

func serveNode(tb testing.TB, dir string, info *infov1.GetInfoResponse, nics nodeservice.NICSource, fast bool,
	pools ...*nodealloc.PoolConfig) (string, *nodealloc.Manager) {
	tb.Helper()
	st, err := store.Open(filepath.Join(dir, "store"), store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(st, "n1")
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range pools {
		if err := m.SetPool(p); err != nil {
			tb.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "d.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	svc := &nodeservice.Service{Manager: m, Info: info, NICs: nics}
	nodev1.RegisterIPAMServiceServer(srv, svc)
	infov1.RegisterNodeInfoServiceServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	tb.Cleanup(srv.Stop)
	if fast {
		flis, err := net.Listen("unix", ipamwire.FastSocketPath(sock))
		if err != nil {
			tb.Fatal(err)
		}
		fs := nodeservice.NewFastServer(logr.Discard())
		fs.Register(&nodev1.IPAMService_ServiceDesc, svc)
		fs.Register(&infov1.NodeInfoService_ServiceDesc, svc)
		go func() { _ = fs.Serve(flis) }()
		tb.Cleanup(func() { fs.Stop(time.Second) })
	}
	return "unix://" + sock, m
}
