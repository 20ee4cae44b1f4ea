package poolcontroller

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// The trust boundary of the daemons' held reports (v1alpha1.HeldAnnotation).
//
// A daemon may write only its own Node (deploy/policy), but what it reports
// decides where other nodes may get blocks. So a report counts only within what
// the controller gave that node: in each pool, the node's block in the pool's
// status and the blocks taken from it since (by an edit, a release, the pool's
// deletion: grants, kept in the Memory and its Lease for as long as the daemon
// reports holding something in them, and at least the grace period). Whatever a
// report says beyond that — pools the node never had a block in, ranges outside
// its blocks — is ignored for planning, reported once per report (a log line, an
// event on the Node, hwipam_controller_held_reports_ignored_total) and never
// reduces what other nodes get.
//
// A report the controller cannot read (over maxReportBytes, not JSON) counts as
// holding every block the controller gave the node: it can cost only the node's
// own grants, and a daemon that writes one by mistake loses nothing.
//
// Without records (see Memory), two moments have no grants to check against,
// and there the reports are taken as they stood at the controller's first
// reconcile after its start, clipped to the pool's network (adoptReports): a
// controller without a memory of grants (a
// fresh install, a Lease that was deleted or cannot be read), for each pool that
// existed then at its first reconcile and for a pool that did not when it is
// created; and a pool the memory knew that was deleted or re-created while no
// controller ran. A report written after that counts only within grants.

const (
	// maxReportBytes: a longer report is not decoded. A daemon's report is a few
	// hundred bytes per pool; the API server allows 256 KiB of annotations.
	maxReportBytes = 64 << 10
	// maxRangesPerPool: more counted ranges in one pool are replaced by their
	// span within each of the node's grants, which bounds what the memory keeps
	// of one node by the number of blocks the controller gave it.
	maxRangesPerPool = 32
	// minGrantAge: a block taken from a node stays granted to it at least this
	// long, and at least the grace period, for a daemon that reports late.
	minGrantAge = time.Minute
)

// Reasons of hwipam_controller_held_reports_ignored_total.
const (
	ignoredOversized = "oversized"
	ignoredMalformed = "malformed"
	ignoredNoBlock   = "noBlock"
	ignoredOutside   = "outsideBlocks"
)

// grant is a block taken from a node (or adopted for it) that its daemon may
// still hold addresses in.
type grant struct {
	Range iprange.Range
	Since time.Time
	// UID is the UID of the pool that gave the block; empty when not known
	// (kept by a controller before it was).
	UID types.UID
}

// keptGrant is a grant as the Lease keeps it.
type keptGrant struct {
	Range string    `json:"range"`
	Since time.Time `json:"since"`
	UID   types.UID `json:"uid,omitempty"`
}

// knownPool is a pool the controller has reconciled, as the Lease keeps it: a
// pool that was deleted or re-created while no controller ran is recognised by
// its UID, and its network bounds what is adopted for it (see adopt).
type knownPool struct {
	UID     types.UID `json:"uid"`
	Network string    `json:"network"`
	// Gone: the controller saw the pool deleted, and kept its blocks as grants.
	Gone bool `json:"gone,omitempty"`
}

// parsedHold is one pool's entry of a report, parsed.
type parsedHold struct {
	block iprange.Range // the zero Range: none
	held  []iprange.Range
}

// ignoredReport is a part of a node's report that does not count.
type ignoredReport struct {
	node   string
	reason string // one of the ignored* constants
	text   string
}

