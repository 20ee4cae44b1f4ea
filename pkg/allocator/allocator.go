// Package allocator is the node-side allocation math: which address of a node's
// block (an IPPool block or a CIDRPool prefix) to hand out next. It is pure — no
// I/O, no Kubernetes, standard library only — and keeps no history: the durable
// store replays its records into a Block with Reserve on start.
//
// Layout of a block:
//
//	Range.Start                                              Range.End
//	|<------------------------- size addresses ------------------->|
//	 offset 0  1  2  ...                                   size-1
//	          ^gateway  [excl]    [index excl]      ^cursor (last handed out)
//
// Addresses are found by offset from Range.Start. The gateway, the exclusions and
// the per-node index exclusions are merged once into sorted "blocked" ranges. A
// block of up to 2^24 addresses keeps a two-level bitmap (a word per 64 addresses
// and a summary bit per full word); a larger one (IPv6) keeps a set of offsets and
// probes forward from the cursor, skipping blocked ranges by binary search. Either
// way the cost of an allocation does not grow with the number of addresses held.
package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/hwipam/hwipam/pkg/iprange"
)

// Errors callers branch on; each is wrapped with the address or pool detail.
var (
	// ErrExhausted: no free address is left in the block.
	ErrExhausted = errors.New("no free address left in the block")
	// ErrInUse: the requested address is held by another allocation.
	ErrInUse = errors.New("address already allocated")
	// ErrOutside: the requested address or index is not in the block.
	ErrOutside = errors.New("address outside the block")
	// ErrExcluded: the requested address is excluded (or is the gateway).
	ErrExcluded = errors.New("address excluded from allocation")
	// ErrNoGateway: the gateway was requested but the pool has none in the block.
	ErrNoGateway = errors.New("the pool has no gateway in this block")
)

// bitmapLimit is the largest block kept as a bitmap (2 MiB of bits).
const bitmapLimit = 1 << 24

// Config describes one pool's block on this node.
type Config struct {
	// Range is every address of the block that may be handed out, before
	// exclusions: an IPPool block's startIP-endIP, or the usable part of a
	// CIDRPool prefix.
	Range iprange.Range
	// Gateway, when valid, is never handed out except by AllocateGateway.
	Gateway netip.Addr
	// Exclusions are absolute address ranges never handed out; parts outside Range
	// are ignored.
	Exclusions []iprange.Range
	// IndexExclusions are inclusive [start, end] offsets from Range.Start never
	// handed out (perNodeExclusions).
	IndexExclusions [][2]uint64
}

// Block hands out the addresses of one pool's block. It is not safe for
// concurrent use; the caller serialises access per pool.
type Block struct {
	start   netip.Addr
	size    iprange.U128
	gateway netip.Addr
	blocked []span // sorted, merged, offsets
	used    usedSet
	cursor  iprange.U128 // offset of the last address handed out; search starts after it
	count   uint64       // addresses held
	// gatewayHeld is set while the gateway itself is handed out (AllocateGateway).
	gatewayHeld bool
	// orphans are reserved addresses outside the current Range or blocked by the
	// current spec (the block changed while allocations were live); they are kept
	// until released.
	orphans map[netip.Addr]struct{}
}

type span struct{ lo, hi iprange.U128 } // inclusive offsets

