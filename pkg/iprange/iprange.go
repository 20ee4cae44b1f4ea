// Package iprange is address arithmetic over net/netip for IPv4 and IPv6 alike:
// 128-bit offsets, inclusive ranges, and the usable part of a subnet. It does no I/O
// and imports only the standard library.
package iprange

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
)

// U128 is an unsigned 128-bit integer: an IPv6 address, or an offset between two
// addresses of one family.
type U128 struct{ Hi, Lo uint64 }

// U64 widens n.
func U64(n uint64) U128 { return U128{Lo: n} }

// Add returns u+v and whether it overflowed.
func (u U128) Add(v U128) (U128, bool) {
	lo, c := bits.Add64(u.Lo, v.Lo, 0)
	hi, c2 := bits.Add64(u.Hi, v.Hi, c)
	return U128{hi, lo}, c2 != 0
}

// Sub returns u-v and whether it underflowed.
func (u U128) Sub(v U128) (U128, bool) {
	lo, b := bits.Sub64(u.Lo, v.Lo, 0)
	hi, b2 := bits.Sub64(u.Hi, v.Hi, b)
	return U128{hi, lo}, b2 != 0
}

// Mul64 returns u*n and whether it overflowed.
func (u U128) Mul64(n uint64) (U128, bool) {
	hiLo, lo := bits.Mul64(u.Lo, n)
	hiHi, hi := bits.Mul64(u.Hi, n)
	hi, c := bits.Add64(hi, hiLo, 0)
	return U128{hi, lo}, hiHi != 0 || c != 0
}

// Div64 returns u/n and u%n; n must not be 0.
func (u U128) Div64(n uint64) (U128, uint64) {
	qHi := u.Hi / n
	qLo, r := bits.Div64(u.Hi%n, u.Lo, n)
	return U128{qHi, qLo}, r
}

// Cmp compares u and v: -1, 0 or +1.
func (u U128) Cmp(v U128) int {
	switch {
	case u.Hi < v.Hi:
		return -1
	case u.Hi > v.Hi:
		return 1
	case u.Lo < v.Lo:
		return -1
	case u.Lo > v.Lo:
		return 1
	}
	return 0
}

// IsUint64 reports whether u fits in a uint64.
func (u U128) IsUint64() bool { return u.Hi == 0 }

// Pow2 returns 2^n for n < 128.
func Pow2(n int) U128 {
	if n >= 64 {
		return U128{Hi: 1 << (n - 64)}
	}
	return U128{Lo: 1 << n}
}

// String prints u in decimal.
func (u U128) String() string {
	if u.Hi == 0 {
		return fmt.Sprint(u.Lo)
	}
	// Split into a high and a low decimal part: 10^19 fits in a uint64.
	const tenPow19 = 10_000_000_000_000_000_000
	q, r := u.Div64(tenPow19)
	return fmt.Sprintf("%s%019d", q.String(), r)
}

