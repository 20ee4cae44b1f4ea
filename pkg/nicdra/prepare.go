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

	"github.com/go-logr/logr"
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
//
// Crashes: before allocating anything, Prepare records the claim as
// PrepareStarted with every device it will get and the pools each one's
// addresses come from. After a crash at any point the next Prepare finishes it
// in those pools (an allocation is idempotent per claim and device), and
// Unprepare releases them (releasing what is not held succeeds). Memory
// follows the checkpoint file: it changes only once the file is written.
//
// Locks: Prepare and Unprepare are serialized, and hold their lock across the
// store and the checkpoint's fsyncs; the runtime's hooks (PodDevices,
// DeviceAttached, Refusal) answer from memory under a lock that is never held
// across I/O, so a slow prepare never holds up a sandbox.
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
	// Ledger, when set, is where a prepare takes its ports, under the lock
	// the CNI path takes them under (PortLedger): set, a CNI ADD and a
	// prepare never both get one port. It learns the checkpoint's claims
	// from the Preparer.
	Ledger *PortLedger
	// HostState, when set, reads the device's host link as the prepare finds
	// it (Attacher.HostState): recorded with the claim, so that the detach
	// and the claim collection know the device and its state on the host
	// even when the attach's own record is lost with the process.
	HostState func(PreparedDevice) (Attachment, bool, error)
	// WriteCheckpoint, when set, writes the checkpoint instead of
	// Checkpoint.Save (tests inject failed and torn writes with it).
	WriteCheckpoint func(*Checkpoint) error
	// Log gets what the runtime's hooks cannot return (a checkpoint write
	// after an attach that failed).
	Log logr.Logger

	// work serializes Prepare, Unprepare and every checkpoint write; it is
	// held across I/O. loading serializes reading the file.
	work, loading sync.Mutex
	// mu guards what follows; it is never held across I/O.
	mu sync.RWMutex
	// state is the checkpoint as last written, plus what DeviceAttached
	// learnt since (dirty); replaced whole, never changed in place.
	state   *Checkpoint
	loadErr error
	dirty   bool
	// persisting: a persist goroutine is started and has not yet taken the
	// state to write (DeviceAttached starts one only then).
	persisting bool
	// dropped is memory as it was when a write failed (state is then read
	// again from the file): what DeviceAttached recorded in it is carried
	// into the checkpoint read back (see carryAttach).
	dropped *Checkpoint
	// refused are the pods reserved on a prepared claim besides the pod it
	// was prepared for, by pod UID (see Refusal).
	refused map[string]error
}

// ErrSharedClaim is Prepare's refusal of a claim reserved for more than one
// pod, and Refusal's of a pod that shares a prepared claim: the claim's
// devices move into one pod's network namespace.
var ErrSharedClaim = errors.New("a claim of nic.hwipam.io devices cannot be shared by pods")

// current returns the checkpoint as memory has it, reading the file the
// first time; a file it cannot read is read again at the next call, so that
// a checkpoint restored or moved away is noticed without a restart.
func (p *Preparer) current() (*Checkpoint, error) {
	p.mu.RLock()
	st := p.state
	p.mu.RUnlock()
	if st != nil {
		return st, nil
	}
	p.loading.Lock()
	defer p.loading.Unlock()
	p.mu.RLock()
	st = p.state
	p.mu.RUnlock()
	if st != nil {
		return st, nil
	}
	c, err := p.Checkpoint.Load()
	if err == nil && c.BootID != "" && p.BootID != "" && c.BootID != p.BootID && p.Inventory != nil {
		c.afterReboot(p.Inventory()) // what the attach recorded describes namespaces that are gone
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.loadErr = err
		return nil, err
	}
	if p.dropped != nil {
		if c.carryAttach(p.dropped) {
			p.dirty = true // written with the next write that goes through
		}
		p.dropped = nil
	}
	p.state, p.loadErr = c, nil
	p.Ledger.setClaims(c.Claims)
	return c, nil
}

