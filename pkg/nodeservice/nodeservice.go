// Package nodeservice serves the node daemon's gRPC API: nv-ipam's
// nvidia.ipam.node.v1.IPAMService for the CNI plugin and hwipam.node.v1
// NodeInfoService for ipamctl, over a nodealloc.Manager. It is the one place
// where the allocation errors become gRPC status codes.
package nodeservice

import (
	"cmp"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/rails"
)

// Service implements both services.
type Service struct {
	nodev1.UnimplementedIPAMServiceServer
	infov1.UnimplementedNodeInfoServiceServer

	Manager *nodealloc.Manager
	// Info is what GetInfo answers: the daemon's version and paths.
	Info *infov1.GetInfoResponse
	// Rails picks the pools of a request that names a rail instead of pools; nil
	// refuses such requests.
	Rails RailPools
	// NICs is the daemon's NIC inventory, for ListNICs; nil answers that the
	// daemon keeps none.
	NICs NICSource
	// Ports resolves the port a request's device is, recorded with the
	// allocation, and refuses one a DRA claim holds; nil records none.
	Ports Ports

	failures failureRing
}

// NICSource is the daemon's own view of the node's NICs.
type NICSource interface {
	// NICs returns the ports of the daemon's last NIC scan; a failed scan is
	// told in the answer's error.
	NICs(ctx context.Context) *infov1.ListNICsResponse
}

// ListNICs implements NodeInfoService.
func (s *Service) ListNICs(ctx context.Context, _ *infov1.ListNICsRequest) (*infov1.ListNICsResponse, error) {
	if s.NICs == nil {
		return &infov1.ListNICsResponse{Error: "this daemon keeps no NIC inventory"}, nil
	}
	return s.NICs.NICs(ctx), nil
}

// RailPools picks a rail's pools (docs/rails.md).
type RailPools interface {
	// Pools returns the pools of kind labelled for rail, where rail "auto" is the
	// rail of dev, and the rail it took. Its errors are gRPC statuses.
	Pools(kind, rail string, dev rails.Device) (pools []string, resolved string, err error)
	// Holding returns the pools of kind that hold an allocation of the interface:
	// where a release goes when the device can no longer be found.
	Holding(kind, containerID, ifName string) []string
	// RailOf returns the rail a pool is labelled for, "" when none.
	RailOf(kind, pool string) string
}

// Ports is what the service knows of the node's NIC ports beside the CNI
// path: which PCI function a request's device is, and which DRA claim holds a
// port. Its methods are cheap (no NIC scan): they run on every ADD that names
// a device.
type Ports interface {
	// Functions returns the PCI addresses of the NIC functions dev names
	// (several for a bond, or a VLAN on one), none when it names none this
	// node has.
	Functions(dev rails.Device) []string
	// Take names the DRA claim (namespace/name) that holds the device dev
	// names or the port, or is being prepared with it; "" when none does,
	// and then done, which the ADD calls once its allocation is committed or
	// failed: until then no claim is prepared with the port. The check and
	// the mark are one step, under the lock the DRA driver's prepare takes
	// its ports under (nicdra.PortLedger).
	Take(dev rails.Device, ports ...string) (claim string, done func())
	// Changed is told after an allocation or release that names a device:
	// the DRA driver then publishes its free ports again.
	Changed()
}

// device is the attachment's device a request names.
func device(p *nodev1.IPAMParameters) rails.Device {
	return rails.Device{DeviceID: p.GetMetadata().GetDeviceId(), PCIBusID: p.GetPciBusId(), Master: p.GetMaster(), Netdev: p.GetDevice()}
}

