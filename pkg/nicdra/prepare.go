package nicdra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/rails"
)

// Allocator is the node's allocation state as the driver uses it: the same
// pools, blocks, store and invariants as the CNI path. *nodealloc.Manager
// satisfies it.
type Allocator interface {
	Allocate(ctx context.Context, req *nodealloc.Request) ([]nodealloc.Result, error)
	Deallocate(ctx context.Context, req *nodealloc.Request) error
}

var _ Allocator = (*nodealloc.Manager)(nil)

// Preparer turns a claim's allocated nic.hwipam.io devices into addresses (and
// back): each device gets one from the pool of its rail, or of the pool its
// configuration names, recorded in the store under the claim's UID as container
// ID and "<request>:<device>" as interface, with network nic.hwipam.io (which no
// CNI GC matches). Prepare is idempotent (the kubelet calls it again, also after
// the daemon restarted); Unprepare of a claim it does not know succeeds.
type Preparer struct {
	Allocator  Allocator
	Checkpoint CheckpointFile
	// Inventory returns the node's NICs now; Rails is the rail map.
	Inventory func() *nicdiscovery.Inventory
	Rails     nicdiscovery.Rails
	// PoolsForRail returns the pools labelled for a rail, of a kind
	// (v1alpha1.KindIPPool or KindCIDRPool): one, or two for dual-stack; and
	// whether the pools are known (listed from the API server since the
	// daemon started): while they are not, a prepare that needs them fails
	// with ErrNotReady.
	PoolsForRail func(rail, kind string) (pools []string, known bool)
	// BootID is the node's, recorded with the checkpoint.
	BootID string
	// Ports says which ports are not to be handed out (uplink, excluded, in
	// use by the CNI path); nil: none known.
	Ports *PortUse
	// Reclaim, when set, brings a device's netdev back to its host name
	// before its claim is unprepared (Attacher.Reclaim: a StopPodSandbox the
	// driver missed leaves a port under its pod name); an error fails the
	// Unprepare, which the kubelet retries.
	Reclaim func(PreparedDevice) error

	mu    sync.Mutex
	state *Checkpoint
}

// load reads the checkpoint once; with mu held.
func (p *Preparer) load() error {
	if p.state != nil {
		return nil
	}
	c, err := p.Checkpoint.Load()
	if err != nil {
		return err
	}
	if c.BootID != "" && p.BootID != "" && c.BootID != p.BootID && p.Inventory != nil {
		c.afterReboot(p.Inventory()) // what the attach recorded describes namespaces that are gone
	}
	p.state = c
	return nil
}

// save writes the checkpoint; with mu held.
func (p *Preparer) save() error {
	p.state.BootID = p.BootID
	return p.Checkpoint.Save(p.state)
}

// Prepare allocates the addresses of the claim's devices of this driver and
// returns them, as the checkpoint keeps them. A claim prepared before returns
// what it got then. When any device fails, what the claim got is released and
// the error says what was wrong (errors.Is ErrConfig, nodealloc.ErrInvalid,
// ErrUnknownPool, ErrExhausted: no retry fixes those but a changed claim or
// pool; ErrNotReady: the kubelet's retry will).
func (p *Preparer) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]PreparedDevice, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.load(); err != nil {
		return nil, err
	}
	if prev, ok := p.state.Claims[claim.UID]; ok && prev.State == PrepareCompleted {
		return slices.Clone(prev.Devices), nil
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	pod, err := podOf(claim)
	if err != nil {
		return nil, err
	}
	// Recorded before anything is allocated: a crash from here on leaves a
	// claim whose prepare started, which Unprepare (or the next Prepare)
	// finishes.
	if err := p.checkNotInUse(claim); err != nil {
		return nil, err
	}
	if err := CheckConfigTargets(claim.Status.Allocation); err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	if err := p.checkInterfaceNames(claim, pod, p.Inventory()); err != nil {
		return nil, err
	}
	pc := PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, PodName: pod.name, PodUID: pod.uid, State: PrepareStarted}
	p.state.Claims[claim.UID] = pc
	if err := p.save(); err != nil {
		return nil, err
	}
	inv := WithPreparedNetdevs(p.Inventory(), PreparedNetdevs(p.state.Claims))
	byRail := rails.PFRails(inv, p.Rails)
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue // another driver's device of the same claim
		}
		d, err := p.prepareDevice(ctx, claim, pod, r, inv, byRail)
		if err == nil {
			pc.Devices = append(pc.Devices, d)
			continue
		}
		p.release(ctx, claim.UID, pc)
		delete(p.state.Claims, claim.UID)
		if serr := p.save(); serr != nil {
			return nil, errors.Join(err, serr)
		}
		return nil, fmt.Errorf("claim %s/%s, request %s, device %s: %w", claim.Namespace, claim.Name, r.Request, r.Device, err)
	}
	pc.State = PrepareCompleted
	p.state.Claims[claim.UID] = pc
	if err := p.save(); err != nil {
		return nil, err
	}
	return slices.Clone(pc.Devices), nil
}

