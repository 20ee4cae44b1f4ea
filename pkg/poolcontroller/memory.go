package poolcontroller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/blocks"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// MemoryLeaseName is the Lease, in the leader election's namespace, that keeps
// the controller's memory of held reports (see Memory).
const MemoryLeaseName = "hwipam-held-reports"

// MemoryAnnotation is the annotation of that Lease that holds the memory: the
// JSON object {"reports": {node: report}, "reserved": {pool: reservations}} (see
// memoryPayload), gzipped, in base64.
const MemoryAnnotation = "ipam.hwipam.io/held-reports"

// maxMemoryBytes bounds the annotation's value: the API server refuses an
// object whose annotations exceed 256 KiB in all.
const maxMemoryBytes = 200 << 10

// Memory is what the controller knows of the daemons' held reports that the
// Nodes may no longer show (see lastReports): the report of a Node re-registered
// without annotations while its daemon is down, or of a Node that is gone, which
// the controller keeps and honours. One Memory serves the reconcilers of both
// pool kinds.
//
// With Lease set it is also kept in that Lease, so that a controller that
// restarts (killed, rescheduled, a new leader) still knows it: before the first
// reconcile plans blocks, the Lease is read, and Start writes it again within
// Interval of a change. It keeps, per node:
//   - the whole last report of a node whose Node lacks the annotation or is gone;
//   - of a node whose Node shows its report, the pools in which the daemon holds
//     addresses outside its block, or reports a block the pool's status does not
//     give it (as its last reconcile read it): what no status records. So a Node
//     re-registered while the controller is down is covered too, unless its
//     report changed in the last Interval or a pool's status changed meanwhile.
//
// Of every report it keeps only what counts: what lies within the blocks the
// controller gave that node (see trust.go), so one node cannot fill the Lease. It
// keeps those grants too (the blocks taken from nodes that their daemons may
// still hold addresses in), and the pools it knows, by UID and network.
//
// It also keeps the pools' reservations (see poolState.reserved): the blocks
// retired from nodes, held back for the grace period whatever the daemons
// report, which is all that holds them where daemons cannot annotate their
// Nodes. A reconcile that retires a block saves them before it writes the status
// that no longer lists it.
//
// A Lease, because the controller may already write Leases in that namespace
// (leader election), under hwipam's RBAC and under network-operator's.
//
// With Records (the NodeIPAMs), all of that lives per node in the records
// instead (see retired.go): grants and reservations as retired blocks, and of
// the reports whether the node's daemon reports and which retired blocks it
// held. The Lease is then read once, for what a controller before records kept
// there, and marked as moved (see moveOut); nothing else is written to it, and no
// report is adopted: a node without a record holds nothing the controller gave.
type Memory struct {
	// Lease names the Lease that keeps the memory; empty: memory only.
	Lease types.NamespacedName
	// Reader reads the Lease from the API server (not a cache, which would
	// need list and watch); Client writes it.
	Reader client.Reader
	Client client.Client
	Log    logr.Logger
	// Interval is how often Start saves a change; 0 means one second.
	Interval time.Duration
	// MinGrantAge is how long a block taken from a node stays granted to it
	// at least (see trust.go); 0 means minGrantAge. Tests shorten it.
	MinGrantAge time.Duration
	// Records, when set, are the per-node records the grants and reservations
	// are kept in (see retired.go), and read back from before the first plan.
	Records Records

	loadMu  sync.Mutex // one first read; the others wait for it
	saveMu  sync.Mutex // one save at a time: a later payload is never overwritten by an older one
	mu      sync.Mutex
	reports map[string]seenReport
	// status: per pool key, the blocks its status gave nodes at its last
	// reconcile; an empty map for a pool that is gone.
	status map[string]poolStatus
	loaded bool      // the first read is done (or there is no Lease)
	unread bool      // the Lease could not be read (forbidden): it is not written until it is
	now    time.Time // the reconcilers' time at the last call
	// reserved: per pool (namespace/name), the ranges retired from its nodes
	// and held back until a time (see poolState.reserved).
	reserved map[string]keptReservations
	pass     uint64 // lastReports calls
	// given: per pool key and node, the blocks taken from the node that its
	// daemon may still hold addresses in (see trust.go); pools: the pools the
	// controller has reconciled.
	given map[string]map[string][]grant
	pools map[string]knownPool
	// trustFirst: the memory has no grants to check reports against (no Lease,
	// or one written before grants were kept): the first reconcile of each pool
	// that existed when the controller started adopts the reports the Nodes
	// showed then (see adoptReports). seen: the pools reconciled in this
	// process; adoptPending: pools whose reports are to be adopted, with the
	// network that bounds them.
	trustFirst   bool
	seen         map[string]bool
	adoptPending map[string]iprange.Range
	goneChecked  bool
	// listed: the pools that existed when goneChecked was set, by key, with
	// their UIDs: only those may adopt reports.
	listed map[string]types.UID
	// atStart: the reports as the first reconcile after the memory was loaded
	// found them (the Nodes' and the Lease's), which is all that adoption
	// takes; a report written later counts only within grants. nil before that
	// reconcile and once nothing is left to adopt (adoptOver).
	atStart   map[string]seenReport
	adoptOver bool
	// unlisted: what the reports at the start said of pools that did not
	// exist then, by pool key and node, until such a pool is created (see
	// endAdoption); only with trustFirst.
	unlisted map[string]map[string]parsedHold
	// flags: per node, the ignored parts of its current report already reported.
	flags   map[string]map[string]bool
	version uint64 // bumped by every change the payload depends on
	savedAt uint64 // the version the Lease holds
	saved   string // the payload the Lease holds (as far as this process knows)
	warned  string // the last save error logged
	// fellTo: 1 + the lowest keptReport level Save had to fall back to (and
	// said so); 0 before any.
	fellTo int
	// MaxParts bounds the Leases the per-node parts are spread over (see
	// writeParts); 0 means maxMemoryParts.
	MaxParts int
	// parts: the value each part Lease holds, as this process wrote or read
	// it (an unchanged part is not written again); partsOf the part count the
	// Lease names.
	parts   map[string]string
	partsOf int
	// recordsOnly: the per-node records are the memory (Records on): the
	// Lease is read once, for what a controller before them kept, and not
	// written again but to say that its content moved (see moveOut).
	// leaseHad: the Lease held such content; legacy: it held reports but no
	// grants (a controller before grants were kept), whose reports are
	// adopted; moved: the Lease says so now.
	recordsOnly bool
	leaseHad    bool
	legacy      bool
	moved       bool
}

