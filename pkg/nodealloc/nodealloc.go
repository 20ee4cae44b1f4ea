// Package nodealloc is the node daemon's allocation state: the pools this node has
// a block in, the allocator of each, and every allocation, kept durably in the
// store. Every change is committed to the store (where it survives a crash of
// the daemon, see store.Commit) before it is visible as a success. It knows
// nothing of gRPC or Kubernetes; the service and the pool sync drive it.
package nodealloc

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/allocator"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/store"
)

// Errors the gRPC boundary maps to status codes; each is wrapped with detail.
var (
	// ErrInvalid: the request itself is wrong (InvalidArgument).
	ErrInvalid = errors.New("invalid request")
	// ErrUnknownPool: the pool has no block on this node (NotFound).
	ErrUnknownPool = errors.New("unknown pool")
	// ErrNotAllocated: IsAllocated found no allocation (NotFound).
	ErrNotAllocated = errors.New("no allocation")
	// ErrExhausted: the block is full (ResourceExhausted).
	ErrExhausted = errors.New("pool exhausted")
	// ErrDeletedMeanwhile: a release of the same interface began while the
	// allocation waited (Aborted): the runtime gave up on this ADD and ran its
	// DEL, and an address committed now would be held by no attachment.
	ErrDeletedMeanwhile = errors.New("the interface was released while this allocation waited")
)

// Metadata is recorded with an allocation.
type Metadata struct {
	PodName, PodNamespace, PodUID, DeviceID string
	// Rail is the rail the request's pools were picked by, "" when named.
	Rail string
	// Network is the CNI network's name, which CNI GC of that network matches on;
	// empty when the client did not send it.
	Network string
	// Owner is store.Allocation.Owner: set by the DRA driver only (the gRPC
	// service never copies it from a request).
	Owner string
	// Port is store.Allocation.Port: the PCI function of the attachment's
	// device, as the daemon resolved it; Ports is store.Allocation.Ports,
	// every function when the device uses more than one.
	Port  string
	Ports []string
}

// Request asks for addresses for one interface.
type Request struct {
	// Pools are one name, or two for dual-stack; Kind applies to all.
	Pools       []string
	Kind        string
	ContainerID string
	IfName      string
	Meta        Metadata
	// RequestedIPs are static addresses; each must fall in one of the pools' blocks.
	RequestedIPs []netip.Addr
	// AllocateGateway hands out the pool's gateway itself.
	AllocateGateway bool
	// Index, when set, asks for the address at this index of the block.
	Index *int32
}

// Result is one pool's address for the interface.
type Result struct {
	Pool    string
	Kind    string
	Addr    netip.Prefix // the address with the pool's prefix length
	Gateway netip.Addr   // invalid when the pool has none, or Addr is the gateway
	Routes  []netip.Prefix
}

// owner is the interface an allocation belongs to; key is its store.RecordKey,
// what the pool's maps are keyed by.
type owner struct{ containerID, ifName, key string }

func newOwner(containerID, ifName string) owner {
	return owner{containerID: containerID, ifName: ifName, key: store.RecordKey(containerID, ifName)}
}

type poolState struct {
	// sem is the pool's lock, a channel rather than a sync.Mutex so that a request
	// can stop waiting for it when its context ends. Every holder unlocks in a
	// defer: a panic (recovered by the gRPC server) must not wedge the pool.
	sem   chan struct{}
	key   string
	cfg   *PoolConfig      // nil: only allocations are known (no block learned yet)
	block *allocator.Block // nil with cfg
	// active: a pool sync (or SetPool) gave the pool this block; it hands out
	// addresses. A pool that is neither active nor provisional only keeps the
	// allocations it has until they are released.
	active bool
	// provisional: the block was loaded from the store and no pool sync has
	// confirmed it yet. It hands out addresses only after UseStoredBlocks.
	provisional bool
	// storedInactive: the store marks the block taken away (Store.DeactivatePool).
	storedInactive bool
	// dropped: the pool was forgotten (Manager.forget) and is no longer in
	// Manager.pools. Whoever took the state before and locks it after must look
	// the pool up again.
	dropped bool
	// allocs are the pool's allocations, by store.RecordKey: only the address.
	// The rest of each record (pod, device, network, creation time) is read from
	// the store when asked for (Allocations, ReleaseIf), so that 100,000
	// allocations cost a few megabytes of memory, not tens.
	allocs map[string]netip.Addr
	// lastReserved is the round-robin position read from the store, applied when
	// the pool's block is first configured.
	lastReserved netip.Addr
	// inflight are operations whose store commit is running without the lock
	// held (so that concurrent requests share transactions). Their addresses stay
	// reserved in the block until the commit's outcome is applied; a request for
	// the same interface waits for them.
	inflight map[string]*flight
}

// flight is one interface's operation in progress in a pool.
type flight struct {
	done chan struct{}
	ips  []netip.Addr
}

func newPoolState(key string) *poolState {
	return &poolState{key: key, sem: make(chan struct{}, 1), allocs: map[string]netip.Addr{}, inflight: map[string]*flight{}}
}

// lock takes the pool's lock, or gives up with ctx's error once ctx is done.
func (p *poolState) lock(ctx context.Context) error {
	select {
	case p.sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case p.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gave up waiting for pool %s: %w", p.key, ctx.Err())
	}
}

// lockWait takes the pool's lock however long it takes: for the daemon's own
// work, and for applying a commit's outcome, which must never be abandoned.
func (p *poolState) lockWait() { p.sem <- struct{}{} }

