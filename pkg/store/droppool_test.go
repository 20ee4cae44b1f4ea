package store_test

import (
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"testing"

	"github.com/hwipam/hwipam/pkg/store"
)

func loadedKeys(t *testing.T, s *store.Store) []string {
	t.Helper()
	pools, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range pools {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// DropPool forgets an empty pool's record and allocations bucket, refuses a
// pool that holds an allocation, and a cursor update still in the log when
// the pool is dropped does not bring the record back, after a reopen either.
func TestDropPool(t *testing.T) {
	s, path := openStore(t)
	for _, k := range []string{"gone", "held", "cidrpool/gone"} {
		if err := s.SavePool(k, json.RawMessage(`{"block":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// An allocation and its release, both in the log (with a cursor), not yet
	// in the bbolt file.
	if err := s.Commit([]store.Put{{PoolKey: "gone", Allocation: alloc("c1", "net1", "10.0.0.1"), LastReserved: "10.0.0.1"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(nil, []store.Key{{PoolKey: "gone", ContainerID: "c1", IfName: "net1"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit([]store.Put{{PoolKey: "held", Allocation: alloc("c2", "net1", "10.0.1.1"), LastReserved: "10.0.1.1"}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gone", "cidrpool/gone"} {
		if err := s.DropPool(k); err != nil {
			t.Fatalf("dropping empty pool %s: %v", k, err)
		}
	}
	if err := s.DropPool("held"); !errors.Is(err, store.ErrPoolInUse) {
		t.Errorf("dropping a pool that holds an allocation: %v, want ErrPoolInUse", err)
	}
	if err := s.DropPool("never-there"); err != nil {
		t.Errorf("dropping a pool the store never had: %v", err)
	}
	if got, want := loadedKeys(t, s), []string{"held"}; !slices.Equal(got, want) {
		t.Errorf("pools after DropPool = %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	pools, err := again.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 1 || pools["held"] == nil || len(pools["held"].Allocations) != 1 || pools["held"].Pool.LastReserved != "10.0.1.1" {
		t.Errorf("after reopening: %+v, want pool held with its allocation and cursor only", pools)
	}
	snap, err := store.Snapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := snap["gone"]; ok || len(snap) != 1 {
		t.Errorf("a snapshot of the store (ipamctl --store-file) lists %d pools, gone among them: %v", len(snap), ok)
	}
}
