package allocator_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/hwipam/hwipam/pkg/allocator"
	"github.com/hwipam/hwipam/pkg/iprange"
)

func rng(t testing.TB, s, e string) iprange.Range {
	t.Helper()
	r, err := iprange.NewRange(netip.MustParseAddr(s), netip.MustParseAddr(e))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustNew(t testing.TB, cfg allocator.Config) *allocator.Block {
	t.Helper()
	b, err := allocator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func next(t *testing.T, b *allocator.Block) string {
	t.Helper()
	a, err := b.AllocateNext()
	if err != nil {
		t.Fatalf("AllocateNext: %v", err)
	}
	return a.String()
}

func TestAllocateNextSkipsGatewayAndExclusionsAndRoundRobins(t *testing.T) {
	b := mustNew(t, allocator.Config{
		Range:           rng(t, "10.0.0.1", "10.0.0.10"),
		Gateway:         netip.MustParseAddr("10.0.0.1"),
		Exclusions:      []iprange.Range{rng(t, "10.0.0.4", "10.0.0.5"), rng(t, "9.0.0.0", "10.0.0.2")},
		IndexExclusions: [][2]uint64{{8, 20}}, // 10.0.0.9 and .10; past the end is clipped
	})
	var got []string
	for range 4 {
		got = append(got, next(t, b))
	}
	if fmt.Sprint(got) != "[10.0.0.3 10.0.0.6 10.0.0.7 10.0.0.8]" {
		t.Errorf("allocation order = %v", got)
	}
	if _, err := b.AllocateNext(); !errors.Is(err, allocator.ErrExhausted) {
		t.Errorf("full block: err = %v, want ErrExhausted", err)
	}
	if b.Free().String() != "0" || b.Allocated() != 4 {
		t.Errorf("free %s allocated %d", b.Free(), b.Allocated())
	}
	// A released address is not reused at once: the search continues after the
	// cursor and wraps around.
	b.Release(netip.MustParseAddr("10.0.0.6"))
	b.Release(netip.MustParseAddr("10.0.0.3"))
	if a := next(t, b); a != "10.0.0.3" {
		t.Errorf("after releasing .6 and .3 with the cursor at .8, got %s, want .3 (wrap)", a)
	}
	if a := next(t, b); a != "10.0.0.6" {
		t.Errorf("got %s, want .6", a)
	}
}

func TestStaticIndexAndGateway(t *testing.T) {
	b := mustNew(t, allocator.Config{Range: rng(t, "192.168.1.1", "192.168.1.254"), Gateway: netip.MustParseAddr("192.168.1.1"),
		Exclusions: []iprange.Range{rng(t, "192.168.1.100", "192.168.1.109")}})
	if err := b.AllocateStatic(netip.MustParseAddr("192.168.1.50")); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]error{
		"192.168.1.50":  allocator.ErrInUse,
		"192.168.1.105": allocator.ErrExcluded,
		"192.168.1.1":   allocator.ErrExcluded, // the gateway only through AllocateGateway
		"192.168.2.1":   allocator.ErrOutside,
		"fd00::1":       allocator.ErrOutside,
	} {
		if err := b.AllocateStatic(netip.MustParseAddr(addr)); !errors.Is(err, want) {
			t.Errorf("AllocateStatic(%s) = %v, want %v", addr, err, want)
		}
	}
	a, err := b.AllocateIndex(9)
	if err != nil || a.String() != "192.168.1.10" {
		t.Errorf("AllocateIndex(9) = %s %v", a, err)
	}
	if _, err := b.AllocateIndex(254); !errors.Is(err, allocator.ErrOutside) {
		t.Errorf("AllocateIndex past the end = %v", err)
	}
	gw, err := b.AllocateGateway()
	if err != nil || gw.String() != "192.168.1.1" {
		t.Errorf("AllocateGateway = %s %v", gw, err)
	}
	if _, err := b.AllocateGateway(); !errors.Is(err, allocator.ErrInUse) {
		t.Errorf("second AllocateGateway = %v, want ErrInUse", err)
	}
	b.Release(gw)
	if _, err := b.AllocateGateway(); err != nil {
		t.Errorf("AllocateGateway after release = %v", err)
	}
	nogw := mustNew(t, allocator.Config{Range: rng(t, "10.0.0.1", "10.0.0.2")})
	if _, err := nogw.AllocateGateway(); !errors.Is(err, allocator.ErrNoGateway) {
		t.Errorf("AllocateGateway without a gateway = %v", err)
	}
}

func TestReserveReplaysAndKeepsOrphans(t *testing.T) {
	b := mustNew(t, allocator.Config{Range: rng(t, "10.0.0.1", "10.0.0.4"), Exclusions: []iprange.Range{rng(t, "10.0.0.2", "10.0.0.2")}})
	for _, a := range []string{"10.0.0.1", "10.0.0.2", "10.9.9.9"} { // .2 is now excluded, .9.9.9 outside: orphans
		if err := b.Reserve(netip.MustParseAddr(a)); err != nil {
			t.Fatalf("Reserve(%s): %v", a, err)
		}
	}
	if err := b.Reserve(netip.MustParseAddr("10.0.0.1")); !errors.Is(err, allocator.ErrInUse) {
		t.Errorf("double Reserve = %v, want ErrInUse", err)
	}
	if b.Allocated() != 3 || !b.Held(netip.MustParseAddr("10.9.9.9")) {
		t.Errorf("allocated %d, orphan held %v", b.Allocated(), b.Held(netip.MustParseAddr("10.9.9.9")))
	}
	got := []string{next(t, b), next(t, b)}
	if fmt.Sprint(got) != "[10.0.0.3 10.0.0.4]" {
		t.Errorf("after replay, next = %v", got)
	}
	b.Release(netip.MustParseAddr("10.9.9.9"))
	if b.Held(netip.MustParseAddr("10.9.9.9")) || b.Allocated() != 4 {
		t.Errorf("orphan not released: allocated %d", b.Allocated())
	}
}

func TestCursorPersists(t *testing.T) {
	cfg := allocator.Config{Range: rng(t, "10.0.0.1", "10.0.0.100")}
	b := mustNew(t, cfg)
	for range 5 {
		next(t, b)
	}
	b2 := mustNew(t, cfg)
	b2.SetCursor(b.Cursor())
	if a := next(t, b2); a != "10.0.0.6" {
		t.Errorf("after restoring cursor %s, next = %s", b.Cursor(), a)
	}
}

func TestHugeIPv6Block(t *testing.T) {
	// A /64: far past the bitmap limit; exclusions across the 2^64 boundary of offsets.
	b := mustNew(t, allocator.Config{Range: iprange.Usable(netip.MustParsePrefix("fd00:1:2:3::/64")),
		Gateway: netip.MustParseAddr("fd00:1:2:3::1"), Exclusions: []iprange.Range{rng(t, "fd00:1:2:3::2", "fd00:1:2:3::ff")}})
	if a := next(t, b); a != "fd00:1:2:3::100" {
		t.Errorf("first = %s", a)
	}
	if b.Size().String() != "18446744073709551615" {
		t.Errorf("size = %s", b.Size())
	}
	b.SetCursor(netip.MustParseAddr("fd00:1:2:3:ffff:ffff:ffff:fffe"))
	if a := next(t, b); a != "fd00:1:2:3:ffff:ffff:ffff:ffff" {
		t.Errorf("last = %s", a)
	}
	if a := next(t, b); a != "fd00:1:2:3::101" {
		t.Errorf("wrap = %s", a)
	}
}

// model is the obvious implementation the Block must agree with.
type model struct {
	addrs   []netip.Addr
	blocked map[netip.Addr]bool
	held    map[netip.Addr]bool
	cursor  int
}

func (m *model) next() (netip.Addr, bool) {
	for i := 1; i <= len(m.addrs); i++ {
		j := (m.cursor + i) % len(m.addrs)
		a := m.addrs[j]
		if !m.blocked[a] && !m.held[a] {
			m.held[a] = true
			m.cursor = j
			return a, true
		}
	}
	return netip.Addr{}, false
}

func TestRandomizedAgainstModel(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 99))
		size := 1 + r.IntN(300)
		start := netip.MustParseAddr("10.1.0.0")
		if seed%3 == 0 {
			start = netip.MustParseAddr("fd00::ff00")
		}
		end, _ := iprange.Add(start, iprange.U64(uint64(size-1)))
		cfg := allocator.Config{Range: iprange.Range{Start: start, End: end}}
		m := &model{blocked: map[netip.Addr]bool{}, held: map[netip.Addr]bool{}, cursor: size - 1}
		for a := start; ; a = a.Next() {
			m.addrs = append(m.addrs, a)
			if a == end {
				break
			}
		}
		if r.IntN(2) == 0 {
			cfg.Gateway = m.addrs[r.IntN(size)]
			m.blocked[cfg.Gateway] = true
		}
		for range r.IntN(4) {
			i, j := r.IntN(size), r.IntN(size)
			i, j = min(i, j), max(i, j)
			cfg.Exclusions = append(cfg.Exclusions, iprange.Range{Start: m.addrs[i], End: m.addrs[j]})
			for k := i; k <= j; k++ {
				m.blocked[m.addrs[k]] = true
			}
		}
		if r.IntN(2) == 0 {
			i := uint64(r.IntN(size))
			j := i + uint64(r.IntN(5))
			cfg.IndexExclusions = [][2]uint64{{i, j}}
			for k := i; k <= j && k < uint64(size); k++ {
				m.blocked[m.addrs[k]] = true
			}
		}
		b := mustNew(t, cfg)
		for step := range 600 {
			ctx := fmt.Sprintf("seed %d step %d", seed, step)
			switch op := r.IntN(10); {
			case op < 6:
				want, ok := m.next()
				got, err := b.AllocateNext()
				if ok != (err == nil) || (ok && got != want) {
					t.Fatalf("%s: AllocateNext = %s %v, model %s %v", ctx, got, err, want, ok)
				}
			case op < 9:
				a := m.addrs[r.IntN(size)]
				if m.held[a] {
					delete(m.held, a)
				}
				b.Release(a)
			default:
				a := m.addrs[r.IntN(size)]
				err := b.AllocateStatic(a)
				switch {
				case m.blocked[a]:
					if !errors.Is(err, allocator.ErrExcluded) {
						t.Fatalf("%s: static %s blocked: %v", ctx, a, err)
					}
				case m.held[a]:
					if !errors.Is(err, allocator.ErrInUse) {
						t.Fatalf("%s: static %s held: %v", ctx, a, err)
					}
				default:
					if err != nil {
						t.Fatalf("%s: static %s: %v", ctx, a, err)
					}
					m.held[a] = true
				}
			}
			if b.Allocated() != uint64(len(m.held)) {
				t.Fatalf("%s: allocated %d, model %d", ctx, b.Allocated(), len(m.held))
			}
		}
	}
}