func (p *poolState) unlock() { <-p.sem }

// waitFor waits until ch is closed, or gives up with ctx's error.
func waitFor(ctx context.Context, ch <-chan struct{}, what string) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gave up waiting for %s: %w", what, ctx.Err())
	}
}

// errOutcomeUnknown stands for a store commit that did not return (it
// panicked): what it wrote is unknown until the store is read again.
var errOutcomeUnknown = errors.New("store commit did not return")

// Store is what the allocation state needs of the durable store. The daemon
// wires in *store.Store; tests wrap it to fail or stall a commit.
type Store interface {
	// Scan reads every pool record, and the key and address of every allocation.
	Scan(pool func(store.Pool) error, held func(poolKey, recordKey string, ip netip.Addr) error) error
	// Get reads one allocation's record.
	Get(poolKey, containerID, ifName string) (store.Allocation, bool, error)
	// EachAllocation reads the records of a pool's allocations (all pools' when
	// poolKey is empty).
	EachAllocation(poolKey string, fn func(poolKey string, a store.Allocation) error) error
	// SavePool records a pool's last known block, active.
	SavePool(key string, block json.RawMessage) error
	// DeactivatePool marks the pool's stored block as no longer the node's.
	DeactivatePool(key string) error
	// DropPool forgets a pool that holds no allocation (its record goes);
	// store.ErrPoolInUse when it holds one.
	DropPool(key string) error
	// Commit records puts and deletes, all or none, and returns once they are committed (they then survive a crash of the daemon).
	Commit(puts []store.Put, deletes []store.Key) error
	// Path names the store in error messages.
	Path() string
}

var _ Store = (*store.Store)(nil)

// Manager holds the node's pools and allocations.
type Manager struct {
	store Store
	node  string
	now   func() time.Time

	mu    sync.RWMutex
	pools map[string]*poolState
	// existing are the keys of the pools the API server listed last
	// (ForgetGone), nil before the first listing: a pool not among them is gone,
	// and forgotten once it holds nothing.
	existing map[string]bool

	// decided is closed by the first SyncPools or by UseStoredBlocks, whichever
	// comes first: until then a request that needs a new address from a
	// provisional block waits.
	decided    chan struct{}
	decideOnce sync.Once

	// released: when the last release of each interface (by owner key) began,
	// for releaseMemory. An allocation of the interface that began before
	// that and has not reserved its addresses yet gives up (ErrDeletedMeanwhile).
	relMu    sync.Mutex
	released map[string]time.Time
}

// releaseMemory is how long a release is remembered against allocations of the
// same interface that began before it: longer than any request waits (the
// compact endpoint's bound is 30 s; a gRPC request ends with its client).
const releaseMemory = 2 * time.Minute

// markReleased records that a release of the interface begins now.
func (m *Manager) markReleased(key string) {
	now := time.Now()
	m.relMu.Lock()
	defer m.relMu.Unlock()
	if m.released == nil {
		m.released = map[string]time.Time{}
	}
	if len(m.released) >= 1024 {
		for k, t := range m.released {
			if now.Sub(t) > releaseMemory {
				delete(m.released, k)
			}
		}
	}
	m.released[key] = now
}

// releasedSince tells whether a release of the interface began after began.
func (m *Manager) releasedSince(key string, began time.Time) bool {
	m.relMu.Lock()
	defer m.relMu.Unlock()
	t, ok := m.released[key]
	return ok && t.After(began)
}

// Option tunes a Manager.
type Option func(*Manager)

// WithClock sets the clock that stamps each allocation's creation time; it is
// read with the request's pools locked. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(m *Manager) { m.now = now }
}

// New loads the store and rebuilds every pool. The last known blocks come back
// provisional: their allocations can be looked up and released at once, but a
// new address comes from one only once the daemon knows it is still this node's
// block (SyncPools), or has given up asking the API server (UseStoredBlocks).
// Until either happens, such a request waits.
func New(st Store, node string, opts ...Option) (*Manager, error) {
	m := &Manager{store: st, node: node, now: time.Now, pools: map[string]*poolState{}, decided: make(chan struct{})}
	for _, o := range opts {
		o(m)
	}
	records := map[string]store.Pool{}
	get := func(key string) *poolState {
		p, ok := m.pools[key]
		if !ok {
			p = newPoolState(key)
			m.pools[key] = p
		}
		return p
	}
	err := st.Scan(func(pl store.Pool) error {
		records[pl.Key] = pl
		get(pl.Key)
		return nil
	}, func(poolKey, recordKey string, ip netip.Addr) error {
		get(poolKey).allocs[recordKey] = ip
		return nil
	})
	if err != nil {
		return nil, err
	}
	for key, pl := range records {
		p := m.pools[key]
		if pl.LastReserved != "" {
			if a, err := netip.ParseAddr(pl.LastReserved); err == nil {
				p.lastReserved = a
			}
		}
		if len(pl.Block) > 0 {
			cfg, err := UnmarshalConfig(pl.Block)
			if err != nil {
				return nil, fmt.Errorf("store %s: pool %s: %w", st.Path(), key, err)
			}
			if err := p.configure(cfg); err != nil {
				return nil, fmt.Errorf("store %s: pool %s: %w", st.Path(), key, err)
			}
			// The last known block: maybe no longer this node's. One that was taken
			// away before the restart only describes old allocations.
			p.provisional = !pl.Inactive
			p.storedInactive = pl.Inactive
		}
	}
	return m, nil
}

