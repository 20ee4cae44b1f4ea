package nodealloc_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// copyFile copies a store, as a restarted daemon would find it: its log first,
// then the bbolt file (what the checkpointer moves between the two copies is
// in the second; see store.Snapshot).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	for _, suffix := range []string{".wal", ""} {
		data, err := os.ReadFile(from + suffix)
		if suffix != "" && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
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