// New builds an empty block.
func New(cfg Config) (*Block, error) {
	if !cfg.Range.Start.IsValid() || !cfg.Range.End.IsValid() || cfg.Range.End.Less(cfg.Range.Start) ||
		cfg.Range.Start.Is4() != cfg.Range.End.Is4() {
		return nil, fmt.Errorf("invalid block range %s", cfg.Range)
	}
	b := &Block{start: cfg.Range.Start, size: cfg.Range.Size(), gateway: cfg.Gateway, orphans: map[netip.Addr]struct{}{}}
	last, _ := b.size.Sub(iprange.U64(1))
	b.cursor = last // the first search starts at offset 0
	var spans []span
	clip := func(lo, hi iprange.U128) {
		if lo.Cmp(last) > 0 {
			return
		}
		if hi.Cmp(last) > 0 {
			hi = last
		}
		spans = append(spans, span{lo, hi})
	}
	if off, ok := b.offset(cfg.Gateway); ok {
		clip(off, off)
	}
	for _, e := range cfg.Exclusions {
		if !e.Overlaps(cfg.Range) {
			continue
		}
		lo, hi := iprange.U128{}, last
		if cfg.Range.Start.Less(e.Start) {
			lo = iprange.Distance(cfg.Range.Start, e.Start)
		}
		if e.End.Less(cfg.Range.End) {
			hi = iprange.Distance(cfg.Range.Start, e.End)
		}
		clip(lo, hi)
	}
	for _, ix := range cfg.IndexExclusions {
		if ix[1] < ix[0] {
			return nil, fmt.Errorf("index exclusion %d-%d: end before start", ix[0], ix[1])
		}
		clip(iprange.U64(ix[0]), iprange.U64(ix[1]))
	}
	b.blocked = mergeSpans(spans)
	if b.size.IsUint64() && b.size.Lo <= bitmapLimit {
		bm := newBitmap(b.size.Lo)
		for _, s := range b.blocked {
			for o := s.lo.Lo; o <= s.hi.Lo; o++ {
				bm.set(iprange.U64(o))
			}
		}
		b.used = bm
	} else {
		b.used = &sparse{held: map[iprange.U128]struct{}{}, blocked: b.blocked, size: b.size}
	}
	return b, nil
}

// Size is the number of addresses in the range, blocked ones included.
func (b *Block) Size() iprange.U128 { return b.size }

// Orphans is the number of addresses held outside the block or where the current
// spec excludes them (replayed by Reserve), until they are released.
func (b *Block) Orphans() uint64 { return uint64(len(b.orphans)) }

// Allocated is the number of addresses held, orphans and the gateway included.
func (b *Block) Allocated() uint64 {
	n := b.count + uint64(len(b.orphans))
	if b.gatewayHeld {
		n++
	}
	return n
}

// Free is the number of addresses that can still be handed out.
func (b *Block) Free() iprange.U128 {
	f, _ := b.size.Sub(iprange.U64(b.count))
	for _, s := range b.blocked {
		n, _ := s.hi.Sub(s.lo)
		n, _ = n.Add(iprange.U64(1))
		f, _ = f.Sub(n)
	}
	return f
}

// Cursor is the last address handed out, for persisting round-robin position.
func (b *Block) Cursor() netip.Addr {
	a, _ := iprange.Add(b.start, b.cursor)
	return a
}

// SetCursor restores the round-robin position; an address outside the block is
// ignored.
func (b *Block) SetCursor(a netip.Addr) {
	if off, ok := b.offset(a); ok {
		b.cursor = off
	}
}

// AllocateNext hands out the first free address after the cursor, wrapping
// around, so that a released address is not reused at once.
func (b *Block) AllocateNext() (netip.Addr, error) {
	next, _ := b.cursor.Add(iprange.U64(1))
	if next.Cmp(b.size) >= 0 {
		next = iprange.U128{}
	}
	off, ok := b.used.findFree(next)
	if !ok && next.Cmp(iprange.U128{}) != 0 {
		off, ok = b.used.findFree(iprange.U128{})
	}
	if !ok {
		return netip.Addr{}, ErrExhausted
	}
	b.used.set(off)
	b.count++
	b.cursor = off
	a, _ := iprange.Add(b.start, off)
	return a, nil
}

// AllocateStatic hands out a requested address.
func (b *Block) AllocateStatic(a netip.Addr) error {
	off, ok := b.offset(a)
	if !ok {
		return fmt.Errorf("%s: %w %s", a, ErrOutside, b.rangeString())
	}
	if b.isBlocked(off) {
		return fmt.Errorf("%s: %w", a, ErrExcluded)
	}
	if b.used.isSet(off) {
		return fmt.Errorf("%s: %w", a, ErrInUse)
	}
	b.used.set(off)
	b.count++
	return nil
}

