package harness

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// Rand returns the generator of a randomised test, seeded with HWIPAM_SEED when
// set (to replay a failure) or else a fresh seed; the seed is logged either way.
func Rand(tb testing.TB) *rand.Rand {
	tb.Helper()
	s := rand.Uint64()
	if v := os.Getenv("HWIPAM_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			tb.Fatalf("HWIPAM_SEED=%q: %v", v, err)
		}
	}
	tb.Logf("seed %d (replay with HWIPAM_SEED=%d)", s, s)
	return rand.New(rand.NewPCG(s, s))
}