// configure (re)builds the pool's allocator for cfg and replays its allocations.
func (p *poolState) configure(cfg *PoolConfig) error {
	b, err := allocator.New(allocator.Config{Range: cfg.Block, Gateway: cfg.Gateway, Exclusions: cfg.Exclusions})
	if err != nil {
		return err
	}
	cursor := p.lastReserved
	if p.block != nil {
		cursor = p.block.Cursor()
	}
	for key, ip := range p.allocs {
		if err := b.Reserve(ip); err != nil {
			return fmt.Errorf("allocation %s: %w", describeKey(key), err)
		}
	}
	for key, f := range p.inflight {
		for _, ip := range f.ips {
			if err := b.Reserve(ip); err != nil {
				return fmt.Errorf("in-flight allocation %s: %w", describeKey(key), err)
			}
		}
	}
	if cursor.IsValid() {
		b.SetCursor(cursor)
	}
	p.cfg, p.block = cfg, b
	return nil
}

// SetPool makes cfg the pool's block and marks it active. The config is committed
// before it takes effect.
func (m *Manager) SetPool(cfg *PoolConfig) error {
	key := cfg.Key()
	var p *poolState
	for {
		m.mu.Lock()
		var ok bool
		p, ok = m.pools[key]
		if !ok {
			p = newPoolState(key)
			m.pools[key] = p
		}
		m.mu.Unlock()
		p.lockWait()
		if !p.dropped {
			break
		}
		p.unlock() // forgotten meanwhile: a new state takes its place
	}
	defer p.unlock()
	if p.cfg != nil && p.cfg.Equal(cfg) && !p.storedInactive {
		p.active, p.provisional = true, false
		return nil
	}
	raw, err := MarshalConfig(cfg)
	if err != nil {
		return err
	}
	if err := m.store.SavePool(key, raw); err != nil {
		return err
	}
	p.storedInactive = false
	if err := p.configure(cfg); err != nil {
		return fmt.Errorf("pool %s: %w", key, err)
	}
	p.active, p.provisional = true, false
	return nil
}

