package nicdra

import (
	"context"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/pkg/store"
)

// Ownership of an allocation. The driver's allocations carry the network name
// nic.hwipam.io for people to read, but a network name is what any NAD's author
// chooses, so it decides nothing: the mark store.Allocation.Owner = OwnerDRA
// does. Only the driver sets it (through nodealloc.Metadata.Owner); the CNI
// path never copies it from a request, and refuses the network name
// nic.hwipam.io besides.

// OwnerDRA is store.Allocation.Owner of the driver's allocations.
const OwnerDRA = "dra"

// OwnedByDRA says whether an allocation is the driver's: released by the claim
// garbage collection (when its claim is gone) and by unprepare, never by the
// CNI path's stale-allocation cleaner or CNI GC.
func OwnedByDRA(a store.Allocation) bool { return a.Owner == OwnerDRA }

// LegacyDRA says whether an allocation may be the driver's from before the
// mark existed: network nic.hwipam.io and no owner. Such an allocation is the
// driver's only when its container ID is a claim UID in the checkpoint
// (MarkLegacy marks those); any other is treated as a CNI allocation.
func LegacyDRA(a store.Allocation) bool { return a.Owner == "" && a.Network == DriverName }

// MarkLegacy marks the driver's allocations made before the mark existed: each
// allocation with network nic.hwipam.io, no owner, and a container ID that is a
// claim UID of the checkpoint. each walks the store's allocations, setOwner
// marks one if it is unchanged (nodealloc.Manager's EachAllocation and
// SetOwner). It returns how many it marked. ipam-node runs it at start, with
// or without --dra, before anything else may release an allocation.
func MarkLegacy(ctx context.Context, claims map[types.UID]PreparedClaim,
	each func(fn func(poolKey string, a store.Allocation) error) error,
	setOwner func(ctx context.Context, poolKey string, a store.Allocation, owner string) (bool, error)) (int, error) {
	type rec struct {
		key string
		a   store.Allocation
	}
	var todo []rec
	err := each(func(key string, a store.Allocation) error {
		if _, ok := claims[types.UID(a.ContainerID)]; ok && LegacyDRA(a) {
			todo = append(todo, rec{key, a})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range todo {
		ok, err := setOwner(ctx, r.key, r.a, OwnerDRA)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}