// port resolves and records the port of an Allocate, and refuses a device a
// DRA claim holds or is being prepared with. Otherwise the port counts as
// being added to until done is called (after the allocation's commit).
func (s *Service) port(p *nodev1.IPAMParameters, req *nodealloc.Request) (done func(), err error) {
	dev := device(p)
	if s.Ports == nil || dev.Empty() || dev.Check() != nil {
		return func() {}, nil // a malformed device is refused where it is used (rail "auto"), or not used at all
	}
	fns := s.Ports.Functions(dev)
	if len(fns) > 0 {
		req.Meta.Port = fns[0]
	}
	if len(fns) > 1 {
		req.Meta.Ports = fns
	}
	claim, done := s.Ports.Take(dev, fns...)
	if claim != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is held by DRA claim %s (driver %s): its port is in that "+
			"claim's pod, or being prepared for it, so this attachment cannot use it; use another device, or delete "+
			"the claim's pod and claim", dev, claim, ipamwire.ReservedNetworkName)
	}
	return done, nil
}

// railOf is s.Rails.RailOf, "" without Rails.
func (s *Service) railOf(kind, pool string) string {
	if s.Rails == nil {
		return ""
	}
	return s.Rails.RailOf(kind, pool)
}

// byRail fills req.Pools from the rail a request names. A release whose device
// cannot be resolved any more (a VF gone since) releases the interface in every
// pool of the kind that holds it.
func (s *Service) byRail(p *nodev1.IPAMParameters, req *nodealloc.Request, release bool) error {
	if p.GetRail() == "" {
		return nil
	}
	if len(p.GetPools()) > 0 {
		return status.Errorf(codes.InvalidArgument, "parameters: pools %v and rail %q are both set; name the pools, or the rail", p.GetPools(), p.GetRail())
	}
	if s.Rails == nil {
		return status.Errorf(codes.FailedPrecondition, "rail %q: this daemon does not allocate by rail (no NIC inventory)", p.GetRail())
	}
	dev := device(p)
	pools, rail, err := s.Rails.Pools(req.Kind, p.GetRail(), dev)
	if err != nil {
		if release && status.Code(err) != codes.Internal {
			req.Pools = s.Rails.Holding(req.Kind, req.ContainerID, req.IfName)
			return nil
		}
		return err
	}
	req.Pools, req.Meta.Rail = pools, rail
	return nil
}

// maxFailures is how many failed Allocate calls ListFailures keeps.
const maxFailures = 32

// failureRing keeps the last failed Allocate calls.
type failureRing struct {
	mu   sync.Mutex
	list []*infov1.Failure // oldest first
}

func (r *failureRing) record(req *nodealloc.Request, err error) {
	st, _ := status.FromError(err)
	f := &infov1.Failure{Time: time.Now().Unix(), PodNamespace: req.Meta.PodNamespace, PodName: req.Meta.PodName,
		ContainerId: req.ContainerID, IfName: req.IfName, Pools: slices.Clone(req.Pools), Code: st.Code().String(),
		Message: st.Message()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.list) == maxFailures {
		r.list = slices.Delete(r.list, 0, 1)
	}
	r.list = append(r.list, f)
}

// ListFailures implements NodeInfoService.
func (s *Service) ListFailures(context.Context, *infov1.ListFailuresRequest) (*infov1.ListFailuresResponse, error) {
	s.failures.mu.Lock()
	defer s.failures.mu.Unlock()
	out := &infov1.ListFailuresResponse{}
	for i := len(s.failures.list) - 1; i >= 0; i-- {
		out.Failures = append(out.Failures, s.failures.list[i])
	}
	return out, nil
}

var (
	_ nodev1.IPAMServiceServer     = (*Service)(nil)
	_ infov1.NodeInfoServiceServer = (*Service)(nil)
)