// seenReport is a node's held report and when the controller last saw it.
type seenReport struct {
	raw string
	// parsed is raw decoded; opaque says why it cannot be (see parseReport),
	// bad lists its entries that are not ranges.
	parsed map[string]parsedHold
	opaque string
	bad    []string
	seen   time.Time
	// gone: when a pass first found the Node gone (zero while it is listed).
	// Its grace period counts from then, not from seen: after a quiet spell
	// seen is long past, and a Node deleted a moment ago would lose its
	// report at once (issue 38).
	gone time.Time
	// live: the Node showed the report when last seen.
	live bool
	// kept: the report was read from the Lease, and the Node has not shown
	// one since. The Lease keeps of a live report only what no status
	// records: a block the status covered is missing from it, and taken
	// from the node it is presumed reported (see presume).
	kept bool
	pass uint64 // the lastReports call that last found the Node
}

// keptReservations are a pool's reservations as the Lease keeps them.
type keptReservations struct {
	UID    types.UID   `json:"uid"`
	Ranges []keptRange `json:"ranges"`
}

type keptRange struct {
	Node  string    `json:"node"`
	Range string    `json:"range"`
	Until time.Time `json:"until"`
}

// memoryPayload is what the Lease's annotation holds, as JSON.
type memoryPayload struct {
	Reports  map[string]string           `json:"reports"`
	Reserved map[string]keptReservations `json:"reserved,omitempty"`
	// Given are the grants (see trust.go) by pool key and node; Pools the pools
	// the controller knows. A payload without Pools was written before grants
	// were kept.
	Given map[string]map[string][]keptGrant `json:"given,omitempty"`
	Pools map[string]knownPool              `json:"pools"`
	// Parts, in the Lease itself, says that the per-node parts (Reports,
	// Given) are spread over Parts more Leases (see partName), by a hash of
	// the node's name; 0: all here.
	Parts int `json:"parts,omitempty"`
	// MovedToRecords: what the Lease kept is in the NodeIPAMs now, and it
	// keeps nothing (see moveOut). Without Pools, a controller of an earlier
	// version that reads it adopts the reports the Nodes show at its start.
	MovedToRecords bool `json:"movedToRecords,omitempty"`
}