// parseReport decodes a report; opaque says why it cannot be read ("" when it
// can), bad lists the entries that are not ranges.
func parseReport(raw string) (parsed map[string]parsedHold, opaque string, bad []string) {
	if len(raw) > maxReportBytes {
		return nil, fmt.Sprintf("is %d bytes, more than the %d the controller reads", len(raw), maxReportBytes), nil
	}
	var holds map[string]v1alpha1.PoolHold
	if err := json.Unmarshal([]byte(raw), &holds); err != nil {
		return nil, fmt.Sprintf("is not a JSON object of pools (%v)", err), nil
	}
	parsed = make(map[string]parsedHold, len(holds))
	for key, h := range holds {
		var p parsedHold
		if h.Block != "" {
			b, err := iprange.ParseRange(h.Block)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%q in pool %q", h.Block, key))
			}
			p.block = b
		}
		for _, s := range h.Held {
			r, err := iprange.ParseRange(s)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%q in pool %q", s, key))
				continue
			}
			p.held = append(p.held, r)
		}
		parsed[key] = p
	}
	slices.Sort(bad)
	const maxListed = 3
	if len(bad) > maxListed {
		bad = append(bad[:maxListed], fmt.Sprintf("and %d more", len(bad)-maxListed))
	}
	return parsed, "", bad
}

// grantsOf returns what the controller gave node in the pool with key: its
// block in the pool's status at the last reconcile, and its grants; with mu held.
func (m *Memory) grantsOf(node, key string) []iprange.Range {
	var out []iprange.Range
	if b, ok := m.status[key].block(node); ok {
		out = append(out, b)
	}
	for _, g := range m.given[key][node] {
		out = append(out, g.Range)
	}
	return out
}

// counted is what a report counts for in one pool.
type counted struct {
	// block is the reported block, when it lies in a grant; covered tells that
	// the pool's status gives the node a block covering it.
	block   iprange.Range
	covered bool
	// held are the reported ranges outside the block, clipped to the grants.
	held []iprange.Range
}

// count returns what node's report counts for in the pool with key, and a text
// for what it reports there that does not count ("" when everything does); with
// mu held.
func (m *Memory) count(node string, rep seenReport, key string) (counted, string) {
	grants := m.grantsOf(node, key)
	var c counted
	if rep.opaque != "" {
		// Its block in status is its own anyway (and other pools' blocks are
		// out of every pool's reach).
		for _, g := range m.given[key][node] {
			c.held = append(c.held, g.Range)
		}
		return c, ""
	}
	h, ok := rep.parsed[key]
	if !ok {
		return c, ""
	}
	if len(grants) == 0 {
		if _, listed := m.listed[key]; listed && !m.reconciled(key) {
			// A pool not reconciled yet in this process: its blocks are not
			// known, and its status keeps them from other pools meanwhile.
			return c, ""
		}
		return c, fmt.Sprintf("reports pool %q, in which the controller never gave it a block", key)
	}
	var outside []string
	if h.block.Start.IsValid() {
		if slices.ContainsFunc(grants, func(g iprange.Range) bool { return g.Covers(h.block) }) {
			c.block = h.block
			cur, assigned := m.status[key].block(node)
			c.covered = assigned && cur.Covers(h.block)
		} else {
			outside = append(outside, "block "+h.block.String())
		}
	}
	for _, r := range h.held {
		in := clip(r, grants)
		if len(in) != 1 || in[0] != r {
			outside = append(outside, r.String())
		}
		c.held = append(c.held, in...)
	}
	if len(c.held) > maxRangesPerPool {
		c.held = spans(c.held, grants)
	}
	if len(outside) == 0 {
		return c, ""
	}
	const maxListed = 3
	more := ""
	if len(outside) > maxListed {
		more = fmt.Sprintf(" and %d more", len(outside)-maxListed)
		outside = outside[:maxListed]
	}
	return c, fmt.Sprintf("reports %s%s in pool %q, outside the blocks the controller gave it (%s)",
		strings.Join(outside, ", "), more, key, joinRanges(grants))
}

// clip returns the parts of r inside the ranges of in (which may overlap).
func clip(r iprange.Range, in []iprange.Range) []iprange.Range {
	var out []iprange.Range
	for _, g := range in {
		if !g.Overlaps(r) {
			continue
		}
		s, e := r.Start, r.End
		if s.Less(g.Start) {
			s = g.Start
		}
		if g.End.Less(e) {
			e = g.End
		}
		out = append(out, iprange.Range{Start: s, End: e})
	}
	if len(out) > 1 {
		out = iprange.Merge(out)
	}
	return out
}

