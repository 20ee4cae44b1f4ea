package nodealloc_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// managerWith starts a manager over a store that already holds cfg as its last
// known block and the given allocations, as a daemon restarted over an older
// store (or an imported one) does.
func managerWith(t *testing.T, cfg *nodealloc.PoolConfig, puts ...store.Put) *nodealloc.Manager {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	raw, err := nodealloc.MarshalConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SavePool(cfg.Key(), raw); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(puts, nil); err != nil {
		t.Fatal(err)
	}
	m, err := nodealloc.New(st, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