// carryAttach copies into c what the attach recorded (see DeviceAttached) of
// the devices of from's claims that c has too; it tells whether it copied any.
func (c *Checkpoint) carryAttach(from *Checkpoint) bool {
	carried := false
	for uid, pc := range c.Claims {
		old, ok := from.Claims[uid]
		if !ok || old.PodUID != pc.PodUID {
			continue
		}
		for i, d := range pc.Devices {
			j := slices.IndexFunc(old.Devices, func(o PreparedDevice) bool { return o.Device == d.Device })
			if j < 0 || !d.recordAttach(old.Devices[j]) {
				continue
			}
			pc.Devices = slices.Clone(pc.Devices)
			pc.Devices[i] = d
			c.Claims[uid] = pc
			carried = true
		}
	}
	return carried
}

// CheckpointError is the error reading the checkpoint (nil when it was
// read): while there is one the driver refuses every prepare and unprepare.
// It tries the file again.
func (p *Preparer) CheckpointError() error {
	_, err := p.current()
	return err
}

// commit writes the checkpoint with change made to it, then makes the same
// change in memory: memory never says what the file does not. With work held.
func (p *Preparer) commit(change func(claims map[types.UID]PreparedClaim)) error {
	p.mu.RLock()
	st := p.state
	p.mu.RUnlock()
	if st == nil {
		return errors.New("the DRA checkpoint is not in memory (a write of it failed); it is read again at the next prepare or unprepare")
	}
	next := st.clone()
	change(next.Claims)
	if err := p.write(next); err != nil {
		// The file may have been written all the same (a failed sync, a lost
		// reply): memory reads it again at the next call, as a restart would,
		// and keeps what the attach recorded meanwhile (see carryAttach).
		p.mu.Lock()
		if p.state != nil {
			p.dropped = p.state
		}
		p.state = nil
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.state.clone() // with what DeviceAttached recorded meanwhile
	change(now.Claims)
	now.BootID = p.BootID
	p.state = now
	p.Ledger.setClaims(now.Claims)
	return nil
}

// write writes c as the checkpoint. With work held.
func (p *Preparer) write(c *Checkpoint) error {
	c.BootID = p.BootID
	if p.WriteCheckpoint != nil {
		return p.WriteCheckpoint(c)
	}
	return p.Checkpoint.Save(c)
}

// clone copies the checkpoint's map; the claims' device slices are shared,
// and never changed in place.
func (c *Checkpoint) clone() *Checkpoint {
	out := *c
	out.Claims = maps.Clone(c.Claims)
	if out.Claims == nil {
		out.Claims = map[types.UID]PreparedClaim{}
	}
	return &out
}

// Prepare allocates the addresses of the claim's devices of this driver and
// returns them, as the checkpoint keeps them. A claim prepared before returns
// what it got then; one whose prepare started (and was cut short) is finished
// in the pools it recorded. When any device fails, what the claim got is
// released and the error says what was wrong (errors.Is ErrConfig,
// ErrSharedClaim, nodealloc.ErrInvalid, ErrUnknownPool, ErrExhausted: no retry
// fixes those but a changed claim or pool; ErrNotReady: the kubelet's retry
// will); when the release fails too, the claim stays recorded as started, for
// Unprepare or the claim garbage collection to release, and the error says so.
func (p *Preparer) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]PreparedDevice, error) {
	p.work.Lock()
	defer p.work.Unlock()
	st, err := p.current()
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s is not prepared: %w", claim.Namespace, claim.Name, err)
	}
	prev, started := st.Claims[claim.UID]
	if started && prev.State == PrepareCompleted && !prev.Unpreparing {
		return slices.Clone(prev.Devices), nil
	}
	if started && prev.PortsHeld {
		// Unprepared before with ports left in a namespace: what it
		// recorded is those ports alone, not the claim. Released first (the
		// ports must be back), then prepared anew.
		if err := p.finishRelease(ctx, claim.UID, prev); err != nil {
			return nil, fmt.Errorf("claim %s/%s is not prepared: %w", claim.Namespace, claim.Name, err)
		}
		started = false
		if st, err = p.current(); err != nil {
			return nil, fmt.Errorf("claim %s/%s is not prepared: %w", claim.Namespace, claim.Name, err)
		}
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	pod, err := podOf(claim)
	if err != nil {
		return nil, err
	}
	if err := p.checkNotInUse(st, claim); err != nil {
		return nil, err
	}
	if err := CheckConfigTargets(claim.Status.Allocation); err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	// One scan of the NICs for the whole prepare: a slow sysfs (up to 10 s)
	// is waited for once. The ports of prepared claims keep their host
	// netdevs while in their pods.
	inv := WithPreparedNetdevs(p.Inventory(), PreparedNetdevs(st.Claims))
	if err := p.checkInterfaceNames(claim, pod, inv, st); err != nil {
		return nil, err
	}
	pc := PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, PodName: pod.name, PodUID: pod.uid, State: PrepareStarted}
	if started && len(prev.Devices) > 0 {
		// Cut short before: the devices and pools it recorded, never pools
		// resolved again (a changed label would take a second address).
		pc.Devices = plan(prev.Devices)
	} else {
		plans, err := p.plan(claim, inv)
		if err != nil {
			return nil, err
		}
		pc.Devices = plans
	}
	// The ports are taken under the ledger's lock, where the CNI path takes
	// its own: no CNI ADD is adding on them or has them, and none gets them
	// from here on (taken until the record below is written, held by it
	// from then on).
	took, err := p.Ledger.takeForClaim(claim.UID, claim.Namespace+"/"+claim.Name, pc.Devices)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	defer took()
	// Recorded before anything is allocated: after a crash from here on,
	// Unprepare releases these devices' addresses, and the next Prepare
	// finishes them.
	if err := p.commit(func(cs map[types.UID]PreparedClaim) { cs[claim.UID] = pc }); err != nil {
		return nil, fmt.Errorf("claim %s/%s is not prepared: recording it: %w", claim.Namespace, claim.Name, err)
	}
	done := PreparedClaim{Namespace: pc.Namespace, Name: pc.Name, PodName: pc.PodName, PodUID: pc.PodUID, State: PrepareCompleted}
	for _, d := range pc.Devices {
		got, err := p.allocate(ctx, claim, pod, d)
		if err != nil {
			err = fmt.Errorf("claim %s/%s, request %s, device %s: %w", claim.Namespace, claim.Name, d.Request, d.Device, err)
			return nil, p.abandon(ctx, claim.UID, pc, err)
		}
		done.Devices = append(done.Devices, got)
	}
	if err := p.commit(func(cs map[types.UID]PreparedClaim) { cs[claim.UID] = done }); err != nil {
		return nil, fmt.Errorf("claim %s/%s: its addresses are held, but recording it prepared failed (the kubelet "+
			"tries again; unprepare releases them): %w", claim.Namespace, claim.Name, err)
	}
	return slices.Clone(done.Devices), nil
}