// spans replaces ranges by their span within each grant they lie in: at most one
// range per grant.
func spans(rs, grants []iprange.Range) []iprange.Range {
	var out []iprange.Range
	for _, g := range grants {
		var span iprange.Range
		for _, r := range rs {
			if !g.Covers(r) {
				continue
			}
			if !span.Start.IsValid() || r.Start.Less(span.Start) {
				span.Start = r.Start
			}
			if !span.End.IsValid() || span.End.Less(r.End) {
				span.End = r.End
			}
		}
		if span.Start.IsValid() {
			out = append(out, span)
		}
	}
	return iprange.Merge(out)
}

// readReports collects, for the pool with key and network, what every node's
// report counts for (see count): the addresses it holds outside its block, a
// reported block that the pool's status no longer gives it (its daemon may
// still allocate from it until it reports again), and what it holds in other
// pools inside network. It returns what does not count too; with mu held.
func (m *Memory) readReports(key string, network iprange.Range) (reports, []ignoredReport) {
	return m.countReports(key, network, true)
}

// countReports is readReports; with leaveOthers false it counts every report
// in every pool it names (the tests' model of what readReports must give).
func (m *Memory) countReports(key string, network iprange.Range, leaveOthers bool) (reports, []ignoredReport) {
	out := reports{held: map[string][]iprange.Range{}}
	var ignored []ignoredReport
	// Nodes, and a readable report's pools, in map order: sorting them per
	// pool and reconcile was a quarter of a join's CPU at 100,000 nodes. What
	// is kept in order is sorted below (orphans, ignored); the foreign ranges
	// are sorted by the planner's index.
	for name, rep := range m.reports {
		if rep.opaque != "" {
			ignored = append(ignored, ignoredReport{node: name, reason: rep.opaqueReason(),
				text: rep.opaque + ": it counts as holding every block the controller gave the node, nothing more"})
		}
		if len(rep.bad) > 0 {
			ignored = append(ignored, ignoredReport{node: name, reason: ignoredMalformed,
				text: "has entries that are not address ranges: " + strings.Join(rep.bad, ", ")})
		}
		var buf [8]string
		keys := buf[:0]
		if rep.opaque == "" {
			for k := range rep.parsed {
				if !leaveOthers || k == key || !m.ownReconcileReads(rep, k, network) {
					keys = append(keys, k)
				}
			}
		} else {
			keys = m.reportedKeys(name, rep)
		}
		for _, k := range keys {
			c, why := m.count(name, rep, k)
			if why != "" {
				reason := ignoredOutside
				if len(m.grantsOf(name, k)) == 0 {
					reason = ignoredNoBlock
				}
				ignored = append(ignored, ignoredReport{node: name, reason: reason, text: why})
			}
			rs := c.held
			if k == key && len(rs) > 0 {
				out.orphans = append(out.orphans, fmt.Sprintf("%s: %s", name, joinRanges(rs)))
			}
			if c.block.Start.IsValid() && (k != key || !c.covered) {
				rs = append(rs, c.block)
			}
			if k == key {
				out.held[name] = append(out.held[name], rs...)
				continue
			}
			for _, r := range rs {
				if r.Overlaps(network) {
					out.foreign = append(out.foreign, r)
				}
			}
		}
	}
	slices.Sort(out.orphans)
	slices.SortFunc(ignored, func(a, b ignoredReport) int {
		return cmp.Or(strings.Compare(a.node, b.node), strings.Compare(a.text, b.text))
	})
	return out, ignored
}

// ownReconcileReads says whether what a readable report says of another pool
// (k) can be left to that pool's own reconcile: the pool is one this process
// reconciles (its status gave blocks), and nothing the report names in it
// overlaps network, so that nothing of it is foreign to the pool being
// planned. What the report names there that does not count is then reported
// (an event on that pool, the metric) by that pool's reconcile, which a
// change of the report triggers as it triggers every pool's. Before, every
// pool's reconcile counted every node's report in every pool: 8 pools at
// 100,000 nodes made that half of a join's CPU. With mu held.
func (m *Memory) ownReconcileReads(rep seenReport, k string, network iprange.Range) bool {
	if rep.opaque != "" || m.status[k].len() == 0 {
		return false
	}
	h := rep.parsed[k]
	if h.block.Start.IsValid() && h.block.Overlaps(network) {
		return false
	}
	return !iprange.OverlapsAny(network, h.held)
}