func newReport(raw string, seen time.Time, live bool) seenReport {
	r := seenReport{raw: raw, seen: seen, live: live}
	r.parsed, r.opaque, r.bad = parseReport(raw)
	return r
}

// load reads the Lease once, before the first reports are used; a reconcile
// that gets an error requeues. A Lease the controller may not read (RBAC) leaves
// the memory in this process alone, logged once (Save tries again); one that
// cannot be decoded is logged and ignored.
func (m *Memory) load(ctx context.Context, now time.Time) error {
	m.loadMu.Lock()
	defer m.loadMu.Unlock()
	if m.isLoaded() {
		return nil
	}
	var err error
	if m.Lease.Name != "" {
		err = m.read(ctx, now)
	} else {
		m.mu.Lock()
		m.init()
		m.trustFirst = true
		m.mu.Unlock()
	}
	switch {
	case apierrors.IsForbidden(err):
		m.Log.Error(err, "cannot read the Lease that keeps the daemons' held reports across restarts; they are kept in "+
			"memory only, and the Lease is not written until it can be read: grant get, create and update on leases "+
			"in its namespace", "lease", m.Lease.String())
		m.mu.Lock()
		m.init()
		m.unread, m.trustFirst = true, true
		m.mu.Unlock()
	case err != nil:
		return err
	}
	if m.Records != nil {
		recs, ok, err := m.Records.RecordsToRestore(ctx)
		if err != nil {
			return fmt.Errorf("reading the NodeIPAMs (the nodes' retired blocks) before the first plan: %w", err)
		}
		if ok {
			gone := goneBlocks(ctx, m.Records, recs)
			m.mu.Lock()
			m.init()
			if n := m.restoreRecords(recs, now); n > 0 {
				m.Log.Info("read the retired blocks the nodes' records keep", "blocks", n, "records", len(recs))
			}
			for node, bs := range gone {
				for _, b := range bs {
					if r, err := b.Range(); err == nil {
						m.addGrant(v1alpha1.PoolKey(b.Kind, b.Pool), node, grant{Range: r, Since: now, UID: b.PoolUID})
					}
				}
			}
			// The records are the memory from now on. A fresh install, or
			// one whose Lease was lost, trusts no report beyond them: a node
			// without a record holds nothing the controller did not give it
			// (only a Lease of a controller before grants were kept has its
			// reports adopted, as that controller would have).
			m.recordsOnly = true
			if !m.legacy {
				m.trustFirst = false
				clear(m.adoptPending)
			}
			// Every node with a grant or a kept report has it in its record,
			// whichever store it was read from (a Lease of a controller
			// before records kept them, on the first start of this version):
			// loaded first, so that the writes queued here write them.
			m.loaded = true
			for _, byNode := range m.given {
				for node := range byNode {
					m.retiredChanged(node)
				}
			}
			for node := range m.reports {
				m.retiredChanged(node)
			}
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	m.loaded = true
	m.mu.Unlock()
	return nil
}

// grantAge is MinGrantAge, or minGrantAge when it is not set.
func (m *Memory) grantAge() time.Duration {
	if m.MinGrantAge > 0 {
		return m.MinGrantAge
	}
	return minGrantAge
}

func (m *Memory) isLoaded() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loaded
}

// init makes the maps; with mu held.
func (m *Memory) init() {
	if m.reports == nil {
		m.reports = map[string]seenReport{}
		m.status = map[string]poolStatus{}
		m.reserved = map[string]keptReservations{}
		m.given = map[string]map[string][]grant{}
		m.pools = map[string]knownPool{}
		m.seen = map[string]bool{}
		m.adoptPending = map[string]iprange.Range{}
		m.flags = map[string]map[string]bool{}
		m.listed = map[string]types.UID{}
		m.unlisted = map[string]map[string]parsedHold{}
	}
}

// read reads the Lease and adds the reports it keeps to the memory, seen at now
// (a report the memory has already is newer and stays).
func (m *Memory) read(ctx context.Context, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var lease coordinationv1.Lease
	err := m.Reader.Get(ctx, m.Lease, &lease)
	if apierrors.IsNotFound(err) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("reading Lease %s (the daemons' held reports): %w", m.Lease, err)
	}
	var payload string
	var kept memoryPayload
	if value := lease.Annotations[MemoryAnnotation]; value != "" {
		if payload, kept, err = decodeMemory(value); err != nil {
			m.Log.Error(err, "ignoring the held reports kept in the Lease", "lease", m.Lease.String())
			payload = ""
		}
	}
	parts, err := m.readParts(ctx, &kept)
	if err != nil {
		return err
	}
	if kept.Parts > 0 {
		full := kept
		full.Parts = 0
		b, _ := json.Marshal(full)
		payload = string(b)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	m.parts, m.partsOf = parts, kept.Parts
	for node, raw := range kept.Reports {
		if _, ok := m.reports[node]; !ok {
			rep := newReport(raw, now, false)
			rep.kept = true
			m.reports[node] = rep
			if m.atStart != nil {
				// Read after the first reconcile (the Lease was forbidden
				// then): what a controller kept is adopted with the rest.
				m.atStart[node] = rep
			}
		}
	}
	for pool, rs := range kept.Reserved {
		if _, ok := m.reserved[pool]; !ok {
			m.reserved[pool] = rs
		}
	}
	m.restoreGrants(kept.Given)
	if m.Records != nil {
		// A record lists a reservation as a retired block: one the Lease
		// kept without a grant (a controller before grants were kept) is
		// made one.
		for resKey, rs := range kept.Reserved {
			_, key, _ := strings.Cut(resKey, "/")
			for _, kr := range rs.Ranges {
				if r, err := iprange.ParseRange(kr.Range); err == nil && now.Before(kr.Until) {
					m.addGrant(key, kr.Node, grant{Range: r, Since: now, UID: rs.UID})
				}
			}
		}
	}
	for key, kp := range kept.Pools {
		if _, ok := m.pools[key]; !ok {
			m.pools[key] = kp
		}
	}
	// No grants kept (no Lease, or one from before they were): nothing to check
	// reports against until each pool's first reconcile adopts them.
	m.trustFirst = kept.Pools == nil
	m.leaseHad = payload != "" && !kept.MovedToRecords
	m.legacy = m.leaseHad && kept.Pools == nil
	m.moved = kept.MovedToRecords
	if m.trustFirst {
		// The pools reconciled before the Lease could be read adopt the
		// reports it kept too (those of a controller before grants were kept).
		for key := range m.seen {
			if network, err := iprange.ParseRange(m.pools[key].Network); err == nil {
				m.adoptPending[key] = network
			}
		}
		if m.adoptOver {
			// Past the start: only what that controller kept, never a report
			// written since.
			fromLease := make(map[string]seenReport, len(kept.Reports))
			for node, raw := range kept.Reports {
				fromLease[node] = newReport(raw, now, false)
			}
			m.adoptFrom(fromLease, now)
		} else {
			m.adoptReports(now)
		}
	}
	m.saved, m.unread = payload, false
	m.version++
	if len(kept.Reports)+len(kept.Reserved) > 0 {
		m.Log.Info("read the daemons' held reports and reservations kept in the Lease", "lease", m.Lease.String(),
			"nodes", len(kept.Reports), "pools with reservations", len(kept.Reserved))
	}
	return nil
}

// reportsFor returns, for the pool with key and network, what the daemons'
// reports count for (see readReports), after taking in the Nodes' reports (see
// lastReports), adopting what is to be adopted and pruning the grants.
func (m *Memory) reportsFor(nodes []client.Object, now time.Time, grace time.Duration, key string,
	network iprange.Range) (reports, []ignoredReport) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	m.lastReports(nodes, now, grace)
	if m.atStart == nil && !m.adoptOver {
		m.atStart = maps.Clone(m.reports)
	}
	m.adoptReports(now)
	m.endAdoption()
	m.pruneGrants(now, grace)
	return m.readReports(key, network)
}

