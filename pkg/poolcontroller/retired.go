package poolcontroller

import (
	"cmp"
	"context"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// Retired blocks live in each node's record (NodeIPAMSpec.Retired), beside its
// current blocks: a block leaves a node's current blocks only in the write that
// lists it as retired, and a retired entry goes only once the memory has pruned
// the grant it is (see pruneGrants). The memory's grants and reservations are
// what the records are written from; a controller that starts reads them back
// from the records before its first plan (restoreRecords), whatever became of
// the Lease (deleted, too large to write, written by a controller before grants
// were kept). Nothing about one node's retired blocks is in an object shared by
// other nodes.

// Records is where the memory's grants and reservations are kept per node: the
// NodeIPAMs, as Delivery writes them.
type Records interface {
	// RecordsToRestore returns the NodeIPAMs the controller wrote (and those
	// being deleted, which still are records); ok is false when the controller
	// keeps no records (Delivery off).
	RecordsToRestore(ctx context.Context) (records []nodeipamv1.NodeIPAM, ok bool, err error)
	// RetiredChanged says that node's retired blocks changed in the memory: its
	// record is to be written again.
	RetiredChanged(node string)
	// Idle tells whether every record write queued so far went through.
	Idle() bool
	// PoolExists tells whether the pool of kind and name exists with uid.
	PoolExists(ctx context.Context, kind, name string, uid types.UID) bool
}

// goneBlocks returns the blocks the records list of pools that no longer exist
// (deleted, or created again under their name, while no controller ran), by
// node: they are grants of their nodes from the first plan on, before a write
// of the record lists them as retired.
func goneBlocks(ctx context.Context, rs Records, recs []nodeipamv1.NodeIPAM) map[string][]nodeipamv1.NodeBlock {
	type ref struct {
		kind, name string
		uid        types.UID
	}
	exists := map[ref]bool{}
	out := map[string][]nodeipamv1.NodeBlock{}
	for i := range recs {
		if !nodeipamv1.OwnedByController(&recs[i]) {
			continue
		}
		for _, b := range recs[i].Spec.Blocks {
			k := ref{b.Kind, b.Pool, b.PoolUID}
			ok, known := exists[k]
			if !known {
				ok = rs.PoolExists(ctx, b.Kind, b.Pool, b.PoolUID)
				exists[k] = ok
			}
			if !ok {
				out[recs[i].Name] = append(out[recs[i].Name], b)
			}
		}
	}
	return out
}

// retiredChanged tells the records that node's retired blocks changed; with mu
// held (RetiredChanged only queues).
func (m *Memory) retiredChanged(node string) {
	if m.Records != nil {
		m.Records.RetiredChanged(node)
	}
}

// restoreRecords adds the retired blocks the records list to the grants and the
// reservations (one the memory has already stays), before the first plan: the
// records are written before the status stops listing a block, and are kept
// whole per node, where the Lease may have lost them (too large, deleted). A
// record someone other than the controller wrote is not read: its node's report
// is kept from every other node until the record is written again (see
// Delivery.UntrustedNodes). With mu held.
func (m *Memory) restoreRecords(recs []nodeipamv1.NodeIPAM, now time.Time) int {
	n := 0
	for i := range recs {
		rec := &recs[i]
		if !nodeipamv1.OwnedByController(rec) {
			continue
		}
		for _, rb := range rec.Spec.Retired {
			r, err := iprange.ParseRange(rb.Range)
			if err != nil {
				continue
			}
			key := v1alpha1.PoolKey(rb.Kind, rb.Pool)
			if m.addGrant(key, rec.Name, grant{Range: r, Since: rb.Since.Time, UID: rb.PoolUID}) {
				n++
			}
			if rb.ReservedUntil == nil || !now.Before(rb.ReservedUntil.Time) {
				continue
			}
			resKey := rec.Namespace + "/" + key
			kept, had := m.reserved[resKey]
			if had && kept.UID != rb.PoolUID {
				continue // another pool of the name: it keeps its own
			}
			kr := keptRange{Node: rec.Name, Range: r.String(), Until: rb.ReservedUntil.UTC()}
			if !slices.ContainsFunc(kept.Ranges, func(x keptRange) bool { return x.Node == kr.Node && x.Range == kr.Range }) {
				kept.UID = rb.PoolUID
				kept.Ranges = append(kept.Ranges, kr)
				m.reserved[resKey] = kept
				m.version++
			}
		}
		if _, known := m.reports[rec.Name]; rec.Spec.DaemonReports && !known {
			m.reports[rec.Name] = recordedReport(rec, now)
		}
	}
	return n
}

// recordedReport is what a record says of its node's daemon, whose report the
// controller has seen before (NodeIPAMSpec.DaemonReports), as a report kept from
// before this process: it holds addresses in the node's blocks and in the
// retired blocks marked held. It stands in for the report the Node no longer
// shows (registered again while its daemon is down) until the daemon reports
// again, or the Node is gone for the grace period (see lastReports).
func recordedReport(rec *nodeipamv1.NodeIPAM, now time.Time) seenReport {
	parsed := map[string]parsedHold{}
	for _, b := range rec.Spec.Blocks {
		if r, err := b.Range(); err == nil {
			key := v1alpha1.PoolKey(b.Kind, b.Pool)
			h := parsed[key]
			h.block = r
			parsed[key] = h
		}
	}
	for _, rb := range rec.Spec.Retired {
		if r, err := iprange.ParseRange(rb.Range); err == nil && rb.Held {
			key := v1alpha1.PoolKey(rb.Kind, rb.Pool)
			h := parsed[key]
			h.held = append(h.held, r)
			parsed[key] = h
		}
	}
	return seenReport{parsed: parsed, seen: now, kept: true}
}

func (m *Memory) isRecordsOnly() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recordsOnly
}

