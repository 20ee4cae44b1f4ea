package iprange_test

import (
	"math/big"
	"net/netip"
	"testing"

	"github.com/hwipam/hwipam/pkg/iprange"
)

func TestUsable(t *testing.T) {
	for _, tc := range []struct {
		prefix, start, end, size string
	}{
		{"10.0.0.0/24", "10.0.0.1", "10.0.0.254", "254"},
		{"10.0.0.0/30", "10.0.0.1", "10.0.0.2", "2"},
		{"10.0.0.0/31", "10.0.0.0", "10.0.0.1", "2"},
		{"10.0.0.7/32", "10.0.0.7", "10.0.0.7", "1"},
		{"0.0.0.0/0", "0.0.0.1", "255.255.255.254", "4294967294"},
		{"fd00::/64", "fd00::1", "fd00::ffff:ffff:ffff:ffff", "18446744073709551615"},
		{"fd00::/127", "fd00::", "fd00::1", "2"},
		{"fd00::5/128", "fd00::5", "fd00::5", "1"},
		{"::/0", "::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "340282366920938463463374607431768211455"},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			r := iprange.Usable(netip.MustParsePrefix(tc.prefix))
			if r.Start.String() != tc.start || r.End.String() != tc.end || r.Size().String() != tc.size {
				t.Errorf("Usable(%s) = %s size %s, want %s-%s size %s", tc.prefix, r, r.Size(), tc.start, tc.end, tc.size)
			}
		})
	}
}

func TestArithmetic(t *testing.T) {
	a := netip.MustParseAddr("fd00::ffff:ffff:ffff:ffff")
	got, ok := iprange.Add(a, iprange.U64(1))
	if !ok || got != netip.MustParseAddr("fd00::1:0:0:0:0") {
		t.Errorf("carry into the high word: %s + 1 = %s, %v", a, got, ok)
	}
	if _, ok := iprange.Add(netip.MustParseAddr("255.255.255.255"), iprange.U64(1)); ok {
		t.Error("255.255.255.255 + 1 did not report leaving IPv4")
	}
	if _, ok := iprange.Add(netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), iprange.U64(1)); ok {
		t.Error("all-ones IPv6 + 1 did not report overflow")
	}
	d := iprange.Distance(netip.MustParseAddr("fd00::"), netip.MustParseAddr("fd00::1:0:0:0:5"))
	if d.String() != "18446744073709551621" {
		t.Errorf("distance across 2^64 = %s", d)
	}
	q, r := d.Div64(10)
	if q.String() != "1844674407370955162" || r != 1 {
		t.Errorf("Div64: %s rem %d", q, r)
	}
	if p, overflow := iprange.Pow2(127).Mul64(2); !overflow || !p.IsUint64() {
		t.Errorf("2^127 * 2 should overflow to 0, got %s overflow=%v", p, overflow)
	}
	if iprange.U64(3).Lsh(64).Rsh(63).String() != "6" {
		t.Errorf("shift round trip: %s", iprange.U64(3).Lsh(64).Rsh(63))
	}
}

func TestRangeRelations(t *testing.T) {
	r := func(s, e string) iprange.Range {
		x, err := iprange.NewRange(netip.MustParseAddr(s), netip.MustParseAddr(e))
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	a, b, c := r("10.0.0.1", "10.0.0.10"), r("10.0.0.10", "10.0.0.20"), r("10.0.0.11", "10.0.0.12")
	if !a.Overlaps(b) || a.Overlaps(c) || !b.Covers(c) || c.Covers(b) {
		t.Errorf("overlap/cover relations wrong for %s %s %s", a, b, c)
	}
	if a.Overlaps(r("::1", "::ffff")) {
		t.Error("ranges of different families overlap")
	}
	if _, err := iprange.NewRange(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1")); err == nil {
		t.Error("NewRange accepted end before start")
	}
	if _, err := iprange.NewRange(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("::1")); err == nil {
		t.Error("NewRange accepted mixed families")
	}
}

// FuzzArithmetic checks the 128-bit helpers against math/big.
func FuzzArithmetic(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint64(1), uint64(3), uint(5))
	f.Add(^uint64(0), ^uint64(0), ^uint64(0), uint64(7), uint(64))
	f.Add(uint64(1), uint64(0), uint64(1<<63), uint64(1<<40), uint(127))
	f.Fuzz(func(t *testing.T, hi, lo, n, d uint64, shift uint) {
		u := iprange.U128{Hi: hi, Lo: lo}
		ub := new(big.Int).Or(new(big.Int).Lsh(new(big.Int).SetUint64(hi), 64), new(big.Int).SetUint64(lo))
		limit := new(big.Int).Lsh(big.NewInt(1), 128)
		check := func(op string, got iprange.U128, gotOverflow bool, want *big.Int) {
			t.Helper()
			overflow := want.Sign() < 0 || want.Cmp(limit) >= 0
			want = new(big.Int).Mod(want, limit)
			if got.String() != want.String() || gotOverflow != overflow {
				t.Fatalf("%s on %s: got %s overflow=%v, want %s overflow=%v", op, ub, got, gotOverflow, want, overflow)
			}
		}
		nb := new(big.Int).SetUint64(n)
		sum, o := u.Add(iprange.U64(n))
		check("Add", sum, o, new(big.Int).Add(ub, nb))
		diff, o := u.Sub(iprange.U64(n))
		check("Sub", diff, o, new(big.Int).Sub(ub, nb))
		prod, o := u.Mul64(n)
		check("Mul64", prod, o, new(big.Int).Mul(ub, nb))
		if d != 0 {
			q, r := u.Div64(d)
			wq, wr := new(big.Int).QuoRem(ub, new(big.Int).SetUint64(d), new(big.Int))
			if q.String() != wq.String() || r != wr.Uint64() {
				t.Fatalf("Div64 %s / %d = %s r %d, want %s r %s", ub, d, q, r, wq, wr)
			}
		}
		s := shift % 130
		check("Lsh", u.Lsh(s), false, new(big.Int).Mod(new(big.Int).Lsh(ub, s), limit))
		check("Rsh", u.Rsh(s), false, new(big.Int).Rsh(ub, s))
		// Addresses round-trip through numbers.
		a, ok := iprange.FromU128(u, netip.IPv6Unspecified())
		if !ok || iprange.ToU128(a) != u {
			t.Fatalf("address round trip of %s: %s %v", ub, a, ok)
		}
	})
}