// abandon releases what a failed prepare may hold and forgets the claim;
// when it cannot, the claim stays recorded as started, with its devices, so
// that Unprepare or the claim garbage collection finish it. With work held.
func (p *Preparer) abandon(ctx context.Context, uid types.UID, pc PreparedClaim, cause error) error {
	held, missing, err := p.release(ctx, uid, pc)
	if err == nil && len(held) > 0 {
		err = fmt.Errorf("%w: %w", ErrPortsHeld, missing)
	}
	if err != nil {
		return errors.Join(cause, fmt.Errorf("releasing what claim %s/%s got failed too (%w): it stays recorded as "+
			"started, and its unprepare, or the claim garbage collection once it is deleted, releases it", pc.Namespace, pc.Name, err))
	}
	if err := p.commit(func(cs map[types.UID]PreparedClaim) { delete(cs, uid) }); err != nil {
		return errors.Join(cause, fmt.Errorf("claim %s/%s holds nothing, but forgetting it failed (%w): its unprepare "+
			"forgets it", pc.Namespace, pc.Name, err))
	}
	return cause
}

// plan returns the devices of a started claim as recorded before they were
// allocated: what the allocation needs, without what it returned.
func plan(devs []PreparedDevice) []PreparedDevice {
	out := make([]PreparedDevice, len(devs))
	for i, d := range devs {
		d.Addresses, d.Gateway, d.Gateways, d.Routes = nil, "", nil, nil
		out[i] = d
	}
	return out
}