// ToU128 returns the address as a number (an IPv4 address fits in the low 32 bits).
func ToU128(a netip.Addr) U128 {
	if a.Is4() {
		b := a.As4()
		return U128{Lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var hi, lo uint64
	for i := range 8 {
		hi = hi<<8 | uint64(b[i])
		lo = lo<<8 | uint64(b[8+i])
	}
	return U128{hi, lo}
}

// FromU128 turns a number back into an address of the family of like; ok is false
// when the number does not fit the family.
func FromU128(u U128, like netip.Addr) (netip.Addr, bool) {
	if like.Is4() {
		if u.Hi != 0 || u.Lo > 0xffffffff {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4([4]byte{byte(u.Lo >> 24), byte(u.Lo >> 16), byte(u.Lo >> 8), byte(u.Lo)}), true
	}
	var b [16]byte
	for i := range 8 {
		b[7-i] = byte(u.Hi >> (8 * i))
		b[15-i] = byte(u.Lo >> (8 * i))
	}
	return netip.AddrFrom16(b), true
}

// Add returns a+off, and false when that leaves the address family.
func Add(a netip.Addr, off U128) (netip.Addr, bool) {
	s, overflow := ToU128(a).Add(off)
	if overflow {
		return netip.Addr{}, false
	}
	return FromU128(s, a)
}

// Distance returns b-a for a <= b of one family.
func Distance(a, b netip.Addr) U128 {
	d, _ := ToU128(b).Sub(ToU128(a))
	return d
}

// Range is an inclusive range of addresses of one family, Start <= End.
type Range struct {
	Start, End netip.Addr
}

// NewRange checks and builds a range.
func NewRange(start, end netip.Addr) (Range, error) {
	if !start.IsValid() || !end.IsValid() {
		return Range{}, fmt.Errorf("range %s-%s: invalid address", start, end)
	}
	if start.Is4() != end.Is4() {
		return Range{}, fmt.Errorf("range %s-%s: addresses of different families", start, end)
	}
	if end.Less(start) {
		return Range{}, fmt.Errorf("range %s-%s: end is before start", start, end)
	}
	return Range{Start: start, End: end}, nil
}

// Contains reports whether a is in the range.
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() == r.Start.Is4() && r.Start.Compare(a) <= 0 && a.Compare(r.End) <= 0
}

// Overlaps reports whether r and o share an address.
func (r Range) Overlaps(o Range) bool {
	return r.Start.Is4() == o.Start.Is4() && r.Start.Compare(o.End) <= 0 && o.Start.Compare(r.End) <= 0
}

// OverlapsAny says whether r overlaps any of rs.
func OverlapsAny(r Range, rs []Range) bool {
	for _, o := range rs {
		if r.Overlaps(o) {
			return true
		}
	}
	return false
}

// Covers reports whether every address of o is in r.
func (r Range) Covers(o Range) bool {
	return r.Contains(o.Start) && r.Contains(o.End)
}

// Size is the number of addresses in the range.
func (r Range) Size() U128 {
	s, _ := Distance(r.Start, r.End).Add(U64(1))
	return s
}

// String is "start-end".
func (r Range) String() string { return r.Start.String() + "-" + r.End.String() }

// ParseRange parses "start-end" (the form String gives) or a single address.
func ParseRange(s string) (Range, error) {
	startS, endS, found := strings.Cut(s, "-")
	if !found {
		endS = startS
	}
	start, err1 := netip.ParseAddr(strings.TrimSpace(startS))
	end, err2 := netip.ParseAddr(strings.TrimSpace(endS))
	if err1 != nil || err2 != nil {
		return Range{}, fmt.Errorf("range %q: want start-end, two addresses", s)
	}
	return NewRange(start.Unmap(), end.Unmap())
}

// Merge sorts ranges and joins overlapping or adjacent ones of the same family. It
// reorders rs in place.
func Merge(rs []Range) []Range {
	slices.SortFunc(rs, func(a, b Range) int {
		if a.Start.Is4() != b.Start.Is4() {
			if a.Start.Is4() {
				return -1
			}
			return 1
		}
		return a.Start.Compare(b.Start)
	})
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && out[n-1].Start.Is4() == r.Start.Is4() {
			last := &out[n-1]
			if next := last.End.Next(); r.Start.Compare(last.End) <= 0 || (next.IsValid() && next == r.Start) {
				if last.End.Less(r.End) {
					last.End = r.End
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// MergeAddrs turns addresses into the fewest ranges that hold exactly them.
func MergeAddrs(as []netip.Addr) []Range {
	rs := make([]Range, 0, len(as))
	for _, a := range as {
		rs = append(rs, Range{Start: a, End: a})
	}
	return Merge(rs)
}

// PrefixRange is every address of p, network and broadcast included.
func PrefixRange(p netip.Prefix) Range {
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	last := ToU128(p.Addr())
	if hostBits > 0 {
		mask, _ := Pow2(hostBits).Sub(U64(1))
		last, _ = last.Add(mask)
	}
	end, _ := FromU128(last, p.Addr())
	return Range{Start: p.Addr(), End: end}
}

// Usable is the part of p that may be handed out: the network address is skipped,
// and for IPv4 the broadcast address too, except on point-to-point sized prefixes
// (IPv4 /31 and /32, RFC 3021; IPv6 /127 and /128, RFC 6164) where every address
// is usable.
func Usable(p netip.Prefix) Range {
	r := PrefixRange(p)
	hostBits := p.Addr().BitLen() - p.Bits()
	if hostBits <= 1 {
		return r
	}
	r.Start = r.Start.Next()
	if p.Addr().Is4() {
		r.End = r.End.Prev()
	}
	return r
}

// Lsh returns u << n, dropping bits shifted past 128.
func (u U128) Lsh(n uint) U128 {
	switch {
	case n == 0:
		return u
	case n >= 128:
		return U128{}
	case n >= 64:
		return U128{Hi: u.Lo << (n - 64)}
	}
	return U128{Hi: u.Hi<<n | u.Lo>>(64-n), Lo: u.Lo << n}
}

// Rsh returns u >> n.
func (u U128) Rsh(n uint) U128 {
	switch {
	case n == 0:
		return u
	case n >= 128:
		return U128{}
	case n >= 64:
		return U128{Lo: u.Hi >> (n - 64)}
	}
	return U128{Hi: u.Hi >> n, Lo: u.Lo>>n | u.Hi<<(64-n)}
}