// moveOut writes, once, in the Lease of a controller before records that what
// it kept is in the records now (MovedToRecords), as soon as every record
// write queued since the memory read it went through: a controller of that
// earlier version started later (a rollback) finds no grants there that are
// no longer true, and takes the reports the Nodes show at its start instead.
// The Lease is not written otherwise; its parts are left as they are (the
// controller may not delete Leases), and a Lease that says its content moved
// names none.
func (m *Memory) moveOut(ctx context.Context) error {
	m.mu.Lock()
	due := m.leaseHad && !m.moved
	m.mu.Unlock()
	if !due || !m.Records.Idle() {
		return nil
	}
	value, err := encodePayload(memoryPayload{Reports: map[string]string{}, MovedToRecords: true})
	if err != nil {
		return err
	}
	if err := m.write(ctx, value); err != nil {
		return err
	}
	m.mu.Lock()
	m.moved = true
	m.mu.Unlock()
	m.Log.Info("the held reports, grants and reservations the Lease kept are in the nodes' records (NodeIPAMs) now; "+
		"the Lease keeps nothing more", "lease", m.Lease.String())
	return nil
}

// reportsChanged tells the records that node's report came, changed or went,
// if it is something a record says (DaemonReports, and which retired blocks
// are held); with mu held.
func (m *Memory) reportsChanged(node string, first bool) {
	if !m.recordsOnly {
		return
	}
	if first {
		m.retiredChanged(node)
		return
	}
	for _, byNode := range m.given {
		if len(byNode[node]) > 0 {
			m.retiredChanged(node)
			return
		}
	}
}

