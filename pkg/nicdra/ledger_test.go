package nicdra_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodeservice"
	"github.com/hwipam/hwipam/pkg/rails"
	"github.com/hwipam/hwipam/pkg/store"
)

// ledgerNode is the node's CNI path (the node service, as the CNI plugin
// calls it) and its DRA driver's Preparer, sharing one allocation state and
// one PortLedger, as ipam-node wires them. Port ibp24s0 (0000:18:00.0) is the
// one both want: a NAD's macvlan master, and a claim's device.
type ledgerNode struct {
	*node
	p   *nicdra.Preparer
	svc *nodeservice.Service
	// pauseTake, when set, is called by the CNI path between its check of
	// the port and its allocation's commit.
	pauseTake func()
}

// Port, Take and Changed are nodeservice.Ports as ipam-node's: the port of a
// master netdev from the inventory, taken in the ledger.
func (n *ledgerNode) Functions(dev rails.Device) []string {
	for _, c := range n.inv.NICs {
		for _, nd := range c.Netdevs {
			if nd == dev.Master || nd == dev.Netdev {
				return []string{c.PCIAddress}
			}
		}
	}
	return nil
}

func (n *ledgerNode) Take(dev rails.Device, ports ...string) (string, func()) {
	claim, done := n.p.Ledger.TakeForCNI(append(ports, dev.DeviceID, dev.PCIBusID, dev.Master, dev.Netdev)...)
	if claim == "" && n.pauseTake != nil {
		n.pauseTake()
	}
	return claim, done
}

func (n *ledgerNode) Changed() {}

func newLedgerNode(t *testing.T) *ledgerNode {
	t.Helper()
	n := &ledgerNode{node: newNode(t)}
	n.p = n.preparer()
	n.p.Ledger = &nicdra.PortLedger{InUse: func() map[string]string {
		out := map[string]string{}
		_ = n.alloc.EachAllocation("", func(_ string, a store.Allocation) error {
			for _, port := range a.UsedPorts() {
				if !nicdra.OwnedByDRA(a) {
					out[port] = "pod " + a.PodNamespace + "/" + a.PodName
				}
			}
			return nil
		})
		return out
	}}
	n.svc = &nodeservice.Service{Manager: n.alloc.Manager, Ports: n}
	return n
}

// add is a CNI ADD of a macvlan on ibp24s0 for container cid.
func (n *ledgerNode) add(t *testing.T, cid string) error {
	_, err := n.svc.Allocate(t.Context(), &nodev1.AllocateRequest{Parameters: n.params(cid)})
	return err
}

func (n *ledgerNode) del(t *testing.T, cid string) {
	t.Helper()
	if _, err := n.svc.Deallocate(t.Context(), &nodev1.DeallocateRequest{Parameters: n.params(cid)}); err != nil {
		t.Fatal(err)
	}
}

func (n *ledgerNode) params(cid string) *nodev1.IPAMParameters {
	return &nodev1.IPAMParameters{Pools: []string{"spare"}, CniContainerid: cid, CniIfname: "net1", NetworkName: "macvlan-rail0",
		Master: "ibp24s0", Metadata: &nodev1.IPAMMetadata{K8SPodName: "pod-" + cid, K8SPodNamespace: "ml", K8SPodUid: "uid-" + cid}}
}

// owners lists who holds an address on the port: CNI containers and claims.
func (n *ledgerNode) owners(t *testing.T) []string {
	t.Helper()
	var out []string
	_ = n.alloc.EachAllocation("", func(pool string, a store.Allocation) error {
		switch {
		case nicdra.OwnedByDRA(a) && strings.HasSuffix(a.IfName, "pci-0000-18-00-0"):
			out = append(out, "claim "+a.ContainerID+" "+pool)
		case a.Port == "0000:18:00.0":
			out = append(out, "cni "+a.ContainerID+" "+pool)
		}
		return nil
	})
	return out
}