// SyncPools makes cfgs, the complete listing of this node's blocks, the truth:
// it sets every pool in cfgs and deactivates every other pool, stored blocks
// included. An empty listing deactivates them all. Deactivated pools keep their
// allocations, which can be released, but hand out nothing new; so does a pool
// whose new block could not be set.
func (m *Manager) SyncPools(cfgs []*PoolConfig) error {
	defer m.decide()
	listed := map[string]bool{}
	for _, c := range cfgs {
		listed[c.Key()] = true
	}
	var errs []error
	for _, p := range m.snapshot("") {
		if !listed[p.key] {
			if err := m.deactivate(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range cfgs {
		err := m.SetPool(c)
		if err == nil {
			continue
		}
		errs = append(errs, err)
		m.mu.RLock()
		p := m.pools[c.Key()]
		m.mu.RUnlock()
		if p != nil {
			if err := m.deactivate(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// deactivate stops the pool handing out addresses, and records that in the store
// first, so that a restart while the API server is unreachable does not bring a
// block back that was already taken away. The pool is deactivated in memory also
// when the store write fails.
func (m *Manager) deactivate(p *poolState) error {
	p.lockWait()
	defer p.unlock()
	if p.dropped {
		return nil
	}
	var err error
	if p.cfg != nil && !p.storedInactive {
		if err = m.store.DeactivatePool(p.key); err == nil {
			p.storedInactive = true
		}
	}
	p.active, p.provisional = false, false
	return err
}

func (m *Manager) decide() { m.decideOnce.Do(func() { close(m.decided) }) }

func (m *Manager) isDecided() bool {
	select {
	case <-m.decided:
		return true
	default:
		return false
	}
}

// UseStoredBlocks lets the blocks loaded from the store hand out addresses
// until SyncPools replaces them; the daemon calls it when the API server does
// not answer at start. It returns how many stored blocks that is (none after a
// SyncPools).
func (m *Manager) UseStoredBlocks() int {
	m.decide()
	n := 0
	for _, p := range m.snapshot("") {
		if p.info(true).Provisional {
			n++
		}
	}
	return n
}

// snapshot returns the pool with the key, or every pool when key is empty.
func (m *Manager) snapshot(key string) []*poolState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	states := make([]*poolState, 0, len(m.pools))
	for k, p := range m.pools {
		if key == "" || k == key {
			states = append(states, p)
		}
	}
	return states
}

// lockPools returns the states of the named pools, locked in key order; unknown
// pools are nil. unlock undoes it; callers defer it. When ctx ends first it
// returns ctx's error with no lock held.
func (m *Manager) lockPools(ctx context.Context, keys []string) (states []*poolState, unlock func(), err error) {
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return keys[order[a]] < keys[order[b]] })
	for {
		m.mu.RLock()
		states = make([]*poolState, len(keys))
		for i, k := range keys {
			states[i] = m.pools[k]
		}
		m.mu.RUnlock()
		var locked []*poolState
		unlock = func() {
			for _, s := range locked {
				s.unlock()
			}
		}
		for _, i := range order {
			if s := states[i]; s != nil && !slices.Contains(locked, s) {
				if err := s.lock(ctx); err != nil {
					unlock()
					return nil, nil, err
				}
				locked = append(locked, s)
			}
		}
		if !slices.ContainsFunc(locked, func(s *poolState) bool { return s.dropped }) {
			return states, unlock, nil
		}
		unlock() // a pool was forgotten meanwhile: look the pools up again
	}
}

// lockPoolsWait is lockPools without giving up.
func (m *Manager) lockPoolsWait(keys []string) (states []*poolState, unlock func()) {
	states, unlock, _ = m.lockPools(context.Background(), keys) // Background never ends: no error
	return states, unlock
}

func (m *Manager) keys(req *Request) ([]string, error) {
	switch {
	case len(req.Pools) == 0 || len(req.Pools) > 2:
		return nil, fmt.Errorf("%w: pools: want one pool name, or two for dual-stack, got %d", ErrInvalid, len(req.Pools))
	case req.ContainerID == "":
		return nil, fmt.Errorf("%w: cni_containerid is required", ErrInvalid)
	case req.IfName == "":
		return nil, fmt.Errorf("%w: cni_ifname is required", ErrInvalid)
	}
	kind := req.Kind
	if kind == "" {
		kind = v1alpha1.KindIPPool
	}
	keys := make([]string, len(req.Pools))
	for i, name := range req.Pools {
		if name == "" {
			return nil, fmt.Errorf("%w: pools[%d] is empty", ErrInvalid, i)
		}
		keys[i] = v1alpha1.PoolKey(kind, name)
	}
	if len(keys) == 2 && keys[0] == keys[1] {
		return nil, fmt.Errorf("%w: pools: %q is named twice", ErrInvalid, req.Pools[0])
	}
	return keys, nil
}

// Allocate hands out one address per pool, all or none, and returns them once
// they are committed. Asking again for the same interface returns the same
// addresses. While it waits for a pool's lock, or for another operation on the
// same interface, it gives up when ctx ends, leaving nothing behind.
func (m *Manager) Allocate(ctx context.Context, req *Request) ([]Result, error) {
	keys, err := m.keys(req)
	if err != nil {
		return nil, err
	}
	if req.Meta.PodName == "" || req.Meta.PodNamespace == "" {
		return nil, fmt.Errorf("%w: metadata k8s_pod_name and k8s_pod_namespace are required", ErrInvalid)
	}
	who := newOwner(req.ContainerID, req.IfName)
	began := time.Now()
	for {
		at, err := m.tryReserve(ctx, keys, req, who, began)
		switch {
		case err != nil:
			return nil, err
		case at.wait != nil:
			// The same interface is being allocated or released; then look again.
			if err := waitFor(ctx, at.wait, fmt.Sprintf("the operation in flight for container %s interface %s", who.containerID, who.ifName)); err != nil {
				return nil, err
			}
			continue
		case at.flight == nil:
			return at.results, nil
		}
		return m.commitAllocation(keys, who, at)
	}
}

// attempt is what one look at the locked pools decided.
type attempt struct {
	results []Result        // the interface holds its addresses already
	wait    <-chan struct{} // try again once this is closed
	flight  *flight         // addresses reserved: commit puts, then finish the flight
	puts    []store.Put
}

// tryReserve locks the pools and reserves the request's addresses.
func (m *Manager) tryReserve(ctx context.Context, keys []string, req *Request, who owner, began time.Time) (attempt, error) {
	states, unlock, err := m.lockPools(ctx, keys)
	if err != nil {
		return attempt{}, err
	}
	defer unlock()
	// Checked with the pools locked: a release that began after this (and
	// after the allocation) finds the addresses reserved, waits and frees them.
	if m.releasedSince(who.key, began) {
		return attempt{}, fmt.Errorf("%w: container %s interface %s (an ADD the runtime gave up on)", ErrDeletedMeanwhile,
			who.containerID, who.ifName)
	}
	if wait := waitingOn(states, who); wait != nil {
		return attempt{wait: wait}, nil
	}
	return m.reserve(states, req, who)
}

// commitAllocation writes the reserved addresses. The commit runs without pool
// locks, so concurrent Allocates share its transaction (group commit); the
// reserved addresses cannot be handed out meanwhile. The flight is finished
// even when the commit panics, so that the interface does not stay in flight.
func (m *Manager) commitAllocation(keys []string, who owner, at attempt) ([]Result, error) {
	outcome := errOutcomeUnknown
	defer func() {
		if errors.Is(outcome, errOutcomeUnknown) {
			_, _ = m.finishAllocation(keys, who, at, outcome)
		}
	}()
	outcome = m.store.Commit(at.puts, nil)
	return m.finishAllocation(keys, who, at, outcome)
}

// finishAllocation applies a commit's outcome and wakes the flight's waiters. A
// commit that failed frees its addresses; one whose outcome is unknown keeps
// them reserved (they may be committed) until the daemon reads its store again.
func (m *Manager) finishAllocation(keys []string, who owner, at attempt, outcome error) ([]Result, error) {
	states, unlock := m.lockPoolsWait(keys)
	defer unlock()
	defer close(at.flight.done)
	for _, p := range states {
		pf := p.inflight[who.key]
		if pf == nil || pf.done != at.flight.done {
			continue
		}
		delete(p.inflight, who.key)
		switch {
		case outcome == nil:
			for _, ip := range pf.ips {
				p.allocs[who.key] = ip
			}
		case errors.Is(outcome, errOutcomeUnknown):
		default:
			for _, ip := range pf.ips {
				p.block.Release(ip)
			}
		}
	}
	if outcome != nil {
		return nil, outcome
	}
	return m.results(states, who), nil
}

// waitingOn returns the done channel of an operation in flight for the interface
// in any of the pools.
func waitingOn(states []*poolState, who owner) <-chan struct{} {
	for _, p := range states {
		if p != nil {
			if f := p.inflight[who.key]; f != nil {
				return f.done
			}
		}
	}
	return nil
}

// reserve, with the pools locked, returns the existing results (idempotent
// retry), or reserves an address in every pool that lacks one and records the
// flight; the caller commits the puts. Whatever way it returns (a panic
// included), it reserves nothing unless it returns a flight.
func (m *Manager) reserve(states []*poolState, req *Request, who owner) (attempt, error) {
	for i, p := range states {
		if p == nil || p.cfg == nil {
			// Also for a retry of an allocation imported or stored before this
			// daemon learned the pool's block: without the block there is no prefix
			// to answer with.
			return attempt{}, m.noBlock(req, i, "has no block")
		}
	}
	existing := 0
	for _, p := range states {
		if p != nil {
			if _, ok := p.allocs[who.key]; ok {
				existing++
			}
		}
	}
	if existing == len(states) {
		return attempt{results: m.results(states, who)}, nil
	}
	for i, p := range states {
		if p == nil || p.cfg == nil {
			return attempt{}, m.noBlock(req, i, "has no block")
		}
		if !p.active {
			if _, ok := p.allocs[who.key]; !ok {
				if p.provisional {
					if !m.isDecided() {
						return attempt{wait: m.decided}, nil
					}
					continue // a stored block, serving while the API server does not answer
				}
				return attempt{}, m.noBlock(req, i, "no longer has a block (existing allocations stay until released, new ones are refused)")
			}
		}
	}
	requested, err := assignRequested(states, req)
	if err != nil {
		return attempt{}, err
	}
	type taken struct {
		p  *poolState
		ip netip.Addr
	}
	var took []taken
	reserved := false
	defer func() {
		if !reserved {
			for _, t := range took {
				t.p.block.Release(t.ip)
			}
		}
	}()
	var puts []store.Put
	now := m.now().UTC()
	for i, p := range states {
		if _, ok := p.allocs[who.key]; ok {
			continue // dual-stack retry where one half exists already
		}
		ip, err := m.pick(p, req, requested[i])
		if err != nil {
			return attempt{}, fmt.Errorf("pool %s: %w", req.Pools[i], err)
		}
		took = append(took, taken{p, ip})
		a := store.Allocation{ContainerID: req.ContainerID, IfName: req.IfName, IP: ip.String(),
			PodName: req.Meta.PodName, PodNamespace: req.Meta.PodNamespace, PodUID: req.Meta.PodUID,
			DeviceID: req.Meta.DeviceID, Rail: req.Meta.Rail, Network: req.Meta.Network, Owner: req.Meta.Owner,
			Port: req.Meta.Port, Ports: req.Meta.Ports, CreateTime: now}
		puts = append(puts, store.Put{PoolKey: p.key, Allocation: a, LastReserved: p.block.Cursor().String()})
	}
	// Every pool of the request gets the flight, also one whose half of a
	// dual-stack pair exists already, so that nothing releases that half meanwhile.
	f := &flight{done: make(chan struct{})}
	for _, p := range states {
		p.inflight[who.key] = &flight{done: f.done}
	}
	for _, t := range took {
		t.p.inflight[who.key].ips = []netip.Addr{t.ip}
	}
	reserved = true
	return attempt{flight: f, puts: puts}, nil
}

// noBlock is ErrUnknownPool for the request's i-th pool, saying what to check.
func (m *Manager) noBlock(req *Request, i int, what string) error {
	kind := kindOf(req)
	return fmt.Errorf("%w: %s %q %s on node %s: check that the %s exists in the --ippools-namespace of ipam-node, "+
		"that its nodeSelector matches the labels of this node, and that its status.allocations lists node %s "+
		"(ipam-controller assigns blocks, ipamctl pools shows what this node has)",
		ErrUnknownPool, kind, req.Pools[i], what, m.node, kind, m.node)
}

func kindOf(req *Request) string {
	if req.Kind == v1alpha1.KindCIDRPool {
		return v1alpha1.KindCIDRPool
	}
	return v1alpha1.KindIPPool
}

// assignRequested matches each requested address to the pool whose block holds it.
func assignRequested(states []*poolState, req *Request) ([]netip.Addr, error) {
	out := make([]netip.Addr, len(states))
	for _, ip := range req.RequestedIPs {
		matched := false
		for i, p := range states {
			if p.cfg.Prefix.Contains(ip) {
				if out[i].IsValid() {
					return nil, fmt.Errorf("%w: requested_ips: %s and %s both fall in pool %s", ErrInvalid, out[i], ip, req.Pools[i])
				}
				out[i], matched = ip, true
				break
			}
		}
		if !matched {
			return nil, fmt.Errorf("%w: requested_ips: %s is in none of the pools %v", ErrInvalid, ip, req.Pools)
		}
	}
	return out, nil
}

func (m *Manager) pick(p *poolState, req *Request, requested netip.Addr) (netip.Addr, error) {
	switch {
	case requested.IsValid():
		if err := p.block.AllocateStatic(requested); err != nil {
			return netip.Addr{}, m.allocErr(p, err)
		}
		return requested, nil
	case req.AllocateGateway:
		ip, err := p.block.AllocateGateway()
		return ip, m.allocErr(p, err)
	case req.Index != nil:
		if *req.Index < 0 {
			return netip.Addr{}, fmt.Errorf("%w: allocate_ip_with_index %d is negative", ErrInvalid, *req.Index)
		}
		// Index 0 is the block's first address (see PoolConfig.Block), not the
		// exclusion base.
		ip, ok := iprange.Add(p.cfg.Block.Start, iprange.U64(uint64(*req.Index)))
		if !ok || !p.cfg.Block.Contains(ip) {
			return netip.Addr{}, fmt.Errorf("%w: allocate_ip_with_index %d is outside block %s on node %s (indexes 0-%s, 0 = %s)",
				ErrInvalid, *req.Index, p.cfg.Block, m.node, iprange.Distance(p.cfg.Block.Start, p.cfg.Block.End), p.cfg.Block.Start)
		}
		if err := p.block.AllocateStatic(ip); err != nil {
			return netip.Addr{}, m.allocErr(p, err)
		}
		return ip, nil
	}
	ip, err := p.block.AllocateNext()
	return ip, m.allocErr(p, err)
}

func (m *Manager) allocErr(p *poolState, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, allocator.ErrExhausted):
		return fmt.Errorf("%w: no free address in block %s on node %s (%d allocated): release addresses or give the pool a larger block",
			ErrExhausted, p.cfg.Block, m.node, p.block.Allocated())
	case errors.Is(err, allocator.ErrInUse), errors.Is(err, allocator.ErrOutside),
		errors.Is(err, allocator.ErrExcluded), errors.Is(err, allocator.ErrNoGateway):
		return fmt.Errorf("%w: %w (block %s on node %s)", ErrInvalid, err, p.cfg.Block, m.node)
	}
	return err
}

// results answers for the interface's allocations. The holder of the gateway
// address (allocate_default_gateway) gets neither a gateway nor routes, as from
// nv-ipam: every route of the result goes through the gateway, which would be
// itself.
func (m *Manager) results(states []*poolState, who owner) []Result {
	out := make([]Result, 0, len(states))
	for _, p := range states {
		ip := p.allocs[who.key]
		r := Result{Pool: p.cfg.Name, Kind: p.cfg.Kind, Addr: netip.PrefixFrom(ip, p.cfg.Prefix.Bits())}
		if p.cfg.Gateway.IsValid() && ip == p.cfg.Gateway {
			out = append(out, r)
			continue
		}
		r.Gateway = p.cfg.Gateway
		r.Routes = slices.Clone(p.cfg.Routes)
		if p.cfg.DefaultGateway && p.cfg.Gateway.IsValid() {
			def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if ip.Is6() {
				def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			r.Routes = append([]netip.Prefix{def}, r.Routes...)
		}
		out = append(out, r)
	}
	return out
}

// IsAllocated succeeds when every pool holds an address for the interface. It
// gives up waiting for the pools' locks when ctx ends.
func (m *Manager) IsAllocated(ctx context.Context, req *Request) error {
	keys, err := m.keys(req)
	if err != nil {
		return err
	}
	states, unlock, err := m.lockPools(ctx, keys)
	if err != nil {
		return err
	}
	defer unlock()
	for i, p := range states {
		if p == nil {
			return fmt.Errorf("%w: pool %q holds nothing on node %s", ErrNotAllocated, req.Pools[i], m.node)
		}
		if _, ok := p.allocs[store.RecordKey(req.ContainerID, req.IfName)]; !ok {
			return fmt.Errorf("%w: pool %q holds no address for container %s interface %s",
				ErrNotAllocated, req.Pools[i], req.ContainerID, req.IfName)
		}
	}
	return nil
}

// Deallocate releases the interface's addresses in the pools; releasing what is
// not held succeeds. The release is committed before the addresses can be reused.
// Like Allocate, it gives up waiting when ctx ends, having released nothing.
func (m *Manager) Deallocate(ctx context.Context, req *Request) error {
	keys, err := m.keys(req)
	if err != nil {
		return err
	}
	who := newOwner(req.ContainerID, req.IfName)
	m.markReleased(who.key)
	_, err = m.releaseMatching(ctx, keys, who, nil)
	return err
}

// ReleaseIf releases one allocation if it is still exactly a (same address, pod
// UID and creation time): the stale-allocation cleaner decides without locks held,
// then calls this.
func (m *Manager) ReleaseIf(ctx context.Context, poolKey string, a store.Allocation) (bool, error) {
	return m.releaseMatching(ctx, []string{poolKey}, newOwner(a.ContainerID, a.IfName), func(cur store.Allocation) bool {
		return cur.IP == a.IP && cur.PodUID == a.PodUID && cur.CreateTime.Equal(a.CreateTime)
	})
}

// SetOwner marks one allocation as owner's (store.Allocation.Owner) if it is
// still exactly a (same address, pod UID and creation time) and has no owner
// yet; it says whether it wrote the mark. It is for the daemon's own use (the
// DRA driver's allocations made before the mark existed), never for a CNI
// request: the mark decides which garbage collection may release the address.
func (m *Manager) SetOwner(ctx context.Context, poolKey string, a store.Allocation, owner string) (bool, error) {
	states, unlock, err := m.lockPools(ctx, []string{poolKey})
	if err != nil {
		return false, err
	}
	defer unlock()
	p := states[0]
	if p == nil {
		return false, nil
	}
	who := newOwner(a.ContainerID, a.IfName)
	if _, ok := p.allocs[who.key]; !ok || p.inflight[who.key] != nil {
		return false, nil
	}
	cur, found, err := m.store.Get(poolKey, a.ContainerID, a.IfName)
	if err != nil || !found || cur.Owner != "" ||
		cur.IP != a.IP || cur.PodUID != a.PodUID || !cur.CreateTime.Equal(a.CreateTime) {
		return false, err
	}
	cur.Owner = owner
	// Rewritten under the pool's lock: nothing else changes the record meanwhile,
	// and a failed commit leaves it as it was.
	if err := m.store.Commit([]store.Put{{PoolKey: poolKey, Allocation: cur}}, nil); err != nil {
		return false, err
	}
	return true, nil
}

// release is the part of a release decided with the pools locked.
type release struct {
	wait    <-chan struct{} // try again once this is closed
	done    chan struct{}   // the release's flight
	dels    []store.Key
	removed map[*poolState]netip.Addr
}

// releaseMatching releases the interface's allocations in the pools (those that
// match, when match is set). The delete commits without pool locks held, like an
// Allocate's put; the addresses stay reserved until it is committed.
func (m *Manager) releaseMatching(ctx context.Context, keys []string, who owner, match func(store.Allocation) bool) (bool, error) {
	for {
		rel, err := m.takeForRelease(ctx, keys, who, match)
		switch {
		case err != nil:
			return false, err
		case rel.wait != nil:
			if err := waitFor(ctx, rel.wait, fmt.Sprintf("the operation in flight for container %s interface %s", who.containerID, who.ifName)); err != nil {
				return false, err
			}
			continue
		case len(rel.dels) == 0:
			return false, nil
		}
		released, err := m.commitRelease(keys, who, rel)
		if released {
			// The last allocation of a pool deleted from the API server: the
			// pool goes with it. Should that fail, the next ForgetGone retries.
			m.forgetGone(keys)
		}
		return released, err
	}
}

// takeForRelease, with the pools locked, moves the matching allocations into a
// flight.
func (m *Manager) takeForRelease(ctx context.Context, keys []string, who owner, match func(store.Allocation) bool) (release, error) {
	states, unlock, err := m.lockPools(ctx, keys)
	if err != nil {
		return release{}, err
	}
	defer unlock()
	if wait := waitingOn(states, who); wait != nil {
		return release{wait: wait}, nil
	}
	rel := release{done: make(chan struct{}), removed: map[*poolState]netip.Addr{}}
	for _, p := range states {
		if p == nil {
			continue
		}
		ip, ok := p.allocs[who.key]
		if !ok {
			continue
		}
		if match != nil {
			// The record as it is on disk; it is what a match is about.
			cur, found, err := m.store.Get(p.key, who.containerID, who.ifName)
			if err != nil {
				return release{}, err
			}
			if !found || !match(cur) {
				continue
			}
		}
		rel.dels = append(rel.dels, store.Key{PoolKey: p.key, ContainerID: who.containerID, IfName: who.ifName})
		rel.removed[p] = ip
		delete(p.allocs, who.key)
		p.inflight[who.key] = &flight{done: rel.done, ips: []netip.Addr{ip}}
	}
	return rel, nil
}

// commitRelease writes the deletes and applies the outcome; see commitAllocation.
func (m *Manager) commitRelease(keys []string, who owner, rel release) (bool, error) {
	outcome := errOutcomeUnknown
	defer func() {
		if errors.Is(outcome, errOutcomeUnknown) {
			_, _ = m.finishRelease(keys, who, rel, outcome)
		}
	}()
	outcome = m.store.Commit(nil, rel.dels)
	return m.finishRelease(keys, who, rel, outcome)
}

// finishRelease frees the released addresses once the delete is committed. When
// it is not (or may not be), the allocations are held again, so that a retried
// release deletes them.
func (m *Manager) finishRelease(keys []string, who owner, rel release, outcome error) (bool, error) {
	states, unlock := m.lockPoolsWait(keys)
	defer unlock()
	defer close(rel.done)
	for _, p := range states {
		ip, ok := rel.removed[p]
		if !ok {
			continue
		}
		f := p.inflight[who.key]
		delete(p.inflight, who.key)
		if outcome != nil {
			p.allocs[who.key] = ip // (maybe) still on disk: still held
			continue
		}
		if p.block != nil && f != nil {
			for _, ip := range f.ips {
				p.block.Release(ip)
			}
		}
	}
	if outcome != nil {
		return false, outcome
	}
	return true, nil
}

// ForgetGone tells the manager which pools exist in the API server: existing
// holds the keys (v1alpha1.PoolKey) of every pool of a complete listing,
// whether or not it gives this node a block. A pool not among them that hands
// out nothing and holds nothing is forgotten: its record leaves the store and
// listings (ipamctl pools, check) no longer show it. One that still holds
// allocations is forgotten when its last is released. A pool created again
// later starts anew from the block its status gives this node. It returns the
// keys forgotten now.
func (m *Manager) ForgetGone(existing map[string]bool) ([]string, error) {
	m.mu.Lock()
	m.existing = maps.Clone(existing)
	if m.existing == nil {
		m.existing = map[string]bool{}
	}
	m.mu.Unlock()
	var forgotten []string
	var errs []error
	for _, p := range m.snapshot("") {
		ok, err := m.forget(p)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			forgotten = append(forgotten, p.key)
		}
	}
	slices.Sort(forgotten)
	return forgotten, errors.Join(errs...)
}

// forgetGone forgets those of the pools (by key) that are gone and hold
// nothing; errors are left for the next ForgetGone.
func (m *Manager) forgetGone(keys []string) {
	for _, k := range keys {
		if !m.gone(k) {
			continue
		}
		for _, p := range m.snapshot(k) {
			_, _ = m.forget(p)
		}
	}
}

// gone says whether the last listing of the API server lacked the pool.
func (m *Manager) gone(key string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.existing != nil && !m.existing[key]
}

// forget drops p, under its lock, when its pool is gone from the API server and
// it hands out nothing, holds nothing and has nothing in flight; it says
// whether it did. The store forgets it first: should that fail, p stays.
func (m *Manager) forget(p *poolState) (bool, error) {
	p.lockWait()
	defer p.unlock()
	if p.dropped || p.active || p.provisional || len(p.allocs) > 0 || len(p.inflight) > 0 || !m.gone(p.key) {
		return false, nil
	}
	if err := m.store.DropPool(p.key); err != nil {
		return false, err
	}
	m.mu.Lock()
	if m.pools[p.key] == p {
		delete(m.pools, p.key)
	}
	m.mu.Unlock()
	p.dropped = true
	return true, nil
}

// PoolInfo describes one pool for listings.
type PoolInfo struct {
	Key    string
	Config *PoolConfig // nil when no block was ever learned
	// Active: the pool hands out new addresses (from a block a pool sync gave
	// it, or from its stored block while the API server does not answer).
	Active bool
	// Provisional: the block was loaded from the store and no pool sync has
	// confirmed it yet.
	Provisional bool
	Size        iprange.U128
	Allocated   uint64
	Free        iprange.U128
	// Orphans are allocations outside the block the pool hands out from (all of
	// them when it has none): left from an earlier block, excluded since, or of a
	// pool gone from this node.
	Orphans uint64
}

// Pools lists the pools, sorted by key.
func (m *Manager) Pools() []PoolInfo {
	states := m.snapshot("")
	out := make([]PoolInfo, 0, len(states))
	decided := m.isDecided()
	for _, p := range states {
		out = append(out, p.info(decided))
	}
	slices.SortFunc(out, func(a, b PoolInfo) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// info describes the pool; decided says whether provisional blocks serve.
func (p *poolState) info(decided bool) PoolInfo {
	p.lockWait()
	defer p.unlock()
	info := PoolInfo{Key: p.key, Config: p.cfg, Active: p.active || (p.provisional && decided), Provisional: p.provisional,
		Allocated: uint64(len(p.allocs))}
	if p.block != nil {
		info.Size, info.Free = p.block.Size(), p.block.Free()
	}
	if info.Active && p.block != nil {
		info.Orphans = p.block.Orphans()
	} else {
		info.Orphans = info.Allocated
	}
	return info
}

// Allocations returns the allocations of one pool (by key), or of all when key
// is empty, sorted by pool, container and interface: the records as they are
// on disk. Should the store fail to read, which a store that opened does not,
// the list says only what memory knows (interface and address, no pod), which
// no caller takes for a pod's allocation.
func (m *Manager) Allocations(key string) map[string][]store.Allocation {
	out := map[string][]store.Allocation{}
	err := m.store.EachAllocation(key, func(pool string, a store.Allocation) error {
		out[pool] = append(out[pool], a)
		return nil
	})
	if err != nil {
		clear(out)
		for _, p := range m.snapshot(key) {
			if list := p.allocations(); len(list) > 0 {
				out[p.key] = list
			}
		}
	}
	for _, list := range out {
		slices.SortFunc(list, func(a, b store.Allocation) int {
			return cmp.Or(cmp.Compare(a.ContainerID, b.ContainerID), cmp.Compare(a.IfName, b.IfName))
		})
	}
	return out
}

// EachAllocation calls fn for every allocation of one pool (by key), or of all
// when key is empty, with its record as it is on disk, in pool and key order, a
// chunk at a time (store.Store.EachAllocation): for callers that walk every
// allocation, like the stale-allocation cleaner, without holding all the
// records at once as Allocations does. fn may call the Manager (ReleaseIf).
func (m *Manager) EachAllocation(key string, fn func(pool string, a store.Allocation) error) error {
	return m.store.EachAllocation(key, fn)
}

// PoolsInUse lists, sorted, the keys of the pools holding allocations.
func (m *Manager) PoolsInUse() []string {
	var out []string
	for _, p := range m.snapshot("") {
		if p.inUse() {
			out = append(out, p.key)
		}
	}
	slices.Sort(out)
	return out
}

func (p *poolState) inUse() bool {
	p.lockWait()
	defer p.unlock()
	return len(p.allocs) > 0
}

// allocations is what memory knows of the pool's allocations; see Allocations.
func (p *poolState) allocations() []store.Allocation {
	p.lockWait()
	defer p.unlock()
	list := make([]store.Allocation, 0, len(p.allocs))
	for key, ip := range p.allocs {
		cid, ifName, _ := strings.Cut(key, "\x00")
		list = append(list, store.Allocation{ContainerID: cid, IfName: ifName, IP: ip.String()})
	}
	return list
}

// describeKey names the interface of a store.RecordKey in messages.
func describeKey(key string) string {
	cid, ifName, _ := strings.Cut(key, "\x00")
	return cid + "/" + ifName
}