// plan resolves every device of this driver in the claim: its port, its
// interface name and its pools, from the inventory inv. It allocates nothing.
func (p *Preparer) plan(claim *resourceapi.ResourceClaim, inv *nicdiscovery.Inventory) ([]PreparedDevice, error) {
	byRail := rails.PFRails(inv, p.Rails)
	var out []PreparedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue // another driver's device of the same claim
		}
		d, err := p.prepareDevice(claim, r, inv, byRail)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s, request %s, device %s: %w", claim.Namespace, claim.Name, r.Request, r.Device, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// prepareDevice resolves one device: its port, interface name and pools.
func (p *Preparer) prepareDevice(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult,
	inv *nicdiscovery.Inventory, byRail map[string]string) (PreparedDevice, error) {
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
	if p.HostState != nil && d.HostNetdev != "" {
		// An error records nothing: the attach records the link as it
		// moves it, as it did before.
		if st, ok, err := p.HostState(d); err != nil {
			p.Log.Error(err, "reading the device's link on the host; its state is recorded at the attach", "device", d.Device,
				"netdev", d.HostNetdev)
		} else if ok {
			st.RecordIn(&d)
		}
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
	d.RequestedIndex, d.RequestedIPs = cfg.IPIndex, cfg.IPs
	return d, nil
}

// allocate allocates a resolved device's addresses (the same again when it
// holds them already).
func (p *Preparer) allocate(ctx context.Context, claim *resourceapi.ResourceClaim, pod podRef, d PreparedDevice) (PreparedDevice, error) {
	req := p.request(claim.UID, d, pod)
	req.Index = d.RequestedIndex
	for _, s := range d.RequestedIPs {
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

// release releases the devices of a claim (each once more, whatever it
// holds: releasing what is not held succeeds); the first error stops it.
// Each device's port is reclaimed first (a port left under its pod name gets
// its own back). A port that is on the host nowhere (ErrNetdevMissing: it is
// in a network namespace that outlived its pod, where its addresses may still
// be configured and up) keeps its device's addresses held: those devices are
// returned, with the reclaim's errors, which say where to look.
func (p *Preparer) release(ctx context.Context, uid types.UID, pc PreparedClaim) (held []PreparedDevice, missing, err error) {
	var free []PreparedDevice
	var why []error
	for _, d := range pc.Devices {
		if p.Reclaim == nil {
			free = append(free, d)
			continue
		}
		err := p.Reclaim(d)
		switch {
		case errors.Is(err, ErrNetdevMissing):
			held = append(held, d)
			why = append(why, err)
		case err != nil:
			return nil, nil, fmt.Errorf("claim %s/%s: %w", pc.Namespace, pc.Name, err)
		default:
			free = append(free, d)
		}
	}
	for _, d := range free {
		if err := p.Allocator.Deallocate(ctx, p.request(uid, d, podRef{})); err != nil {
			return nil, nil, fmt.Errorf("releasing claim %s/%s's device %s: %w", pc.Namespace, pc.Name, d.Device, err)
		}
	}
	return held, errors.Join(why...), nil
}

// ErrPortsHeld is Unprepare's answer for a claim some of whose ports are on
// the host nowhere: the claim is unprepared for the kubelet (it cannot bring
// the ports back by retrying, and a failed unprepare would keep the pod
// terminating), but those ports' addresses stay held, since they may still be
// configured and up in the namespace that holds the port, until the port is
// back on the host (ReleaseHeldPorts). The error names the ports and where
// to look.
var ErrPortsHeld = errors.New("a claim's port is in a network namespace that outlived its pod; its addresses stay held")

// finishRelease releases what the claim holds (release) and forgets it; the
// devices whose ports are nowhere on the host stay recorded, PortsHeld, and
// the error is ErrPortsHeld. With work held.
func (p *Preparer) finishRelease(ctx context.Context, uid types.UID, pc PreparedClaim) error {
	held, missing, err := p.release(ctx, uid, pc)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		kept := pc
		kept.Unpreparing, kept.PortsHeld, kept.Devices = true, true, held
		if err := p.commit(func(cs map[types.UID]PreparedClaim) { cs[uid] = kept }); err != nil {
			return fmt.Errorf("claim %s/%s is not unprepared: recording which of its ports are held: %w", pc.Namespace, pc.Name, err)
		}
		var ports []string
		for _, d := range held {
			ports = append(ports, d.HostNetdev+" ("+d.PCIAddress+")")
		}
		return fmt.Errorf("%w: claim %s/%s (UID %s), port(s) %s: the addresses %s stay held until the port is back on "+
			"the host, which the driver checks every refresh; move it back or delete that namespace: %w", ErrPortsHeld,
			pc.Namespace, pc.Name, uid, strings.Join(ports, ", "), strings.Join(heldAddresses(held), ", "), missing)
	}
	if err := p.commit(func(cs map[types.UID]PreparedClaim) { delete(cs, uid) }); err != nil {
		return fmt.Errorf("claim %s/%s holds nothing now, but forgetting it failed (the kubelet tries again): %w",
			pc.Namespace, pc.Name, err)
	}
	return nil
}

func heldAddresses(devs []PreparedDevice) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Addresses...)
	}
	if len(out) == 0 {
		out = []string{"of the device"}
	}
	return out
}