// AllocateIndex hands out the address at offset index of the block.
func (b *Block) AllocateIndex(index uint64) (netip.Addr, error) {
	if iprange.U64(index).Cmp(b.size) >= 0 {
		return netip.Addr{}, fmt.Errorf("index %d: %w %s (%s addresses)", index, ErrOutside, b.rangeString(), b.size)
	}
	a, _ := iprange.Add(b.start, iprange.U64(index))
	return a, b.AllocateStatic(a)
}

// AllocateGateway hands out the gateway address itself (allocateDefaultGateway).
func (b *Block) AllocateGateway() (netip.Addr, error) {
	if !b.hasGateway() {
		return netip.Addr{}, ErrNoGateway
	}
	if b.gatewayHeld {
		return netip.Addr{}, fmt.Errorf("gateway %s: %w", b.gateway, ErrInUse)
	}
	b.gatewayHeld = true
	return b.gateway, nil
}

// Reserve marks an address held, as replayed from the store. Addresses outside
// the block or blocked by the current spec are kept as orphans until released,
// so that nothing held is ever handed out twice.
func (b *Block) Reserve(a netip.Addr) error {
	if b.hasGateway() && a == b.gateway {
		if b.gatewayHeld {
			return fmt.Errorf("%s: %w", a, ErrInUse)
		}
		b.gatewayHeld = true
		return nil
	}
	off, ok := b.offset(a)
	if !ok || b.isBlocked(off) {
		if _, dup := b.orphans[a]; dup {
			return fmt.Errorf("%s: %w", a, ErrInUse)
		}
		b.orphans[a] = struct{}{}
		return nil
	}
	if b.used.isSet(off) {
		return fmt.Errorf("%s: %w", a, ErrInUse)
	}
	b.used.set(off)
	b.count++
	return nil
}

// Release frees an address; releasing one that is not held does nothing.
func (b *Block) Release(a netip.Addr) {
	if b.hasGateway() && a == b.gateway {
		b.gatewayHeld = false
		return
	}
	if _, ok := b.orphans[a]; ok {
		delete(b.orphans, a)
		return
	}
	off, ok := b.offset(a)
	if !ok || b.isBlocked(off) || !b.used.isSet(off) {
		return
	}
	b.used.clear(off)
	b.count--
}

// Held reports whether an address is held.
func (b *Block) Held(a netip.Addr) bool {
	if b.hasGateway() && a == b.gateway {
		return b.gatewayHeld
	}
	if _, ok := b.orphans[a]; ok {
		return true
	}
	off, ok := b.offset(a)
	return ok && !b.isBlocked(off) && b.used.isSet(off)
}

func (b *Block) hasGateway() bool {
	_, ok := b.offset(b.gateway)
	return ok
}

func (b *Block) offset(a netip.Addr) (iprange.U128, bool) {
	if !a.IsValid() || a.Is4() != b.start.Is4() || a.Less(b.start) {
		return iprange.U128{}, false
	}
	off := iprange.Distance(b.start, a)
	return off, off.Cmp(b.size) < 0
}

func (b *Block) isBlocked(off iprange.U128) bool {
	_, ok := blockedAt(b.blocked, off)
	return ok
}

func (b *Block) rangeString() string {
	last, _ := b.size.Sub(iprange.U64(1))
	end, _ := iprange.Add(b.start, last)
	return b.start.String() + "-" + end.String()
}

// blockedAt returns the blocked span containing off.
func blockedAt(spans []span, off iprange.U128) (span, bool) {
	i, found := slices.BinarySearchFunc(spans, off, func(s span, o iprange.U128) int {
		switch {
		case s.hi.Cmp(o) < 0:
			return -1
		case s.lo.Cmp(o) > 0:
			return 1
		}
		return 0
	})
	if !found {
		return span{}, false
	}
	return spans[i], true
}

func mergeSpans(spans []span) []span {
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Cmp(b.lo) })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 {
			next, overflow := out[n-1].hi.Add(iprange.U64(1))
			if s.lo.Cmp(next) <= 0 || overflow {
				if s.hi.Cmp(out[n-1].hi) > 0 {
					out[n-1].hi = s.hi
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}