// reportedKeys are the pools node's report speaks of: those it names, and for a
// report that cannot be read, every pool the node has grants in; with mu held.
func (m *Memory) reportedKeys(node string, rep seenReport) []string {
	if rep.opaque == "" {
		return slices.Sorted(maps.Keys(rep.parsed))
	}
	var keys []string
	for key, st := range m.status {
		if st.has(node) {
			keys = append(keys, key)
		}
	}
	for key, byNode := range m.given {
		if _, ok := byNode[node]; ok && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return keys
}

func (r seenReport) opaqueReason() string {
	if len(r.raw) > maxReportBytes {
		return ignoredOversized
	}
	return ignoredMalformed
}

// retire records blocks taken from nodes in the pool with key as grants, since
// now; it tells whether it recorded any that were not yet.
func (m *Memory) retire(key string, taken []planner.Misfit, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	return m.retireLocked(key, taken, now)
}

func (m *Memory) retireLocked(key string, taken []planner.Misfit, now time.Time) bool {
	added := false
	for _, t := range taken {
		if !t.Range.Start.IsValid() {
			continue
		}
		m.presume(t.Node, key, t.Range)
		if m.addGrant(key, t.Node, grant{Range: t.Range, Since: now, UID: m.pools[key].UID}) {
			added = true
		}
	}
	return added
}

// addGrant gives node g in the pool with key, unless it has a grant of that
// range already, and tells the records (see retired.go); it says whether it
// added it. With mu held.
func (m *Memory) addGrant(key, node string, g grant) bool {
	byNode := m.given[key]
	if byNode == nil {
		byNode = map[string][]grant{}
		m.given[key] = byNode
	}
	if slices.ContainsFunc(byNode[node], func(x grant) bool { return x.Range == g.Range }) {
		return false
	}
	byNode[node] = append(byNode[node], g)
	m.version++
	m.retiredChanged(node)
	return true
}

// presume records block, taken from node in the pool with key, as reported by
// node when its report is one kept from before this process started that its
// Node no longer shows (see seenReport.kept) and names nothing in that pool:
// the daemon reported, but what the status covered is lost with its Node's
// annotations (the Node re-registered while no controller ran), and its
// daemon, down or cut off, cannot report it again. It counts until the
// daemon reports again, or the Node is gone for the grace period. With mu
// held.
func (m *Memory) presume(node, key string, block iprange.Range) {
	rep, ok := m.reports[node]
	if !ok || !rep.kept || rep.parsed == nil {
		return
	}
	if _, named := rep.parsed[key]; named {
		return
	}
	rep.parsed[key] = parsedHold{block: block}
	m.version++
}

// know records the pool with key as the controller sees it in a reconcile. A
// memory without grants (see trustFirst) adopts the reports of a pool at its
// first reconcile in this process, if the pool existed when the controller
// started: of a pool created since, every block is one this controller gave,
// and a report of it counts only within those.
func (m *Memory) know(key string, uid types.UID, network iprange.Range) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	if m.trustFirst && !m.seen[key] {
		listedUID, listed := m.listed[key]
		switch {
		case !m.adoptOver && listed && listedUID == uid:
			m.adoptPending[key] = network
		case !listed && (!m.adoptOver || m.unlisted[key] != nil):
			// Created after the start: only what the reports said of it
			// then (see endAdoption).
			m.adoptPending[key] = network
		}
	}
	m.seen[key] = true
	kp := knownPool{UID: uid, Network: network.String()}
	if m.pools[key] != kp {
		m.pools[key] = kp
		m.version++
	}
}