// ReleaseHeldPorts tries again, for each claim whose ports are held
// (PortsHeld), to bring them back and release their addresses: a port
// back on the host (its namespace deleted, or the port moved back) is
// released, and a claim with no port left is forgotten. It returns, by claim
// UID, what is still held (ErrPortsHeld) or failed; a released claim maps to
// nil.
func (p *Preparer) ReleaseHeldPorts(ctx context.Context) map[types.UID]error {
	st, err := p.current()
	if err != nil {
		return nil
	}
	var uids []types.UID
	for uid, pc := range st.Claims {
		if pc.PortsHeld {
			uids = append(uids, uid)
		}
	}
	if len(uids) == 0 {
		return nil
	}
	out := map[types.UID]error{}
	for _, uid := range uids {
		out[uid] = p.Unprepare(ctx, uid)
	}
	return out
}

// Unprepare releases a claim's addresses and forgets it; a claim it does not
// know (prepared by no one, or unprepared already) is no error. A claim whose
// prepare started (and was cut short, by an error or a crash) has what it may
// hold released the same way. A port on the host nowhere keeps its addresses
// held, and the error is ErrPortsHeld (finishRelease).
func (p *Preparer) Unprepare(ctx context.Context, uid types.UID) error {
	p.work.Lock()
	defer p.work.Unlock()
	st, err := p.current()
	if err != nil {
		return fmt.Errorf("claim UID %s is not unprepared: %w", uid, err)
	}
	pc, ok := st.Claims[uid]
	if !ok {
		return nil
	}
	if pc.State == PrepareCompleted && !pc.Unpreparing {
		// Recorded before anything is released: a Prepare after a failure or
		// a crash from here on must not take the record for what is held.
		pc.Unpreparing = true
		if err := p.commit(func(cs map[types.UID]PreparedClaim) { cs[uid] = pc }); err != nil {
			return fmt.Errorf("claim %s/%s is not unprepared: recording it: %w", pc.Namespace, pc.Name, err)
		}
	}
	if err := p.finishRelease(ctx, uid, pc); err != nil {
		return err
	}
	p.mu.Lock()
	for pod, err := range p.refused {
		if errors.Is(err, errOfClaim(uid)) {
			delete(p.refused, pod)
		}
	}
	p.mu.Unlock()
	return nil
}