// Issue 45, item 4: a CNI ADD and a prepare could both take one port. The
// prepare checked the CNI path's ports (the store) when it planned; the CNI
// path asked a snapshot of the claims' ports that was updated only after the
// prepare returned. No lock spanned either side's check and commit. Now both
// take the port in one PortLedger, check and mark in one step.
func TestCNIAndPrepareNeverBothTakeAPort(t *testing.T) {
	ctx := t.Context()
	t.Run("the ADD checked first, its commit not yet done", func(t *testing.T) {
		n := newLedgerNode(t)
		checked, commit := make(chan struct{}), make(chan struct{})
		n.pauseTake = func() { close(checked); <-commit }
		added := make(chan error, 1)
		go func() { added <- n.add(t, "cid-1") }()
		<-checked
		_, err := n.p.Prepare(ctx, claim("u1", map[string]string{"nic": "pci-0000-18-00-0"}))
		if !errors.Is(err, nicdra.ErrPortUnavailable) || !strings.Contains(err.Error(), "taking it right now") {
			t.Errorf("prepare while an ADD is adding on the port: %v, want ErrPortUnavailable", err)
		}
		close(commit)
		if err := <-added; err != nil {
			t.Fatal(err)
		}
		n.pauseTake = nil
		// Committed: the store says it.
		if _, err := n.p.Prepare(ctx, claim("u1", map[string]string{"nic": "pci-0000-18-00-0"})); !errors.Is(err, nicdra.ErrPortUnavailable) ||
			!strings.Contains(err.Error(), "in use by pod ml/pod-cid-1") {
			t.Errorf("prepare once the ADD committed: %v, want ErrPortUnavailable naming the pod", err)
		}
		if got := n.owners(t); len(got) != 1 || !strings.HasPrefix(got[0], "cni cid-1") {
			t.Errorf("owners of the port %v, want the ADD alone", got)
		}
		// Gone: the claim gets it.
		n.del(t, "cid-1")
		if _, err := n.p.Prepare(ctx, claim("u1", map[string]string{"nic": "pci-0000-18-00-0"})); err != nil {
			t.Fatalf("prepare once the ADD's pod is gone: %v", err)
		}
	})

	t.Run("the prepare checked first, its record not yet written", func(t *testing.T) {
		n := newLedgerNode(t)
		writing, write := make(chan struct{}), make(chan struct{})
		first := true
		n.p.WriteCheckpoint = func(c *nicdra.Checkpoint) error {
			if first {
				first = false
				close(writing)
				<-write
			}
			return n.p.Checkpoint.Save(c)
		}
		prepared := make(chan error, 1)
		go func() {
			_, err := n.p.Prepare(ctx, claim("u1", map[string]string{"nic": "pci-0000-18-00-0"}))
			prepared <- err
		}()
		<-writing
		err := n.add(t, "cid-1")
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ml/c-u1") {
			t.Errorf("ADD while a prepare takes the port: %v, want FailedPrecondition naming claim ml/c-u1", err)
		}
		close(write)
		if err := <-prepared; err != nil {
			t.Fatal(err)
		}
		if err := n.add(t, "cid-2"); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("ADD once the claim is prepared: %v, want FailedPrecondition", err)
		}
		if got := n.owners(t); len(got) != 2 || !strings.HasPrefix(got[0], "claim u1") {
			t.Errorf("owners of the port %v, want the claim alone (its two pools)", got)
		}
		if err := n.p.Unprepare(ctx, "u1"); err != nil {
			t.Fatal(err)
		}
		if err := n.add(t, "cid-3"); err != nil {
			t.Errorf("ADD once the claim is unprepared: %v", err)
		}
	})

	// Random interleavings: an ADD and a prepare race for the port, with
	// random delays on each side, again and again; never do both get it.
	t.Run("random races", func(t *testing.T) {
		seed := uint64(time.Now().UnixNano())
		if s := os.Getenv("HWIPAM_LEDGER_SEED"); s != "" {
			var err error
			if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("seed %d (HWIPAM_LEDGER_SEED=%d replays the delays)", seed, seed)
		rnd := rand.New(rand.NewPCG(seed, seed))
		n := newLedgerNode(t)
		var mu sync.Mutex
		delay := func() time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return time.Duration(rnd.IntN(400)) * time.Microsecond
		}
		n.pauseTake = func() { time.Sleep(delay()) }
		n.p.WriteCheckpoint = func(c *nicdra.Checkpoint) error {
			time.Sleep(delay())
			return n.p.Checkpoint.Save(c)
		}
		wins := map[string]int{}
		for i := range 60 {
			cid, uid := fmt.Sprintf("cid-%d", i), fmt.Sprintf("u%d", i)
			var wg sync.WaitGroup
			var addErr, prepErr error
			startAdd, startPrep := delay(), delay()
			wg.Add(2)
			go func() { defer wg.Done(); time.Sleep(startAdd); addErr = n.add(t, cid) }()
			go func() {
				defer wg.Done()
				time.Sleep(startPrep)
				_, prepErr = n.p.Prepare(ctx, claim(uid, map[string]string{"nic": "pci-0000-18-00-0"}))
			}()
			wg.Wait()
			switch {
			case addErr == nil && prepErr == nil:
				t.Fatalf("race %d: the ADD and the prepare both got port ibp24s0: owners %v", i, n.owners(t))
			case addErr == nil:
				wins["cni"]++
				n.del(t, cid)
			case prepErr == nil:
				wins["claim"]++
				if err := n.p.Unprepare(ctx, types.UID(uid)); err != nil {
					t.Fatal(err)
				}
			default:
				// One of the two checks runs first, under the one lock: it
				// wins, and the other is refused because of it.
				t.Fatalf("race %d: neither got the port: ADD %v; prepare %v", i, addErr, prepErr)
			}
			if got := n.owners(t); len(got) != 0 {
				t.Fatalf("race %d: owners after both let go: %v", i, got)
			}
		}
		t.Logf("outcomes %v", wins)
		if wins["cni"]+wins["claim"] == 0 {
			t.Errorf("no race was won by either side: %v", wins)
		}
	})
}