// forgetPool records that the pool with key is gone: its blocks become grants
// of their nodes.
func (m *Memory) forgetPool(key string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	var taken []planner.Misfit
	for node, b := range m.status[key].all() {
		taken = append(taken, planner.Misfit{Node: node, Range: b})
	}
	m.retireLocked(key, taken, now)
	if m.status[key].len() > 0 {
		m.status[key] = poolStatus{}
		m.version++
	}
	if kp, ok := m.pools[key]; ok && !kp.Gone {
		kp.Gone = true
		m.pools[key] = kp
		m.version++
	}
}

// checkGone adopts, once per process, the reports of the pools the memory knew
// that were deleted or re-created while no controller ran (pools: those of the
// namespace). The memory is loaded.
func (m *Memory) checkGone(pools []pool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	if m.goneChecked {
		return
	}
	m.goneChecked = true
	existing := make(map[string]types.UID, len(pools))
	for _, p := range pools {
		existing[p.storeKey()] = p.object().GetUID()
		m.listed[p.storeKey()] = p.object().GetUID()
	}
	for key, kp := range m.pools {
		if kp.Gone || existing[key] == kp.UID {
			continue
		}
		if network, err := iprange.ParseRange(kp.Network); err == nil {
			m.adoptPending[key] = network
		}
		if _, ok := existing[key]; !ok {
			kp.Gone = true
			m.pools[key] = kp
			m.version++
		}
	}
}

// adoptReports makes grants of what the nodes reported when the controller
// started (atStart; m.reports before the first reconcile) in the pools waiting
// for it (see know, checkGone), within the network recorded for each; past the
// start, only what the reports then said of pools that did not exist then
// (unlisted); never a report written since. With mu held.
func (m *Memory) adoptReports(now time.Time) {
	if !m.adoptOver {
		from := m.atStart
		if from == nil {
			from = m.reports
		}
		m.adoptFrom(from, now)
		return
	}
	pending := m.adoptPending
	m.adoptPending = map[string]iprange.Range{}
	for key, network := range pending {
		from := make(map[string]seenReport, len(m.unlisted[key]))
		for node, h := range m.unlisted[key] {
			from[node] = seenReport{parsed: map[string]parsedHold{key: h}}
		}
		delete(m.unlisted, key)
		m.adoptPending[key] = network
		m.adoptFrom(from, now)
	}
}

// adoptFrom adopts, for the pools waiting for it, what the reports from say;
// with mu held.
func (m *Memory) adoptFrom(from map[string]seenReport, now time.Time) {
	for key, network := range m.adoptPending {
		adopted := 0
		for node, rep := range from {
			h, ok := rep.parsed[key]
			if !ok {
				continue
			}
			rs := slices.Clone(h.held)
			if h.block.Start.IsValid() {
				rs = append(rs, h.block)
			}
			var taken []planner.Misfit
			for _, r := range rs {
				for _, in := range clip(r, []iprange.Range{network}) {
					taken = append(taken, planner.Misfit{Node: node, Range: in})
				}
			}
			if len(taken) > maxRangesPerPool {
				taken = taken[:0]
				for _, r := range spans(clipAll(rs, network), []iprange.Range{network}) {
					taken = append(taken, planner.Misfit{Node: node, Range: r})
				}
			}
			if len(taken) > 0 {
				m.retireLocked(key, taken, now)
				adopted++
			}
		}
		if adopted > 0 {
			m.Log.Info("took the nodes' held reports of a pool as they stood when the controller started, within its "+
				"network: no blocks are recorded to check them against (the first start of this version, a Lease lost, "+
				"or a pool deleted or re-created while no controller ran)", "pool", key, "network", network.String(), "nodes", adopted)
		}
		delete(m.adoptPending, key)
	}
}