// lastReports takes in every node's held report. A Node re-registered without
// annotations keeps the report last seen for as long as it exists, until its
// daemon reports again: the daemon still holds what it reported, and if it is
// down (killed, crash-looping) it cannot say otherwise, however long that takes.
// A node whose Node object is gone keeps it for grace, counted from the first
// call that found the Node gone. With mu held.
func (m *Memory) lastReports(nodes []client.Object, now time.Time, grace time.Duration) {
	m.now = now
	// Reports of listed Nodes get this pass's number (no set of 5,000 names).
	m.pass++
	for _, n := range nodes {
		name := n.GetName()
		raw, shown := n.GetAnnotations()[v1alpha1.HeldAnnotation]
		rep, had := m.reports[name]
		switch {
		case shown && had && rep.live && rep.raw == raw:
			rep.seen = now
		case shown:
			if !had || rep.raw != raw {
				delete(m.flags, name) // a new report: what it ignores is reported anew
			}
			m.reportsChanged(name, !had)
			rep = newReport(raw, now, true)
			m.version++
		case had:
			if rep.live {
				m.version++
			}
			rep.seen, rep.live = now, false
		default:
			continue
		}
		rep.pass, rep.gone = m.pass, time.Time{}
		m.reports[name] = rep
	}
	for name, rep := range m.reports {
		if rep.pass != m.pass {
			// The Node is gone: its whole report is kept, for grace from
			// the first pass that found it gone.
			if rep.gone.IsZero() {
				rep.gone = now
				m.reports[name] = rep
			}
			if now.Sub(rep.gone) >= grace {
				delete(m.reports, name)
				delete(m.flags, name)
				m.reportsChanged(name, true)
				m.version++
				continue
			}
			if rep.live {
				rep.live = false
				m.reports[name] = rep
				m.version++
			}
		}
	}
}