// prepareDevice allocates one device's addresses.
func (p *Preparer) prepareDevice(ctx context.Context, claim *resourceapi.ResourceClaim, pod podRef,
	r resourceapi.DeviceRequestAllocationResult, inv *nicdiscovery.Inventory, byRail map[string]string) (PreparedDevice, error) {
	cfg, err := ConfigFor(claim.Status.Allocation, r.Request)
	if err != nil {
		return PreparedDevice{}, err
	}
	i := slices.IndexFunc(inv.NICs, func(n nicdiscovery.NIC) bool { return DeviceName(n.PCIAddress) == r.Device })
	if i < 0 {
		return PreparedDevice{}, fmt.Errorf("%w: no NIC port %s on this node (its inventory has changed since the "+
			"scheduler allocated it): delete the pod and its claim to have another allocated", nodealloc.ErrInvalid, r.Device)
	}
	n := inv.NICs[i]
	if err := p.Ports.check(inv, n); err != nil {
		return PreparedDevice{}, err
	}
	pf := n.PCIAddress
	if n.Function == nicdiscovery.FunctionVF {
		pf = n.PhysFn
	}
	d := PreparedDevice{Request: r.Request, Device: r.Device, PCIAddress: n.PCIAddress, Rail: byRail[pf],
		InterfaceName: cfg.InterfaceName, PoolType: strings.ToLower(cfg.PoolType)}
	if len(n.Netdevs) > 0 {
		d.HostNetdev = n.Netdevs[0]
	} else if err := CheckNetdev(inv, n); err != nil {
		return PreparedDevice{}, err
	}
	if len(n.Ports) > 0 {
		d.MTU, d.MAC = n.Ports[0].MTU, n.Ports[0].MAC
	}
	if d.InterfaceName == "" {
		d.InterfaceName = d.HostNetdev
	}
	if d.PoolType == "" {
		d.PoolType = "ippool"
	}
	kind := v1alpha1.KindIPPool
	if d.PoolType == "cidrpool" {
		kind = v1alpha1.KindCIDRPool
	}
	d.Pools = cfg.Pools()
	if len(d.Pools) == 0 {
		if d.Rail == "" {
			return PreparedDevice{}, fmt.Errorf("%w: device %s has no rail (no labelled port) and its configuration "+
				"names no pool: name one in a %s configuration", nodealloc.ErrInvalid, r.Device, ConfigKind)
		}
		if d.Pools, err = p.railPools(d.Rail, kind); err != nil {
			return PreparedDevice{}, err
		}
	}
	req := p.request(claim.UID, d, pod)
	req.Index = cfg.IPIndex
	for _, s := range cfg.IPs {
		a, _ := netip.ParseAddr(s) // checked by ConfigFor
		req.RequestedIPs = append(req.RequestedIPs, a)
	}
	res, err := p.Allocator.Allocate(ctx, req)
	if err != nil {
		return PreparedDevice{}, err
	}
	for _, x := range res {
		d.Addresses = append(d.Addresses, x.Addr.String())
		if x.Gateway.IsValid() {
			if d.Gateway == "" {
				d.Gateway = x.Gateway.String()
			}
			d.Gateways = append(d.Gateways, x.Gateway.String())
		}
		for _, rt := range x.Routes {
			d.Routes = append(d.Routes, rt.String())
		}
	}
	return d, nil
}

// request is the allocation request of a claim's device.
func (p *Preparer) request(uid types.UID, d PreparedDevice, pod podRef) *nodealloc.Request {
	kind := v1alpha1.KindIPPool
	if d.PoolType == "cidrpool" {
		kind = v1alpha1.KindCIDRPool
	}
	return &nodealloc.Request{Pools: d.Pools, Kind: kind, ContainerID: string(uid), IfName: d.Request + ":" + d.Device,
		Meta: nodealloc.Metadata{PodName: pod.name, PodNamespace: pod.namespace, PodUID: pod.uid, DeviceID: d.PCIAddress,
			Rail: d.Rail, Network: DriverName, Owner: OwnerDRA}}
}