// retiredOf returns the retired blocks of node, for its record in namespace:
// its grants, each reserved until its reservation ends (see keepReservations),
// and held if its daemon's report (as the memory has it) holds addresses in it;
// reports tells whether the memory has a report of the node at all (see
// NodeIPAMSpec.DaemonReports). ok is false before the memory was loaded: the
// record keeps what it says.
func (m *Memory) retiredOf(namespace, node string) (out []nodeipamv1.RetiredBlock, reports, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		return nil, false, false
	}
	rep, reports := m.reports[node]
	for key, byNode := range m.given {
		gs := byNode[node]
		if len(gs) == 0 {
			continue
		}
		kind, name := v1alpha1.SplitPoolKey(key)
		res := m.reserved[namespace+"/"+key]
		cur, hasCur := m.status[key].block(node)
		for _, g := range gs {
			if hasCur && cur == g.Range {
				continue // its current block (a grant adopted from its report)
			}
			rb := nodeipamv1.RetiredBlock{Kind: kind, Pool: name, PoolUID: g.UID, Range: g.Range.String(),
				Since: metav1.NewTime(g.Since.UTC().Truncate(time.Second))}
			if rb.PoolUID == "" && m.pools[key].UID != "" {
				rb.PoolUID = m.pools[key].UID
			}
			for _, kr := range res.Ranges {
				if kr.Node == node && kr.Range == rb.Range && (g.UID == "" || res.UID == g.UID) {
					rb.ReservedUntil = new(metav1.NewTime(ceilSecond(kr.Until)))
				}
			}
			rb.Held = reports && rep.holdsIn(key, g.Range)
			out = append(out, rb)
		}
	}
	sortRetired(out)
	return out, reports, true
}

func sortRetired(rs []nodeipamv1.RetiredBlock) {
	slices.SortFunc(rs, func(a, b nodeipamv1.RetiredBlock) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Range, b.Range),
			cmp.Compare(a.PoolUID, b.PoolUID))
	})
}

// mergeRetired returns want, each entry reserved at least as long as the record
// (cur) says: a reservation that ended in the memory needs no write to say so.
func mergeRetired(want, cur []nodeipamv1.RetiredBlock) []nodeipamv1.RetiredBlock {
	for i := range want {
		w := &want[i]
		for _, c := range cur {
			if c.Kind == w.Kind && c.Pool == w.Pool && c.Range == w.Range && c.PoolUID == w.PoolUID && c.ReservedUntil != nil &&
				(w.ReservedUntil == nil || w.ReservedUntil.Before(c.ReservedUntil)) {
				w.ReservedUntil = c.ReservedUntil.DeepCopy()
			}
			if c.Kind == w.Kind && c.Pool == w.Pool && c.Range == w.Range && c.PoolUID == w.PoolUID && c.Since.Before(&w.Since) {
				w.Since = c.Since
			}
		}
	}
	return want
}

// retiredEqual compares two records' retired blocks.
func retiredEqual(a, b []nodeipamv1.RetiredBlock) bool {
	return slices.EqualFunc(a, b, func(x, y nodeipamv1.RetiredBlock) bool {
		return x.Kind == y.Kind && x.Pool == y.Pool && x.PoolUID == y.PoolUID && x.Range == y.Range &&
			x.Since.Equal(&y.Since) && x.ReservedUntil.Equal(y.ReservedUntil) && x.Held == y.Held
	})
}

// retireRecorded makes grants of node's recorded blocks that its record is
// about to stop listing (dropped), whatever took them (a plan, a pool deleted
// before this process reconciled it): a block leaves a record's blocks only to
// be listed as retired in the same write. It tells whether the memory is loaded:
// if not, nothing may be dropped.
func (m *Memory) retireRecorded(node string, dropped []nodeipamv1.NodeBlock) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		return false
	}
	m.init()
	now := m.now
	if now.IsZero() {
		now = time.Now()
	}
	for _, b := range dropped {
		r, err := b.Range()
		if err != nil {
			continue
		}
		m.addGrant(v1alpha1.PoolKey(b.Kind, b.Pool), node, grant{Range: r, Since: now, UID: b.PoolUID})
	}
	return true
}

// ceilSecond is t rounded up to a whole second, as a record keeps times: a
// reservation is never shortened by it, and one read back keeps its value.
func ceilSecond(t time.Time) time.Time {
	t = t.UTC()
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

// trustsOnlyGrants reports whether a report counts only within its node's
// grants, its records' blocks: the records are the memory and no report is
// adopted (see load). Only then may joining nodes get blocks from a pool's
// index between its plans (see joins.go).
func (m *Memory) trustsOnlyGrants() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recordsOnly && !m.trustFirst
}