// checkNotInUse refuses a claim that names a device another prepared claim
// has: the scheduler never allocates one device twice, so it can only be a
// claim allocated from a stale slice, and the device cannot be in two pods.
func (p *Preparer) checkNotInUse(st *Checkpoint, claim *resourceapi.ResourceClaim) error {
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		for uid, other := range st.Claims {
			if uid == claim.UID {
				continue
			}
			for _, d := range other.Devices {
				if d.Device == r.Device && other.PortsHeld {
					return fmt.Errorf("%w: device %s of claim %s/%s: its port is held for claim %s/%s (UID %s), unprepared "+
						"while the port was in a network namespace that outlived its pod (ipamctl check names it); the "+
						"device is prepared again once the port is back on the host", ErrNetdevMissing, r.Device,
						claim.Namespace, claim.Name, other.Namespace, other.Name, uid)
				}
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
// attach when its sandbox starts and stops. It answers from memory, at once,
// whatever a prepare is doing meanwhile.
func (p *Preparer) PodDevices(podUID string) []PreparedDevice {
	st, err := p.current()
	if err != nil {
		return nil
	}
	var out []PreparedDevice
	for _, pc := range st.Claims {
		if pc.PodUID == podUID && pc.State == PrepareCompleted && !pc.PortsHeld {
			out = append(out, pc.Devices...)
		}
	}
	return slices.Clone(out)
}

// DeviceAttached records what the attach learnt of a device's host link (its
// MAC and MTU), for the status and for the way back: in memory at once, in
// the checkpoint file soon after (never while the runtime waits for the hook).
func (p *Preparer) DeviceAttached(podUID string, d PreparedDevice) {
	if _, err := p.current(); err != nil {
		return
	}
	p.mu.Lock()
	st, next := p.state, (*Checkpoint)(nil)
	if st == nil { // a failed write since: read again at the next call
		p.mu.Unlock()
		return
	}
	for uid, pc := range st.Claims {
		if pc.PodUID != podUID {
			continue
		}
		i := slices.IndexFunc(pc.Devices, func(x PreparedDevice) bool { return x.Device == d.Device })
		if i < 0 {
			continue
		}
		rec := pc.Devices[i]
		if !rec.recordAttach(d) {
			continue
		}
		if next == nil {
			next = st.clone()
		}
		pc.Devices = slices.Clone(pc.Devices) // shared with earlier copies: never changed in place
		pc.Devices[i] = rec
		next.Claims[uid] = pc
	}
	start := false
	if next != nil {
		p.state = next
		// A write that failed leaves dirty set: a later attach still starts
		// one (when none waits), not only the driver's refresh.
		start, p.persisting, p.dirty = !p.persisting, true, true
	}
	p.mu.Unlock()
	if start {
		go p.persist()
	}
}

// persist writes what DeviceAttached recorded, once no prepare or unprepare
// runs (which would write it too). A failed write is logged and left dirty:
// the record is for the status and the MTU, MAC and admin state on the way
// back, and the next write of the checkpoint, or PersistAttached, has it.
func (p *Preparer) persist() {
	p.work.Lock()
	defer p.work.Unlock()
	p.mu.Lock()
	p.persisting = false
	p.mu.Unlock()
	p.persistLocked()
}

// persistLocked is persist, with work held.
func (p *Preparer) persistLocked() {
	if _, err := p.current(); err != nil {
		// A failed write dropped memory, and the file cannot be read back:
		// what the attach recorded is carried in once it can.
		p.Log.Error(err, "recording the MAC and MTU of attached devices in the DRA checkpoint; kept, written with the next change")
		return
	}
	p.mu.Lock()
	if !p.dirty || p.state == nil {
		p.mu.Unlock()
		return
	}
	next := p.state.clone()
	p.dirty = false
	p.mu.Unlock()
	if err := p.write(next); err != nil {
		// Kept in memory, and dirty again: the driver's refresh tries the
		// write again (PersistAttached), so that a restart before the next
		// change does not lose the recorded state the detach restores.
		p.mu.Lock()
		p.dirty = true
		p.mu.Unlock()
		p.Log.Error(err, "recording the MAC, MTU and state of attached devices in the DRA checkpoint; kept in memory, "+
			"written again at the next refresh or change")
	}
}

// PersistAttached writes what DeviceAttached recorded when an earlier write
// of it failed (a full filesystem): the driver's refresh calls it. Nothing is
// written when nothing waits, nor while a prepare or unprepare runs (it may
// wait long on the API server, and the driver's loop must not wait with it;
// its own checkpoint write carries the record).
func (p *Preparer) PersistAttached() {
	p.mu.RLock()
	dirty := p.dirty
	p.mu.RUnlock()
	if !dirty || !p.work.TryLock() {
		return
	}
	defer p.work.Unlock()
	p.persistLocked()
}

// Claims returns a copy of the prepared claims (ipamctl, garbage collection).
func (p *Preparer) Claims() (map[types.UID]PreparedClaim, error) {
	st, err := p.current()
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]PreparedClaim, len(st.Claims))
	for uid, pc := range st.Claims {
		pc.Devices = slices.Clone(pc.Devices)
		out[uid] = pc
	}
	return out, nil
}

// Refusal says why the pod with this UID must not start: it is reserved on a
// claim prepared for another pod (the claim garbage collection reads the
// prepared claims and notes such pods), nil otherwise. The runtime hook that
// starts a sandbox asks it, from memory.
func (p *Preparer) Refusal(podUID string) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.refused[podUID]
}