// release releases the devices of a claim; errors are left for the claim
// garbage collection (the addresses stay held meanwhile, never doubled).
func (p *Preparer) release(ctx context.Context, uid types.UID, pc PreparedClaim) {
	for _, d := range pc.Devices {
		_ = p.Allocator.Deallocate(ctx, p.request(uid, d, podRef{}))
	}
}

// Unprepare releases a claim's addresses and forgets it; a claim it does not
// know (prepared by no one, or unprepared already) is no error.
func (p *Preparer) Unprepare(ctx context.Context, uid types.UID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.load(); err != nil {
		return err
	}
	pc, ok := p.state.Claims[uid]
	if !ok {
		return nil
	}
	for _, d := range pc.Devices {
		if p.Reclaim != nil {
			if err := p.Reclaim(d); err != nil { // a port left under its pod name gets its own back
				return fmt.Errorf("claim %s/%s: %w", pc.Namespace, pc.Name, err)
			}
		}
	}
	for _, d := range pc.Devices {
		if err := p.Allocator.Deallocate(ctx, p.request(uid, d, podRef{})); err != nil {
			return fmt.Errorf("releasing claim %s/%s's device %s: %w", pc.Namespace, pc.Name, d.Device, err)
		}
	}
	delete(p.state.Claims, uid)
	return p.save()
}

// checkNotInUse refuses a claim that names a device another prepared claim
// has: the scheduler never allocates one device twice, so it can only be a
// claim allocated from a stale slice, and the device cannot be in two pods.
// With mu held.
func (p *Preparer) checkNotInUse(claim *resourceapi.ResourceClaim) error {
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		for uid, other := range p.state.Claims {
			if uid == claim.UID {
				continue
			}
			for _, d := range other.Devices {
				if d.Device == r.Device {
					return fmt.Errorf("%w: device %s of claim %s/%s is in use by claim %s/%s (UID %s), prepared on this node "+
						"and not unprepared: delete one of the two claims", nodealloc.ErrInvalid, r.Device, claim.Namespace,
						claim.Name, other.Namespace, other.Name, uid)
				}
			}
		}
	}
	return nil
}

// PodDevices returns the devices prepared for the pod with this UID, for the
// attach when its sandbox starts and stops.
func (p *Preparer) PodDevices(podUID string) []PreparedDevice {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.load(); err != nil {
		return nil
	}
	var out []PreparedDevice
	for _, pc := range p.state.Claims {
		if pc.PodUID == podUID && pc.State == PrepareCompleted {
			out = append(out, pc.Devices...)
		}
	}
	return out
}

// DeviceAttached records what the attach learnt of a device's host link (its
// MAC and MTU), for the status and for the way back.
func (p *Preparer) DeviceAttached(podUID string, d PreparedDevice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.load() != nil {
		return
	}
	for uid, pc := range p.state.Claims {
		if pc.PodUID != podUID {
			continue
		}
		changed := false
		for i := range pc.Devices {
			if pc.Devices[i].Device == d.Device && pc.Devices[i].recordAttach(d) {
				changed = true
			}
		}
		if changed {
			p.state.Claims[uid] = pc
			_ = p.save() // the hook must not fail for it: the record is for the MTU on the way back
		}
	}
}

// Claims returns a copy of the prepared claims (ipamctl, garbage collection).
func (p *Preparer) Claims() (map[types.UID]PreparedClaim, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.load(); err != nil {
		return nil, err
	}
	return maps.Clone(p.state.Claims), nil
}

// podRef is the pod a claim is reserved for.
type podRef struct{ namespace, name, uid string }

// podOf returns the pod the claim is reserved for: the allocation records it,
// as the CNI path records the pod of an interface.
func podOf(claim *resourceapi.ResourceClaim) (podRef, error) {
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			return podRef{namespace: claim.Namespace, name: r.Name, uid: string(r.UID)}, nil
		}
	}
	return podRef{}, fmt.Errorf("%w: claim %s/%s is reserved for no pod", nodealloc.ErrInvalid, claim.Namespace, claim.Name)
}