// Allocate implements IPAMService.
func (s *Service) Allocate(ctx context.Context, in *nodev1.AllocateRequest) (*nodev1.AllocateResponse, error) {
	req, err := toRequest(in.GetParameters())
	if err != nil {
		return nil, err
	}
	if req.Meta.Network == ipamwire.ReservedNetworkName {
		st := status.Errorf(codes.InvalidArgument, "network name %q is reserved for hwipam's DRA driver: rename the "+
			"network (the NetworkAttachmentDefinition's config \"name\")", req.Meta.Network)
		s.failures.record(req, st)
		return nil, st
	}
	if err := s.byRail(in.GetParameters(), req, false); err != nil {
		return nil, err
	}
	done, err := s.port(in.GetParameters(), req)
	if err != nil {
		s.failures.record(req, err)
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		done()
		return nil, status.FromContextError(err).Err()
	}
	res, err := s.Manager.Allocate(ctx, req)
	done() // committed (or failed): the store says it from here on
	if err != nil {
		st := toStatus(err)
		s.failures.record(req, st)
		return nil, st
	}
	if req.Meta.Port != "" {
		s.Ports.Changed()
	}
	out := &nodev1.AllocateResponse{}
	for _, r := range res {
		info := &nodev1.AllocationInfo{Pool: r.Pool, Ip: r.Addr.String(), PoolType: poolType(r.Kind)}
		if r.Gateway.IsValid() {
			info.Gateway = r.Gateway.String()
		}
		for _, rt := range r.Routes {
			info.Routes = append(info.Routes, &nodev1.Route{Dest: rt.String()})
		}
		out.Allocations = append(out.Allocations, info)
	}
	return out, nil
}

// IsAllocated implements IPAMService.
func (s *Service) IsAllocated(ctx context.Context, in *nodev1.IsAllocatedRequest) (*nodev1.IsAllocatedResponse, error) {
	req, err := toRequest(in.GetParameters())
	if err != nil {
		return nil, err
	}
	if err := s.byRail(in.GetParameters(), req, false); err != nil {
		return nil, err
	}
	if err := s.Manager.IsAllocated(ctx, req); err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.IsAllocatedResponse{}, nil
}

// Deallocate implements IPAMService.
func (s *Service) Deallocate(ctx context.Context, in *nodev1.DeallocateRequest) (*nodev1.DeallocateResponse, error) {
	req, err := toRequest(in.GetParameters())
	if err != nil {
		return nil, err
	}
	if err := s.byRail(in.GetParameters(), req, true); err != nil {
		return nil, err
	}
	if len(req.Pools) == 0 {
		return &nodev1.DeallocateResponse{}, nil // by rail, and no pool holds the interface
	}
	if err := s.Manager.Deallocate(ctx, req); err != nil {
		return nil, toStatus(err)
	}
	if s.Ports != nil && !device(in.GetParameters()).Empty() {
		s.Ports.Changed()
	}
	return &nodev1.DeallocateResponse{}, nil
}

// GetInfo implements NodeInfoService.
func (s *Service) GetInfo(context.Context, *infov1.GetInfoRequest) (*infov1.GetInfoResponse, error) {
	if s.Info == nil {
		return &infov1.GetInfoResponse{}, nil
	}
	return s.Info, nil
}

// ListPools implements NodeInfoService.
func (s *Service) ListPools(context.Context, *infov1.ListPoolsRequest) (*infov1.ListPoolsResponse, error) {
	out := &infov1.ListPoolsResponse{}
	for _, p := range s.Manager.Pools() {
		info := &infov1.PoolInfo{Key: p.Key, Active: p.Active, Allocated: p.Allocated, Orphans: p.Orphans,
			Size: p.Size.String(), Free: p.Free.String()}
		_, info.Name = v1alpha1.SplitPoolKey(p.Key)
		if c := p.Config; c != nil {
			var inBlock []iprange.Range
			for _, e := range c.Exclusions {
				if e.Overlaps(c.Block) { // the part inside the block
					if e.Start.Less(c.Block.Start) {
						e.Start = c.Block.Start
					}
					if c.Block.End.Less(e.End) {
						e.End = c.Block.End
					}
					inBlock = append(inBlock, e)
				}
			}
			// The pool's exclusions and the per-node ones may overlap: each
			// excluded address once, in order.
			for _, e := range iprange.Merge(inBlock) {
				info.Exclusions = append(info.Exclusions, e.String())
			}
			info.Name, info.Kind = c.Name, c.Kind
			info.Rail = s.railOf(c.Kind, c.Name)
			info.Start, info.End, info.Prefix = c.Block.Start.String(), c.Block.End.String(), c.Prefix.String()
			if c.Gateway.IsValid() {
				info.Gateway = c.Gateway.String()
			}
		}
		out.Pools = append(out.Pools, info)
	}
	return out, nil
}