// endAdoption drops the reports kept for adoption once nothing is left to
// adopt: every pool listed at the start has had its first reconcile (or
// adopts nothing) and none waits. A memory without grants keeps of them what
// they said of pools that did not exist then (unlisted): an honest daemon may
// hold addresses of a pool deleted before the start, and that pool may be
// created again. With mu held.
func (m *Memory) endAdoption() {
	if m.adoptOver || !m.goneChecked || len(m.adoptPending) > 0 {
		return
	}
	if m.trustFirst {
		for key := range m.listed {
			if !m.seen[key] {
				return
			}
		}
		for node, rep := range m.atStart {
			for key, h := range rep.parsed {
				if _, listed := m.listed[key]; listed || m.seen[key] {
					continue
				}
				if m.unlisted[key] == nil {
					m.unlisted[key] = map[string]parsedHold{}
				}
				m.unlisted[key][node] = h
			}
		}
	}
	m.atStart, m.adoptOver = nil, true
}

// reconciled tells whether a reconcile of the pool with key recorded its
// blocks in this process; with mu held.
func (m *Memory) reconciled(key string) bool {
	_, ok := m.status[key]
	return ok
}

func clipAll(rs []iprange.Range, network iprange.Range) []iprange.Range {
	var out []iprange.Range
	for _, r := range rs {
		out = append(out, clip(r, []iprange.Range{network})...)
	}
	return out
}

// pruneGrants drops the grants that are older than the grace period (and
// minGrantAge) in which the node's report holds nothing, and the pools gone
// with no grants left; with mu held.
func (m *Memory) pruneGrants(now time.Time, grace time.Duration) {
	age := max(grace, m.grantAge())
	for key, byNode := range m.given {
		for node, gs := range byNode {
			rep, reported := m.reports[node]
			kept := slices.DeleteFunc(gs, func(g grant) bool {
				if now.Sub(g.Since) < age {
					return false
				}
				if reported && rep.holdsIn(key, g.Range) {
					return false
				}
				m.version++
				m.retiredChanged(node)
				return true
			})
			if len(kept) == 0 {
				delete(byNode, node)
			} else {
				byNode[node] = kept
			}
		}
		if len(byNode) == 0 {
			delete(m.given, key)
		}
	}
	for key, kp := range m.pools {
		if _, ok := m.given[key]; kp.Gone && !ok {
			delete(m.pools, key)
			m.version++
		}
	}
}

// nextPrune returns when the first grant of the pool with key that no report
// holds anything in may be pruned (see pruneGrants); zero when none may. A
// reconcile then, so that a gone node's record does not keep its retired blocks
// until some other event.
func (m *Memory) nextPrune(key string, grace time.Duration) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	age := max(grace, m.grantAge())
	var next time.Time
	for node, gs := range m.given[key] {
		rep, reported := m.reports[node]
		for _, g := range gs {
			if reported && rep.holdsIn(key, g.Range) {
				continue
			}
			if at := g.Since.Add(age); next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	return next
}

// holdsIn tells whether the report may hold addresses in r in the pool with key.
func (r seenReport) holdsIn(key string, g iprange.Range) bool {
	if r.opaque != "" {
		return true
	}
	h := r.parsed[key]
	return (h.block.Start.IsValid() && h.block.Overlaps(g)) || iprange.OverlapsAny(g, h.held)
}

// flag tells whether an ignored part of a report is new (not yet reported for
// the node's current report), and remembers it.
func (m *Memory) flag(ig ignoredReport) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	seen := m.flags[ig.node]
	if seen == nil {
		seen = map[string]bool{}
		m.flags[ig.node] = seen
	}
	if seen[ig.text] {
		return false
	}
	seen[ig.text] = true
	return true
}

// keptReport is what the Lease keeps of node's report: per pool, what counts
// (see count). At keepAll, everything, the blocks the status covers included:
// a controller that starts later knows each reporting node's blocks also of a
// pool deleted meanwhile, and that the node reports (see seenReport.kept). At
// keepMarkers, of a live report only the pools with something no status
// records, and at least an empty report, which says that the node reports. At
// keepCounted, without the empty reports. (Save goes down the levels while the
// payload is too large for the Lease.) nil: nothing to keep. With mu held.
func (m *Memory) keptReport(node string, rep seenReport, level int) map[string]v1alpha1.PoolHold {
	var out map[string]v1alpha1.PoolHold
	if level >= keepMarkers && (rep.live || rep.kept) {
		out = map[string]v1alpha1.PoolHold{}
	}
	for _, key := range m.reportedKeys(node, rep) {
		c, _ := m.count(node, rep, key)
		var h v1alpha1.PoolHold
		if c.block.Start.IsValid() && (!rep.live || !c.covered || level >= keepAll) {
			h.Block = c.block.String()
		}
		for _, r := range c.held {
			h.Held = append(h.Held, rangeString(r))
		}
		if h.Block == "" && len(h.Held) == 0 {
			continue
		}
		if out == nil {
			out = map[string]v1alpha1.PoolHold{}
		}
		out[key] = h
	}
	return out
}

