package ipamnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/rails"
	"github.com/hwipam/hwipam/pkg/store"
)

// railSelector picks a rail's pools for the node service (nodeservice.RailPools):
// the rail of the attachment's device from this node's sysfs, the pools labelled
// for it from the pool sync's last listing.
type railSelector struct {
	pools     *poolSync
	manager   *nodealloc.Manager
	resolver  *rails.Resolver
	namespace string
}

// newRailSelector reads the NICs under root ("/": the node's, through sriovnet
// where it serves), scanned through the daemon's inventory cache.
func newRailSelector(pools *poolSync, m *nodealloc.Manager, root, namespace string, railMap nicdiscovery.Rails,
	scan func(fresh bool) (*nicdiscovery.Inventory, error)) *railSelector {
	var loc rails.Locator = rails.SysfsLocator{Root: root}
	if root == "/" || root == "" {
		loc = rails.LiveLocator{}
	}
	return &railSelector{pools: pools, manager: m, namespace: namespace,
		resolver: &rails.Resolver{Locator: loc, Rails: railMap, Inventory: scan}}
}

// inventoryCache scans root at most once a second, and on demand when a device
// was not in the last scan. The daemon has one, shared by the rail resolver,
// the NIC view and the DRA driver.
func inventoryCache(root string) func(fresh bool) (*nicdiscovery.Inventory, error) {
	var (
		mu   sync.Mutex
		inv  *nicdiscovery.Inventory
		when time.Time
	)
	return func(fresh bool) (*nicdiscovery.Inventory, error) {
		mu.Lock()
		defer mu.Unlock()
		if inv != nil && (!fresh && time.Since(when) < time.Minute || fresh && time.Since(when) < time.Second) {
			return inv, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		next, err := nicdiscovery.Scan(ctx, nicdiscovery.Options{Root: root, Live: new(false)})
		if err != nil {
			return nil, err
		}
		inv, when = next, time.Now()
		return inv, nil
	}
}

// Pools implements nodeservice.RailPools.
func (r *railSelector) Pools(kind, rail string, dev rails.Device) ([]string, string, error) {
	what := fmt.Sprintf("rail %q", rail)
	if rail == "auto" {
		res, err := r.resolver.Resolve(dev)
		switch {
		case errors.Is(err, rails.ErrNoDevice):
			return nil, "", status.Error(codes.InvalidArgument, `rail "auto": the request names no device (deviceID, pciBusID, master or device)`)
		case err != nil:
			return nil, "", status.Errorf(codes.InvalidArgument, `rail "auto": %v`, err)
		}
		rail = res.Rail
		what = fmt.Sprintf("rail %q (of %s, PF %s)", rail, dev, res.PF)
	}
	names, synced := r.pools.poolsOfRail(kind, rail)
	switch {
	case !synced:
		return nil, "", status.Errorf(codes.Unavailable, "%s: the pools have not been listed from the API server yet", what)
	case len(names) == 0:
		return nil, "", status.Errorf(codes.NotFound, "%s: no %s in namespace %s is labelled %s=%s; label the rail's pool "+
			"(two, IPv4 and IPv6, for dual-stack)", what, kind, r.namespace, LabelRail, rail)
	case len(names) > 2:
		return nil, "", status.Errorf(codes.InvalidArgument, "%s: %d %ss are labelled %s=%s (%s); a rail has one pool, or two for dual-stack",
			what, len(names), kind, LabelRail, rail, strings.Join(names, ", "))
	}
	return names, rail, nil
}

// Holding implements nodeservice.RailPools. It reads the store one record at a
// time: a release whose device is gone is rare, the allocations may be many.
func (r *railSelector) Holding(kind, containerID, ifName string) []string {
	var out []string
	_ = r.manager.EachAllocation("", func(key string, a store.Allocation) error {
		if k, name := v1alpha1.SplitPoolKey(key); k == kind && a.ContainerID == containerID && a.IfName == ifName &&
			!slices.Contains(out, name) {
			out = append(out, name)
		}
		return nil
	})
	return out
}

// RailOf implements nodeservice.RailPools.
func (r *railSelector) RailOf(kind, pool string) string { return r.pools.railOfPool(kind, pool) }