// blocksOf records the blocks the status of the pool with key gives nodes, as
// a reconcile of it read them (own, which the caller no longer changes, is kept
// as it is). A block the status gave a node at the last reconcile and no longer
// does becomes a grant of the node (the reconcile that took it recorded it
// already, unless the status changed otherwise).
func (m *Memory) blocksOf(key string, own poolStatus, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	old, ok := m.status[key]
	if ok && old.equal(own) {
		return
	}
	var taken []planner.Misfit
	for node, b := range old.all() {
		if cur, still := own.block(node); !still || cur != b {
			taken = append(taken, planner.Misfit{Node: node, Range: b})
		}
	}
	m.retireLocked(key, taken, now)
	m.status[key] = own
	m.version++
}

// blocksOfPlan is blocksOf for the blocks as of layout, without building the
// pool's poolStatus anew when the memory has it already (most reconciles: some
// 3 MB a pool at 100,000 nodes that the collector would otherwise sweep).
func (m *Memory) blocksOfPlan(key string, layout blocks.Layout, as []planner.Assignment, now time.Time) {
	m.mu.Lock()
	old, ok := m.status[key]
	same := ok && old.len() == len(as)
	for i := 0; same && i < len(as); i++ {
		b, has := old.block(as[i].Node)
		same = has && b == layout.Block(as[i].Index)
	}
	m.mu.Unlock()
	if !same { // blocksOf compares again, under its own lock
		m.blocksOf(key, statusOf(layout, as), now)
	}
}

// payload is what the Lease is to keep (see Memory), as JSON; with mu held.
func (m *Memory) payload(level int) string {
	b, _ := json.Marshal(m.payloadOf(level)) // maps: sorted keys
	return string(b)
}

