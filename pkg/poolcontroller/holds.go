package poolcontroller

import (
	"slices"
	"strings"
	"time"

	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/poolcontroller/planner"
)

// reservation is a range retired from a node that stays out of reach of other
// nodes until Until, whatever the node's daemon reports (or when it reports
// nothing, as without RBAC to annotate its Node).
type reservation struct {
	planner.Misfit
	Until time.Time
}

// reports reads the daemons' v1alpha1.HeldAnnotation of every node for one pool.
type reports struct {
	// held: per node, what its daemon may still hold in this pool.
	held map[string][]iprange.Range
	// foreign: what daemons hold in other pools inside this pool's network.
	foreign []iprange.Range
	// orphans: "node: ranges" of addresses held outside the node's current block.
	orphans []string
}

func joinRanges(rs []iprange.Range) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// liveReservations drops the reservations that ended by now and returns the others
// and when the first of them ends (zero if none).
func (st *poolState) liveReservations(now time.Time) ([]reservation, time.Time) {
	st.reserved = slices.DeleteFunc(st.reserved, func(r reservation) bool { return !now.Before(r.Until) })
	var next time.Time
	for _, r := range st.reserved {
		if next.IsZero() || r.Until.Before(next) {
			next = r.Until
		}
	}
	return st.reserved, next
}

// addReservations keeps the ranges retired in a reconcile out of other nodes'
// reach for the grace period, and tells whether it retired any (new, or again
// after a reconcile that failed before its status write).
func (st *poolState) addReservations(retired []planner.Misfit, now time.Time, grace time.Duration) bool {
	if grace <= 0 {
		return false
	}
	found := false
	for _, m := range retired {
		if !m.Range.Start.IsValid() {
			continue
		}
		found = true
		// Retired again after a reconcile that failed before its status write
		// (the Lease could not be written): the first reservation stands.
		if !slices.ContainsFunc(st.reserved, func(r reservation) bool { return r.Misfit == m }) {
			st.reserved = append(st.reserved, reservation{Misfit: m, Until: now.Add(grace)})
		}
	}
	return found
}