// ListAllocations implements NodeInfoService.
func (s *Service) ListAllocations(_ context.Context, in *infov1.ListAllocationsRequest) (*infov1.ListAllocationsResponse, error) {
	out := &infov1.ListAllocationsResponse{}
	for pool, list := range s.Manager.Allocations(in.GetPool()) {
		rail := s.railOf(v1alpha1.SplitPoolKey(pool))
		for i := range list {
			a := &list[i]
			out.Allocations = append(out.Allocations, &infov1.AllocationRecord{
				Pool: pool, ContainerId: a.ContainerID, IfName: a.IfName, Ip: a.IP,
				PodName: a.PodName, PodNamespace: a.PodNamespace, PodUid: a.PodUID, DeviceId: a.DeviceID,
				CreateTime: a.CreateTime.Unix(), Network: a.Network, Rail: cmp.Or(a.Rail, rail), Owner: a.Owner,
				Ports: a.UsedPorts(),
			})
		}
	}
	return out, nil
}

func poolType(kind string) nodev1.PoolType {
	if kind == v1alpha1.KindCIDRPool {
		return nodev1.PoolType_POOL_TYPE_CIDRPOOL
	}
	return nodev1.PoolType_POOL_TYPE_IPPOOL
}

// toRequest checks and converts the wire parameters; errors are InvalidArgument
// naming the field.
func toRequest(p *nodev1.IPAMParameters) (*nodealloc.Request, error) {
	if p == nil {
		return nil, status.Error(codes.InvalidArgument, "parameters: required")
	}
	req := &nodealloc.Request{
		Pools: p.GetPools(), ContainerID: p.GetCniContainerid(), IfName: p.GetCniIfname(),
		Meta: nodealloc.Metadata{PodName: p.GetMetadata().GetK8SPodName(), PodNamespace: p.GetMetadata().GetK8SPodNamespace(),
			PodUID: p.GetMetadata().GetK8SPodUid(), DeviceID: p.GetMetadata().GetDeviceId(), Network: p.GetNetworkName()},
		AllocateGateway: p.GetFeatures().GetAllocateDefaultGateway(),
	}
	switch p.GetPoolType() {
	case nodev1.PoolType_POOL_TYPE_UNSPECIFIED, nodev1.PoolType_POOL_TYPE_IPPOOL:
		req.Kind = v1alpha1.KindIPPool
	case nodev1.PoolType_POOL_TYPE_CIDRPOOL:
		req.Kind = v1alpha1.KindCIDRPool
	default:
		return nil, status.Errorf(codes.InvalidArgument, "parameters.pool_type: unknown value %d", p.GetPoolType())
	}
	if p.GetFeatures() != nil && p.GetFeatures().AllocateIpWithIndex != nil {
		ix := p.GetFeatures().GetAllocateIpWithIndex()
		req.Index = &ix
	}
	for i, s := range p.GetRequestedIps() {
		a, err := parseIP(s)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "parameters.requested_ips[%d]: %q is not an IP address", i, s)
		}
		req.RequestedIPs = append(req.RequestedIPs, a)
	}
	return req, nil
}

func parseIP(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, err
		}
		return p.Addr(), nil
	}
	return netip.ParseAddr(s)
}

// toStatus maps allocation errors to gRPC codes.
func toStatus(err error) error {
	switch {
	case errors.Is(err, nodealloc.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, nodealloc.ErrUnknownPool), errors.Is(err, nodealloc.ErrNotAllocated):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, nodealloc.ErrExhausted):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, nodealloc.ErrDeletedMeanwhile):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