// payloadOf is what the Lease is to keep; with mu held.
func (m *Memory) payloadOf(level int) memoryPayload {
	kept := make(map[string]string, len(m.reports))
	for node, rep := range m.reports {
		part := m.keptReport(node, rep, level)
		if part == nil {
			continue
		}
		if b, err := json.Marshal(part); err == nil {
			kept[node] = string(b)
		}
	}
	// Reservations that ended are left out (of a pool gone while the
	// controller was down, nothing else would remove them).
	reserved := make(map[string]keptReservations, len(m.reserved))
	for pool, rs := range m.reserved {
		live := slices.DeleteFunc(slices.Clone(rs.Ranges), func(r keptRange) bool { return !m.now.Before(r.Until) })
		if len(live) > 0 {
			reserved[pool] = keptReservations{UID: rs.UID, Ranges: live}
		}
	}
	return memoryPayload{Reports: kept, Reserved: reserved, Given: m.keptGrants(), Pools: maps.Clone(m.pools)}
}

// emptyPayload is the payload of a memory that keeps nothing: no Lease is
// created for it.
const emptyPayload = `{"reports":{},"pools":{}}`

// keepReservations records the reservations of pool (with uid) that are live:
// none drops the pool's.
func (m *Memory) keepReservations(pool string, uid types.UID, rs []reservation) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	kept := keptReservations{UID: uid}
	for _, r := range rs {
		kept.Ranges = append(kept.Ranges, keptRange{Node: r.Node, Range: r.Range.String(), Until: r.Until.UTC()})
	}
	old, had := m.reserved[pool]
	switch {
	case len(rs) == 0 && !had:
		return
	case len(rs) == 0:
		delete(m.reserved, pool)
	case had && old.UID == uid && slices.EqualFunc(old.Ranges, kept.Ranges, func(a, b keptRange) bool {
		return a.Node == b.Node && a.Range == b.Range && a.Until.Equal(b.Until)
	}):
		return
	default:
		m.reserved[pool] = kept
		// A reservation new or longer is written into its node's record; one
		// that ended or went needs no write (see mergeRetired, pruneGrants).
		for _, r := range kept.Ranges {
			if !slices.ContainsFunc(old.Ranges, func(o keptRange) bool {
				return o.Node == r.Node && o.Range == r.Range && !o.Until.Before(r.Until)
			}) || old.UID != uid {
				m.retiredChanged(r.Node)
			}
		}
	}
	m.version++
}

