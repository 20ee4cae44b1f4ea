package ipamnode

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// The DRA driver's rights (deploy/overlays/dra): its node's ResourceSlices, the
// claims it prepares (read; listed for the garbage collection by claim UID),
// and their status.devices entries of driver nic.hwipam.io.
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims/status,verbs=patch

// draCheckpoint is the DRA checkpoint's file, beside the store.
func draCheckpoint(storeFile string) string {
	return nicdra.CheckpointBeside(storeFile)
}

// newDRADriver builds the DRA driver on the daemon's allocation state, pools
// and NIC inventory.
func newDRADriver(o *Options, cfg *rest.Config, m *nodealloc.Manager, pools *poolSync, rails nicdiscovery.Rails,
	scan func(fresh bool) (*nicdiscovery.Inventory, error), logger logr.Logger) (*nicdra.Driver, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA driver's client: %w", err)
	}
	bootID, err := nicdra.BootID("/")
	if err != nil {
		return nil, err
	}
	inventory := func() *nicdiscovery.Inventory {
		inv, err := scan(true)
		if err != nil || inv == nil {
			return &nicdiscovery.Inventory{Root: o.SysfsRoot}
		}
		return inv
	}
	p := &nicdra.Preparer{Allocator: m, Checkpoint: nicdra.CheckpointFile{Path: draCheckpoint(o.StoreFile)},
		Inventory: inventory, Rails: rails, BootID: bootID,
		PoolsForRail: func(rail, kind string) []string {
			names, _ := pools.poolsOfRail(kind, rail)
			return names
		}}
	var nri *nicdra.NRIPlugin
	if o.DRANRISocket != "" {
		nri = &nicdra.NRIPlugin{Devices: p, Attacher: &nicdra.Attacher{HostNetNS: o.DRAHostNetNS}, SysfsRoot: o.SysfsRoot, Log: logger.WithName("nri")}
	}
	return &nicdra.Driver{NodeName: o.NodeName, Client: client, Preparer: p, KubeletDir: o.DRAKubeletDir,
		NRI: nri, NRISocket: o.DRANRISocket,
		Inventory:   func() (*nicdiscovery.Inventory, error) { return scan(true) },
		PoolsByRail: pools.railPoolsAll,
		Allocations: func(fn func(string, store.Allocation) error) error { return m.EachAllocation("", fn) },
		Release:     m.ReleaseIf,
		Log:         logger.WithName("dra")}, nil
}

// runDRA runs the driver until ctx ends.
func runDRA(ctx context.Context, d *nicdra.Driver) error {
	if err := d.Run(ctx); err != nil {
		return fmt.Errorf("the DRA driver: %w", err)
	}
	return nil
}