// What the Lease keeps of the reports (see keptReport), most first.
const (
	keepCounted = iota
	keepMarkers
	keepAll
)

// keptGrants is what the Lease keeps of the grants; with mu held.
func (m *Memory) keptGrants() map[string]map[string][]keptGrant {
	out := make(map[string]map[string][]keptGrant, len(m.given))
	for key, byNode := range m.given {
		kept := make(map[string][]keptGrant, len(byNode))
		for node, gs := range byNode {
			for _, g := range gs {
				kept[node] = append(kept[node], keptGrant{Range: g.Range.String(), Since: g.Since.UTC(), UID: g.UID})
			}
		}
		out[key] = kept
	}
	return out
}

// restoreGrants adds the grants the Lease keeps (one the memory has already
// stays); with mu held.
func (m *Memory) restoreGrants(kept map[string]map[string][]keptGrant) {
	for key, byNode := range kept {
		for node, gs := range byNode {
			for _, g := range gs {
				r, err := iprange.ParseRange(g.Range)
				if err != nil {
					continue
				}
				m.addGrant(key, node, grant{Range: r, Since: g.Since, UID: g.UID})
			}
		}
	}
}

// reportIgnored reports, once per report, what a node's report says that does
// not count: one log line naming the node, an event and the metric. The event is
// on the pool whose reconcile found it, with the Node as its related object: the
// controller may create events only in its own namespace (docs/rbac.md), and a
// Node's events live in "default".
func (r *Reconciler) reportIgnored(ctx context.Context, p pool, ignored []ignoredReport, nodes []metav1.PartialObjectMetadata) {
	if len(ignored) == 0 {
		return
	}
	mem := r.memory()
	logger := log.FromContext(ctx)
	for _, ig := range ignored {
		if !mem.flag(ig) {
			continue
		}
		heldReportsIgnored.WithLabelValues(ig.reason).Inc()
		logger.Info("ignoring part of a node's held report: its annotation "+ig.text, "node", ig.node, "reason", ig.reason)
		if r.Recorder == nil {
			continue
		}
		var related runtime.Object
		if i := slices.IndexFunc(nodes, func(n metav1.PartialObjectMetadata) bool { return n.Name == ig.node }); i >= 0 {
			related = &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
				ObjectMeta: metav1.ObjectMeta{Name: ig.node, UID: nodes[i].UID}}
		}
		r.Recorder.Eventf(p.object(), related, corev1.EventTypeWarning, "HeldReportIgnored", "Plan",
			"node %s: its %s annotation %s; that part is ignored for planning and takes nothing from other nodes. "+
				"Check the node's ipam-node daemon (a bug, or a daemon that is not hwipam's)", ig.node, v1alpha1.HeldAnnotation, ig.text)
	}
}

// rangeString is r as a daemon writes it in its report: one address alone.
func rangeString(r iprange.Range) string {
	if r.Start == r.End {
		return r.Start.String()
	}
	return r.String()
}

// grantRanges returns the grants of every node, in any pool, that overlap
// network: blocks taken from nodes that a report may still claim (see
// planner.Input.SpareExcluded).
func (m *Memory) grantRanges(network iprange.Range) []iprange.Range {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []iprange.Range
	for _, byNode := range m.given {
		for _, gs := range byNode {
			for _, g := range gs {
				if g.Range.Overlaps(network) {
					out = append(out, g.Range)
				}
			}
		}
	}
	return out
}