// noteConsumers records the pods a prepared claim is reserved for besides the
// one it was prepared for (Refusal refuses them), as the API server has the
// claim now. A pod newly noted is logged.
func (p *Preparer) noteConsumers(uid types.UID, pc PreparedClaim, consumers []resourceapi.ResourceClaimConsumerReference) {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := map[string]bool{}
	for pod, err := range p.refused {
		if errors.Is(err, errOfClaim(uid)) {
			delete(p.refused, pod)
			before[pod] = true
		}
	}
	defer func() {
		for pod, err := range p.refused {
			if !before[pod] && errors.Is(err, errOfClaim(uid)) {
				p.Log.Info("a pod is reserved on a claim prepared for another pod: its sandbox start is refused",
					"claim", pc.Namespace+"/"+pc.Name, "podUID", pod, "preparedFor", pc.Namespace+"/"+pc.PodName)
			}
		}
	}()
	for _, r := range consumers {
		if r.Resource != "pods" || r.APIGroup != "" || string(r.UID) == pc.PodUID {
			continue
		}
		if p.refused == nil {
			p.refused = map[string]error{}
		}
		p.refused[string(r.UID)] = fmt.Errorf("%w: pod %s/%s is reserved on claim %s/%s, prepared for pod %s/%s: its %s "+
			"devices are in that pod's network namespace (%w): give each pod its own claim (a ResourceClaimTemplate)",
			ErrSharedClaim, pc.Namespace, r.Name, pc.Namespace, pc.Name, pc.Namespace, pc.PodName, DriverName, errOfClaim(uid))
	}
}

// claimError marks a refusal with the claim it is about.
type claimError types.UID

func (e claimError) Error() string { return "claim UID " + string(e) }

func errOfClaim(uid types.UID) error { return claimError(uid) }

// refusal is the refusal of a pod by devs, when it can refuse (*Preparer).
func refusal(devs PodDevices, podUID string) error {
	if r, ok := devs.(interface{ Refusal(string) error }); ok {
		return r.Refusal(podUID)
	}
	return nil
}

// podRef is the pod a claim is reserved for.
type podRef struct{ namespace, name, uid string }

// podOf returns the pod the claim is reserved for: the allocation records it,
// as the CNI path records the pod of an interface. A claim reserved for more
// than one pod is refused: its devices move into one pod's network
// namespace, and the kubelet prepares a claim once, for all its pods.
func podOf(claim *resourceapi.ResourceClaim) (podRef, error) {
	var pods []podRef
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			pods = append(pods, podRef{namespace: claim.Namespace, name: r.Name, uid: string(r.UID)})
		}
	}
	switch len(pods) {
	case 0:
		return podRef{}, fmt.Errorf("%w: claim %s/%s is reserved for no pod", nodealloc.ErrInvalid, claim.Namespace, claim.Name)
	case 1:
		return pods[0], nil
	}
	names := make([]string, len(pods))
	for i, r := range pods {
		names[i] = r.name
	}
	return podRef{}, fmt.Errorf("%w: claim %s/%s is reserved for %d pods (%s): its %s devices move into one pod's network "+
		"namespace, so the claim cannot be shared: give each pod its own claim (a ResourceClaimTemplate)", ErrSharedClaim,
		claim.Namespace, claim.Name, len(pods), strings.Join(names, ", "), DriverName)
}
