package allocator

import (
	"math/bits"

	"github.com/hwipam/hwipam/pkg/iprange"
)

// usedSet records which offsets of a block are taken (held or blocked).
type usedSet interface {
	isSet(off iprange.U128) bool
	set(off iprange.U128)
	clear(off iprange.U128)
	// findFree returns the lowest free offset >= from.
	findFree(from iprange.U128) (iprange.U128, bool)
}

// bitmap is a two-level bitmap: words holds a bit per offset, full a bit per word
// that has no free bit left, so a search skips 4096 taken offsets per summary word.
type bitmap struct {
	n     uint64
	words []uint64
	full  []uint64
}

func newBitmap(n uint64) *bitmap {
	w := (n + 63) / 64
	bm := &bitmap{n: n, words: make([]uint64, w), full: make([]uint64, (w+63)/64)}
	// Bits past n in the last word are permanently taken.
	if rem := n % 64; rem != 0 {
		bm.words[w-1] = ^uint64(0) << rem
		bm.updateFull(w - 1)
	}
	return bm
}

func (bm *bitmap) updateFull(w uint64) {
	if bm.words[w] == ^uint64(0) {
		bm.full[w/64] |= 1 << (w % 64)
	} else {
		bm.full[w/64] &^= 1 << (w % 64)
	}
}

func (bm *bitmap) isSet(off iprange.U128) bool {
	o := off.Lo
	return bm.words[o/64]&(1<<(o%64)) != 0
}

func (bm *bitmap) set(off iprange.U128) {
	o := off.Lo
	bm.words[o/64] |= 1 << (o % 64)
	bm.updateFull(o / 64)
}

func (bm *bitmap) clear(off iprange.U128) {
	o := off.Lo
	bm.words[o/64] &^= 1 << (o % 64)
	bm.updateFull(o / 64)
}

func (bm *bitmap) findFree(from iprange.U128) (iprange.U128, bool) {
	if !from.IsUint64() || from.Lo >= bm.n {
		return iprange.U128{}, false
	}
	w := from.Lo / 64
	// The rest of the first word.
	if free := ^bm.words[w] &^ (1<<(from.Lo%64) - 1); free != 0 {
		return iprange.U64(w*64 + uint64(bits.TrailingZeros64(free))), true
	}
	// Then whole words, found through the summary.
	w++
	for s := w / 64; s < uint64(len(bm.full)); s++ {
		notFull := ^bm.full[s]
		if s == w/64 {
			notFull &^= 1<<(w%64) - 1
		}
		if notFull == 0 {
			continue
		}
		word := s*64 + uint64(bits.TrailingZeros64(notFull))
		if word >= uint64(len(bm.words)) {
			return iprange.U128{}, false
		}
		return iprange.U64(word*64 + uint64(bits.TrailingZeros64(^bm.words[word]))), true
	}
	return iprange.U128{}, false
}

// sparse is the used set of a block too large for a bitmap: a set of held offsets,
// searched by probing forward and jumping over blocked spans. Blocks this large
// are never dense, so a probe almost always succeeds at once.
type sparse struct {
	held    map[iprange.U128]struct{}
	blocked []span
	size    iprange.U128
}

func (s *sparse) isSet(off iprange.U128) bool {
	if _, ok := s.held[off]; ok {
		return true
	}
	_, ok := blockedAt(s.blocked, off)
	return ok
}

func (s *sparse) set(off iprange.U128)   { s.held[off] = struct{}{} }
func (s *sparse) clear(off iprange.U128) { delete(s.held, off) }

func (s *sparse) findFree(from iprange.U128) (iprange.U128, bool) {
	off := from
	for off.Cmp(s.size) < 0 {
		if sp, ok := blockedAt(s.blocked, off); ok {
			next, overflow := sp.hi.Add(iprange.U64(1))
			if overflow {
				return iprange.U128{}, false
			}
			off = next
			continue
		}
		if _, ok := s.held[off]; !ok {
			return off, true
		}
		off, _ = off.Add(iprange.U64(1))
	}
	return iprange.U128{}, false
}