// reservationsOf returns the reservations kept of pool, if it is the same pool
// (uid), for a reconciler that knows none of its own; none ends later than
// grace from now (the grace period may have been shortened, the clock moved).
func (m *Memory) reservationsOf(pool string, uid types.UID, now time.Time, grace time.Duration) []reservation {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept, ok := m.reserved[pool]
	if !ok || kept.UID != uid {
		return nil
	}
	var out []reservation
	for _, r := range kept.Ranges {
		rg, err := iprange.ParseRange(r.Range)
		if err != nil || !now.Before(r.Until) {
			continue
		}
		out = append(out, reservation{Misfit: planner.Misfit{Node: r.Node, Range: rg}, Until: minTime(r.Until, now.Add(grace))})
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// errTooLarge: the memory does not fit in the Lease's annotation.
var errTooLarge = fmt.Errorf("the daemons' held reports take more than %d bytes compressed, more than a Lease "+
	"annotation may hold; changes are kept in memory only", maxMemoryBytes)

// Save writes the memory to the Lease if it changed since the last save (or
// read), creating the Lease when missing. Nothing is written before the Lease
// was read: what it kept would be lost.
func (m *Memory) Save(ctx context.Context) error {
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	loaded, unread, now := m.loaded, m.unread, m.now
	m.mu.Unlock()
	if !loaded || m.Lease.Name == "" {
		return nil
	}
	if m.isRecordsOnly() {
		return m.moveOut(ctx)
	}
	if unread {
		if err := m.read(ctx, now); err != nil {
			return fmt.Errorf("not writing the Lease before it can be read: %w", err)
		}
	}
	m.mu.Lock()
	if m.version == m.savedAt {
		m.mu.Unlock()
		return nil
	}
	version, full, saved := m.version, m.payloadOf(keepAll), m.saved
	m.mu.Unlock()
	pb, _ := json.Marshal(full)
	payload := string(pb)
	if payload != saved && (saved != "" || payload != emptyPayload) {
		err := m.writeParts(ctx, full)
		// Too large: first the blocks the status covers go, then the empty
		// reports that say which daemons report (they grow with the node
		// count: some 3.5 bytes a node compressed, the blocks some 8 a node
		// and pool); the grants, reservations and reports with content stay.
		for level := keepAll - 1; errors.Is(err, errTooLarge) && level >= keepCounted; level-- {
			m.mu.Lock()
			less := m.payloadOf(level)
			m.mu.Unlock()
			sb, _ := json.Marshal(less)
			smaller := string(sb)
			switch {
			case smaller == payload:
				continue
			case smaller == saved:
				err, payload = nil, smaller
			default:
				err = m.writeParts(ctx, less)
				payload = smaller
			}
			if err == nil && (m.fellTo == 0 || level+1 < m.fellTo) {
				m.Log.Info("the Lease keeps less of the daemons' reports: too many nodes and pools for its annotation; a Node "+
					"re-registered while no controller sees it, its daemon silent, keeps less of its blocks (docs/pools.md)",
					"lease", m.Lease.String(), "coveredBlocks", level >= keepAll, "whichNodesReport", level >= keepMarkers)
				m.fellTo = level + 1
			}
		}
		if err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.saved, m.savedAt = payload, max(m.savedAt, version)
	m.mu.Unlock()
	return nil
}

// write stores an encoded payload in the Lease, creating it if missing.
func (m *Memory) write(ctx context.Context, value string) error {
	return m.writeLease(ctx, m.Lease, value)
}

// writeLease stores an encoded payload (or part) in the Lease named key.
func (m *Memory) writeLease(ctx context.Context, key types.NamespacedName, value string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if len(value) > maxMemoryBytes {
		return errTooLarge
	}
	var lease coordinationv1.Lease
	err := m.Reader.Get(ctx, key, &lease)
	switch {
	case apierrors.IsNotFound(err):
		lease = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Annotations: map[string]string{MemoryAnnotation: value}}}
		err = m.Client.Create(ctx, &lease)
	case err == nil:
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[MemoryAnnotation] = value
		err = m.Client.Update(ctx, &lease)
	}
	if err != nil {
		writeFailures.WithLabelValues(failedLease).Inc()
		return fmt.Errorf("writing Lease %s (the daemons' held reports): %w", key, err)
	}
	return nil
}

// Start saves the memory every Interval until ctx ends, and once more then; a
// failed save is logged (once until the error changes) and tried again.
func (m *Memory) Start(ctx context.Context) error {
	interval := m.Interval
	if interval == 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.lastSave(ctx)
			return nil
		case <-t.C:
		}
		err := m.Save(ctx)
		switch {
		case err != nil && err.Error() != m.warned && ctx.Err() == nil:
			m.Log.Error(err, "saving the daemons' held reports; trying again")
			m.warned = err.Error()
		case err == nil && m.warned != "":
			m.Log.Info("saved the daemons' held reports again")
			m.warned = ""
		}
	}
}

// lastSave saves what changed since the last tick, on the way out.
func (m *Memory) lastSave(ctx context.Context) {
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.Save(final); err != nil {
		m.Log.Error(err, "saving the daemons' held reports on the way out")
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader reconciles, so only its memory is current.
func (*Memory) NeedLeaderElection() bool { return true }

func encodeMemory(payload string) (string, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, payload); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b.Bytes()), nil
}

// decodeMemory returns the payload an annotation value holds, decoded.
func decodeMemory(value string) (string, memoryPayload, error) {
	var kept memoryPayload
	gz, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		return "", kept, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return "", kept, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, 64<<20))
	if err != nil {
		return "", kept, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	if err := json.Unmarshal(data, &kept); err != nil {
		return "", kept, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	if kept.Reports == nil {
		return "", kept, errors.New("annotation " + MemoryAnnotation + " holds no reports")
	}
	return string(data), kept, nil
}
