package ipamwire_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// pool is net-a with four addresses, the first the gateway.
func pool() *nodealloc.PoolConfig {
	start, end := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.4")
	return &nodealloc.PoolConfig{Name: "net-a", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.9.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: start, DefaultGateway: true}
}

func params(cid string, pools ...string) *ipamwire.Params {
	return &ipamwire.Params{Pools: pools, ContainerID: cid, IfName: "net1", PodName: "p-" + cid, PodNamespace: "ns",
		PoolType: ipamwire.PoolTypeIPPool, NetworkName: "net-a"}
}

func dial(t *testing.T, target string) *ipamwire.Client {
	t.Helper()
	c, err := ipamwire.Dial(target, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestBothTransportsAnswerAlike makes the same calls over the compact endpoint
// and over gRPC (a daemon without the endpoint) and wants the same answers and
// codes — the daemon's, unchanged.
func TestBothTransportsAnswerAlike(t *testing.T) {
	fastSock, _ := harness.ServeNode(t, pool())
	grpcSock, _ := harness.ServeNodeGRPCOnly(t, pool())
	type outcome struct {
		code ipamwire.Code
		text string
	}
	results := map[ipamwire.Transport][]outcome{}
	for _, target := range []string{fastSock, grpcSock} {
		c := dial(t, target)
		ctx := t.Context()
		record := func(s string, err error) {
			results[c.Transport()] = append(results[c.Transport()], outcome{ipamwire.CodeOf(err), s + "|" + ipamwire.MessageOf(err)})
		}
		allocs, err := c.Allocate(ctx, params("c1", "net-a"))
		if err != nil || len(allocs) != 1 || allocs[0].IP != "10.9.0.2/24" || allocs[0].Gateway != "10.9.0.1" ||
			allocs[0].PoolType != ipamwire.PoolTypeIPPool || len(allocs[0].Routes) != 1 || allocs[0].Routes[0] != "0.0.0.0/0" {
			t.Fatalf("%s: Allocate = %+v %v", c.Transport(), allocs, err)
		}
		record(allocs[0].IP, nil)
		for _, cid := range []string{"c2", "c3"} {
			_, err := c.Allocate(ctx, params(cid, "net-a"))
			record(cid, err)
		}
		_, err = c.Allocate(ctx, params("c4", "net-a"))
		if ipamwire.CodeOf(err) != ipamwire.ResourceExhausted {
			t.Errorf("%s: full block: %v, want ResourceExhausted", c.Transport(), err)
		}
		record("exhausted", err)
		_, err = c.Allocate(ctx, params("c5", "nope"))
		if ipamwire.CodeOf(err) != ipamwire.NotFound {
			t.Errorf("%s: unknown pool: %v, want NotFound", c.Transport(), err)
		}
		record("unknown pool", err)
		bad := params("c6", "net-a")
		bad.IfName = ""
		_, err = c.Allocate(ctx, bad)
		if ipamwire.CodeOf(err) != ipamwire.InvalidArgument {
			t.Errorf("%s: no ifname: %v, want InvalidArgument", c.Transport(), err)
		}
		record("no ifname", err)
		record("is allocated", c.IsAllocated(ctx, params("c1", "net-a")))
		record("is allocated, never", c.IsAllocated(ctx, params("never", "net-a")))
		recs, err := c.ListAllocations(ctx, "net-a")
		if err != nil || len(recs) != 3 || recs[0].Network != "net-a" {
			t.Errorf("%s: ListAllocations = %+v %v", c.Transport(), recs, err)
		}
		pools, err := c.ListPools(ctx)
		if err != nil || len(pools) != 1 || pools[0].Key != "net-a" || !pools[0].Active {
			t.Errorf("%s: ListPools = %+v %v", c.Transport(), pools, err)
		}
		record("deallocate", c.Deallocate(ctx, params("c1", "net-a")))
		record("deallocate again", c.Deallocate(ctx, params("c1", "net-a")))
		_, err = c.Invoke(ctx, "/nvidia.ipam.node.v1.IPAMService/NoSuchMethod", nil)
		if ipamwire.CodeOf(err) != ipamwire.Unimplemented {
			t.Errorf("%s: unknown method: %v, want Unimplemented", c.Transport(), err)
		}
	}
	fast, grpc := results[ipamwire.TransportFast], results[ipamwire.TransportGRPC]
	if len(fast) == 0 || len(fast) != len(grpc) {
		t.Fatalf("transports used: %v", results)
	}
	for i := range fast {
		if fast[i] != grpc[i] {
			t.Errorf("call %d: compact endpoint %+v, gRPC %+v", i, fast[i], grpc[i])
		}
	}
}

// TestFallsBackToGRPC: with no compact endpoint, or a stale socket file of a
// daemon that is gone, the client uses the gRPC socket.
func TestFallsBackToGRPC(t *testing.T) {
	target, _ := harness.ServeNodeGRPCOnly(t, pool())
	if c := dial(t, target); c.Transport() != ipamwire.TransportGRPC {
		t.Errorf("no compact endpoint: transport %s", c.Transport())
	}
	// A stale socket: bound, then closed, leaves the file with no listener.
	stale := ipamwire.FastSocketPath(strings.TrimPrefix(target, "unix://"))
	lis, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = lis.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("the stale socket file is gone: %v", err)
	}
	c := dial(t, target)
	if c.Transport() != ipamwire.TransportGRPC {
		t.Errorf("stale compact socket: transport %s", c.Transport())
	}
	if _, err := c.Allocate(t.Context(), params("c1", "net-a")); err != nil {
		t.Errorf("Allocate over gRPC: %v", err)
	}
}

// TestCompactEndpointAloneSuffices: with the gRPC socket gone, a client still
// works through the compact endpoint — it does not touch the gRPC socket.
func TestCompactEndpointAloneSuffices(t *testing.T) {
	target, m := harness.ServeNode(t, pool())
	if err := os.Remove(strings.TrimPrefix(target, "unix://")); err != nil {
		t.Fatal(err)
	}
	c := dial(t, target)
	if _, err := c.Allocate(t.Context(), params("c1", "net-a")); err != nil {
		t.Fatal(err)
	}
	if n := len(m.Allocations("net-a")["net-a"]); n != 1 {
		t.Errorf("the daemon holds %d allocations, want 1", n)
	}
}

func TestUnreachableDaemon(t *testing.T) {
	dir := t.TempDir()
	_, err := ipamwire.Dial("unix://"+filepath.Join(dir, "daemon.sock"), time.Now().Add(time.Second))
	if ipamwire.CodeOf(err) != ipamwire.Unavailable || !strings.Contains(err.Error(), "daemon.sock") {
		t.Errorf("no daemon: %v, want Unavailable naming the socket", err)
	}
	if _, err := ipamwire.Dial("unix://", time.Now().Add(time.Second)); ipamwire.CodeOf(err) != ipamwire.InvalidArgument {
		t.Errorf("empty address: %v, want InvalidArgument", err)
	}

	// A listener that accepts and never answers: the call ends at the deadline.
	for _, name := range []string{"daemon-fast.sock", "grpc.sock"} {
		sock := filepath.Join(dir, name)
		lis, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lis.Close() })
		go func() {
			var held []net.Conn // kept open, unanswered, until the listener closes
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				held = append(held, c)
			}
		}()
		target := "unix://" + filepath.Join(dir, "daemon.sock")
		if name == "grpc.sock" {
			target = "unix://" + sock
		}
		start := time.Now()
		c, err := ipamwire.Dial(target, time.Now().Add(300*time.Millisecond))
		if err == nil {
			_, err = c.Allocate(context.Background(), params("c1", "net-a"))
			_ = c.Close()
		}
		if ipamwire.CodeOf(err) != ipamwire.DeadlineExceeded || time.Since(start) > 5*time.Second {
			t.Errorf("%s silent: %v after %s, want DeadlineExceeded at the deadline", name, err, time.Since(start))
		}
	}
}