// FuzzBlock feeds random configs and operations; held addresses must stay unique
// and inside the range, and the counts must agree.
func FuzzBlock(f *testing.F) {
	f.Add(uint16(10), uint16(3), uint16(5), uint16(2), []byte{0, 1, 2, 3, 0, 0, 9})
	f.Add(uint16(1), uint16(0), uint16(0), uint16(0), []byte{0, 0})
	f.Add(uint16(4096), uint16(4000), uint16(4095), uint16(7), []byte{0, 0, 0, 1, 1, 1})
	f.Fuzz(func(t *testing.T, size, exLo, exHi, gw uint16, ops []byte) {
		if size == 0 {
			return
		}
		start := netip.MustParseAddr("10.0.0.0")
		end, _ := iprange.Add(start, iprange.U64(uint64(size-1)))
		exS, _ := iprange.Add(start, iprange.U64(uint64(min(exLo, exHi))))
		exE, _ := iprange.Add(start, iprange.U64(uint64(max(exLo, exHi))))
		g, _ := iprange.Add(start, iprange.U64(uint64(gw)))
		b, err := allocator.New(allocator.Config{Range: iprange.Range{Start: start, End: end}, Gateway: g,
			Exclusions: []iprange.Range{{Start: exS, End: exE}}})
		if err != nil {
			t.Fatal(err)
		}
		held := map[netip.Addr]bool{}
		for i, op := range ops {
			if op%4 == 3 && len(held) > 0 {
				for a := range held {
					b.Release(a)
					delete(held, a)
					break
				}
				continue
			}
			a, err := b.AllocateNext()
			if err != nil {
				if !errors.Is(err, allocator.ErrExhausted) {
					t.Fatalf("op %d: %v", i, err)
				}
				continue
			}
			if held[a] || a.Less(start) || end.Less(a) || a == g || (!a.Less(exS) && !exE.Less(a)) {
				t.Fatalf("op %d: handed out %s (held %v, gateway %s, excluded %s-%s)", i, a, held[a], g, exS, exE)
			}
			held[a] = true
		}
		if b.Allocated() != uint64(len(held)) {
			t.Fatalf("allocated %d, held %d", b.Allocated(), len(held))
		}
	})
}

// BenchmarkAllocateNext shows that cost does not grow with fill: a /16 block at
// 0%, 50% and 99%, and a /64.
func BenchmarkAllocateNext(b *testing.B) {
	for _, fill := range []float64{0, 0.5, 0.99} {
		b.Run(fmt.Sprintf("v4-16/fill=%.0f%%", fill*100), func(b *testing.B) {
			blk := mustNew(b, allocator.Config{Range: iprange.Usable(netip.MustParsePrefix("10.0.0.0/16"))})
			n := int(fill * 65534)
			for range n {
				if _, err := blk.AllocateNext(); err != nil {
					b.Fatal(err)
				}
			}
			// Keep the fill level: allocate one, release it, with the cursor moving on.
			b.ResetTimer()
			for range b.N {
				a, err := blk.AllocateNext()
				if err != nil {
					b.Fatal(err)
				}
				blk.Release(a)
			}
		})
	}
	b.Run("v6-64", func(b *testing.B) {
		blk := mustNew(b, allocator.Config{Range: iprange.Usable(netip.MustParsePrefix("fd00::/64"))})
		for range b.N {
			if _, err := blk.AllocateNext(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
