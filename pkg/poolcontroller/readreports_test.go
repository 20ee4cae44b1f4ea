package poolcontroller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/test/harness"
)

// readReports of one pool leaves what a report says of another pool to that
// pool's own reconcile only where it changes nothing of the pool planned: the
// nodes' holds in it, the foreign ranges inside its network and its orphans
// are what counting every report in every pool gives (the model below), and
// every ignored part it names is one the model names, those of the pool
// itself and of the reports that cannot be read all among them. Random pools
// (some overlapping), blocks, grants and reports, in and out of them;
// replayable with HWIPAM_SEED.
func TestReadReportsOfOnePoolAsCountingEveryPool(t *testing.T) {
	rng := harness.Rand(t)
	addr := func(v int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(v >> 8), byte(v)}) }
	span := func(lo, size int) iprange.Range {
		start := lo + rng.IntN(size)
		return iprange.Range{Start: addr(start), End: addr(start + rng.IntN(16))}
	}
	for round := range 300 {
		m := &Memory{}
		m.init()
		keys := []string{"ippool/a", "ippool/b", "ippool/c", "cidrpool/d"}
		networks := map[string]iprange.Range{}
		for i, k := range keys {
			lo := i * 256
			if rng.IntN(4) == 0 {
				lo = rng.IntN(4) * 256 // now and then over another pool's
			}
			networks[k] = iprange.Range{Start: addr(lo), End: addr(lo + 255)}
		}
		nodes := []string{"n0", "n1", "n2", "n3", "n4", "n5"}
		for _, k := range keys {
			if rng.IntN(5) == 0 {
				continue // a pool this process has not reconciled
			}
			given := map[string]iprange.Range{}
			lo := int(networks[k].Start.As4()[2])<<8 | int(networks[k].Start.As4()[3])
			for _, n := range nodes {
				if rng.IntN(3) > 0 {
					given[n] = span(lo, 240)
				}
				if rng.IntN(3) == 0 {
					m.given[k] = cmpOr(m.given[k])
					m.given[k][n] = append(m.given[k][n], grant{Range: span(lo, 240)})
				}
			}
			m.status[k] = statusOfRanges(given)
		}
		for _, n := range nodes {
			switch rng.IntN(6) {
			case 0:
				continue
			case 1:
				m.reports[n] = seenReport{opaque: "cannot be read"}
				continue
			}
			rep := seenReport{parsed: map[string]parsedHold{}}
			for _, k := range append(keys, "ippool/unknown") {
				if rng.IntN(3) == 0 {
					continue
				}
				var h parsedHold
				lo := rng.IntN(1024)
				if g, ok := m.status[k].block(n); ok && rng.IntN(2) == 0 {
					h.block = g
				} else if rng.IntN(2) == 0 {
					h.block = span(lo, 8)
				}
				for range rng.IntN(3) {
					h.held = append(h.held, span(rng.IntN(1024), 8))
				}
				rep.parsed[k] = h
			}
			m.reports[n] = rep
		}
		for _, key := range keys {
			got, gotIgnored := m.readReports(key, networks[key])
			want, wantIgnored := m.countReports(key, networks[key], false)
			ctx := fmt.Sprintf("round %d, pool %s", round, key)
			for _, n := range nodes {
				if g, w := sortedRanges(got.held[n]), sortedRanges(want.held[n]); !slices.Equal(g, w) {
					t.Fatalf("%s: node %s holds %v, counting every pool says %v", ctx, n, g, w)
				}
			}
			if g, w := sortedRanges(got.foreign), sortedRanges(want.foreign); !slices.Equal(g, w) {
				t.Fatalf("%s: foreign %v, counting every pool says %v", ctx, g, w)
			}
			if !slices.Equal(got.orphans, want.orphans) {
				t.Fatalf("%s: orphans %v, counting every pool says %v", ctx, got.orphans, want.orphans)
			}
			for _, ig := range gotIgnored {
				if !slices.Contains(wantIgnored, ig) {
					t.Fatalf("%s: ignored %+v, which counting every pool does not say", ctx, ig)
				}
			}
			for _, ig := range wantIgnored {
				own := strings.Contains(ig.text, fmt.Sprintf("%q", key)) || m.reports[ig.node].opaque != "" ||
					m.status[keyOf(ig.text)].len() == 0
				if own && !slices.Contains(gotIgnored, ig) {
					t.Fatalf("%s: %+v not among the ignored parts (%+v)", ctx, ig, gotIgnored)
				}
			}
		}
	}
}

func cmpOr(m map[string][]grant) map[string][]grant {
	if m == nil {
		return map[string][]grant{}
	}
	return m
}

// keyOf is the pool an ignored part's text names.
func keyOf(text string) string {
	_, rest, ok := strings.Cut(text, "pool \"")
	if !ok {
		return ""
	}
	k, _, _ := strings.Cut(rest, "\"")
	return k
}

func sortedRanges(rs []iprange.Range) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}

// listLayout is a layout of the blocks listed, whatever they are: for tests that
// give nodes any range.
type listLayout []iprange.Range

func (l listLayout) Count() uint64                      { return uint64(len(l)) }
func (l listLayout) Block(i uint64) iprange.Range       { return l[i] }
func (l listLayout) Usable(i uint64) bool               { return i < uint64(len(l)) }
func (l listLayout) NextUsable(i uint64) (uint64, bool) { return i, i < uint64(len(l)) }
func (l listLayout) Range() iprange.Range               { return iprange.Range{} }

// statusOfRanges is the poolStatus that gives each node its range.
func statusOfRanges(given map[string]iprange.Range) poolStatus {
	var l listLayout
	s := poolStatus{index: map[string]uint64{}}
	for n, r := range given {
		s.index[n] = uint64(len(l))
		l = append(l, r)
	}
	s.layout = l
	return s
}
