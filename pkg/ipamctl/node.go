package ipamctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// DefaultSocket is where ipam-node listens by default.
const DefaultSocket = "unix:///var/lib/cni/nv-ipam/daemon.sock"

type nodeFlags struct {
	socket  string
	output  string
	timeout time.Duration
}

func (f *nodeFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.socket, "socket", DefaultSocket, "ipam-node's gRPC address (unix:///path or host:port)")
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Second, "how long to wait for the daemon, and for each API request")
}

func (f *nodeFlags) call(ctx context.Context, fn func(context.Context, infov1.NodeInfoServiceClient) error) error {
	if err := checkOutput(f.output); err != nil {
		return err
	}
	target := strings.TrimPrefix(f.socket, "tcp://") // gRPC dials host:port and unix:// targets as they are
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("--socket %s: %w", f.socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if err := fn(ctx, infov1.NewNodeInfoServiceClient(conn)); err != nil {
		return &ConnectionError{fmt.Errorf("cannot query ipam-node at %s (is it running on this node? see --socket): %w", f.socket, err)}
	}
	return nil
}

// checkOutput validates -o.
func checkOutput(o string) error {
	if o != "table" && o != "json" && o != "yaml" {
		return usageErrorf("--output %q: want table, json or yaml", o)
	}
	return nil
}

// writeProto prints a daemon response as JSON or YAML.
func writeProto(w io.Writer, output string, m proto.Message) error {
	if output != "yaml" {
		return writeJSON(w, m)
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, m); err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(buf.Bytes())
	if err != nil {
		return fmt.Errorf("encoding YAML: %w", err)
	}
	_, err = w.Write(y)
	return err
}

func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	// protojson varies its whitespace on purpose; print a stable form.
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

func poolsCommand() *cobra.Command {
	var f nodeFlags
	var cluster, list bool
	var kubeconfig, ns string
	cmd := &cobra.Command{
		Use:   "pools",
		Short: "List the pools this node's daemon has a block in, with usage (--cluster: every pool's blocks across nodes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if list && !cluster {
				return usageErrorf("--list goes with --cluster (this node's blocks are in the table already)")
			}
			if cluster {
				if err := checkOutput(f.output); err != nil {
					return err
				}
				cl, err := newClusterClient(kubeconfig, f.timeout)
				if err != nil {
					return err
				}
				s, err := readCluster(cmd.Context(), cl, ns)
				if err != nil {
					return err
				}
				table := clusterTable
				if list {
					table = clusterTableWithBlocks
				}
				return writeReport(cmd.OutOrStdout(), f.output, s.report(), table)
			}
			return f.call(cmd.Context(), func(ctx context.Context, c infov1.NodeInfoServiceClient) error {
				resp, err := c.ListPools(ctx, &infov1.ListPoolsRequest{})
				if err != nil {
					return err
				}
				if f.output != "table" {
					return writeProto(cmd.OutOrStdout(), f.output, resp)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				// Addresses, all of them: the block's size, those allocated in it and
				// those free in it; orphans are allocations outside it (a block left
				// after a pool edit), counted apart so that IPS USED and IPS FREE are
				// both of the block.
				fmt.Fprintln(tw, "POOL\tKIND\tRAIL\tBLOCK\tPREFIX\tGATEWAY\tBLOCK IPS\tIPS USED\tIPS FREE\tORPHANS\tEXCLUDED\tACTIVE")
				for _, p := range resp.GetPools() {
					block := "-"
					if p.GetStart() != "" {
						block = p.GetStart() + "-" + p.GetEnd()
					}
					inBlock := p.GetAllocated() - min(p.GetOrphans(), p.GetAllocated())
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%v\n", p.GetKey(), dash(p.GetKind()), dash(p.GetRail()), block,
						dash(p.GetPrefix()), dash(p.GetGateway()), dash(p.GetSize()), inBlock, dash(p.GetFree()), p.GetOrphans(),
						dash(strings.Join(p.GetExclusions(), ",")), p.GetActive())
				}
				return tw.Flush()
			})
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&cluster, "cluster", false, "show every pool's blocks across nodes, selected nodes without a block, "+
		"blocks used and the NetworkAttachmentDefinitions that use it, by name or by rail (reads the API server)")
	cmd.Flags().BoolVar(&list, "list", false, "with --cluster: also list every node's block of every pool (json and yaml always carry them)")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig for --cluster (default: $KUBECONFIG, or in-cluster in a pod)")
	cmd.Flags().StringVar(&ns, "ippools-namespace", "kube-system", "namespace of the pools, for --cluster")
	return cmd
}

// AllocationsReport is `ipamctl allocations -o json|yaml`: the daemon's
// records, with createTime in RFC 3339 as Kubernetes writes times (the gRPC API
// carries Unix seconds).
type AllocationsReport struct {
	Allocations []Allocation `json:"allocations"`
}

// Allocation is one allocation the daemon holds.
type Allocation struct {
	Pool         string    `json:"pool"`
	ContainerID  string    `json:"containerId"`
	IfName       string    `json:"ifName"`
	IP           string    `json:"ip"`
	PodName      string    `json:"podName"`
	PodNamespace string    `json:"podNamespace"`
	PodUID       string    `json:"podUid"`
	DeviceID     string    `json:"deviceId"`
	CreateTime   time.Time `json:"createTime"`
	Network      string    `json:"network"`
	Rail         string    `json:"rail"`
	// Claim is the ResourceClaim of an allocation of ipam-node's DRA driver
	// (network nic.hwipam.io, whose container ID is the claim's UID).
	Claim *AllocationClaim `json:"claim,omitempty"`
}

// resolvePool finds the store key of --pool among the daemon's pools: the key
// itself (an IPPool's name, cidrpool/<name>), or a pool's plain name, of
// --pool-type when given. A name the daemon does not know, or one that names an
// IPPool and a CIDRPool alike without --pool-type, is a usage error saying so.
func resolvePool(pools []*infov1.PoolInfo, name, poolType string) (string, error) {
	var keys, matches []string
	for _, p := range pools {
		keys = append(keys, p.GetKey())
		kind := strings.ToLower(p.GetKind())
		if kind == "" { // a pool whose block the daemon never learned: kind from its key
			kind = "ippool"
			if strings.HasPrefix(p.GetKey(), "cidrpool/") {
				kind = "cidrpool"
			}
		}
		plain := p.GetName()
		if plain == "" {
			plain = strings.TrimPrefix(p.GetKey(), "cidrpool/")
		}
		if (p.GetKey() == name || plain == name) && (poolType == "" || poolType == kind) {
			matches = append(matches, p.GetKey())
		}
	}
	switch {
	case len(matches) == 1:
		return matches[0], nil
	case len(matches) > 1:
		return "", usageErrorf("--pool %q names an IPPool and a CIDRPool on this node (%s): give --pool-type ippool or cidrpool",
			name, strings.Join(matches, ", "))
	}
	known := "none"
	if len(keys) > 0 {
		known = strings.Join(keys, ", ")
	}
	what := "pool"
	if poolType != "" {
		what = poolType
	}
	return "", fmt.Errorf("%w: ipam-node on this node has no %s %q (its pools: %s); a pool appears here once it gives this "+
		"node a block: see `ipamctl pools --cluster`", ErrUnknownPool, what, name, known)
}

// ErrUnknownPool is a --pool the daemon does not have.
var ErrUnknownPool = errors.New("no such pool")

func allocationsCommand() *cobra.Command {
	var f nodeFlags
	var pool, poolType, storeFile string
	cmd := &cobra.Command{
		Use:   "allocations",
		Short: "List the allocations this node's daemon holds, with their pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			poolType = strings.ToLower(poolType)
			if poolType != "" && poolType != "ippool" && poolType != "cidrpool" {
				return usageErrorf("--pool-type %q: want ippool or cidrpool", poolType)
			}
			if poolType != "" && pool == "" {
				return usageErrorf("--pool-type goes with --pool")
			}
			var resp *infov1.ListAllocationsResponse
			var unknown error
			var claims map[types.UID]nicdra.PreparedClaim
			err := f.call(cmd.Context(), func(ctx context.Context, c infov1.NodeInfoServiceClient) error {
				key := ""
				if pool != "" {
					pools, err := c.ListPools(ctx, &infov1.ListPoolsRequest{})
					if err != nil {
						return err
					}
					if key, unknown = resolvePool(pools.GetPools(), pool, poolType); unknown != nil {
						return nil
					}
				}
				var err error
				if resp, err = c.ListAllocations(ctx, &infov1.ListAllocationsRequest{Pool: key}); err != nil {
					return err
				}
				if slices.ContainsFunc(resp.GetAllocations(), func(a *infov1.AllocationRecord) bool { return isClaimAllocation(a.GetOwner()) }) {
					claims = preparedClaims(ctx, c, storeFile, cmd.ErrOrStderr())
				}
				return nil
			})
			if err != nil {
				return err
			}
			if unknown != nil {
				return unknown
			}
			if f.output != "table" {
				r := AllocationsReport{Allocations: []Allocation{}}
				for _, a := range resp.GetAllocations() {
					ra := Allocation{Pool: a.GetPool(), ContainerID: a.GetContainerId(), IfName: a.GetIfName(),
						IP: a.GetIp(), PodName: a.GetPodName(), PodNamespace: a.GetPodNamespace(), PodUID: a.GetPodUid(),
						DeviceID: a.GetDeviceId(), CreateTime: time.Unix(a.GetCreateTime(), 0).UTC(), Network: a.GetNetwork(), Rail: a.GetRail()}
					if isClaimAllocation(a.GetOwner()) {
						ra.Claim = claimOf(claims, a.GetContainerId())
					}
					r.Allocations = append(r.Allocations, ra)
				}
				return writeReport(cmd.OutOrStdout(), f.output, &r, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			// A DRA claim's allocation shows its claim where a CNI one shows its
			// container; the header says so only when there is one.
			owner := "CONTAINER"
			if claims != nil {
				owner = "CONTAINER/CLAIM"
			}
			fmt.Fprintf(tw, "RAIL\tPOOL\tIP\tNETWORK\tPOD\t%s\tIF\tDEVICE\tCREATED\n", owner)
			for _, a := range resp.GetAllocations() {
				pod := "-"
				if a.GetPodName() != "" {
					pod = a.GetPodNamespace() + "/" + a.GetPodName()
				}
				cid := a.GetContainerId()
				switch {
				case isClaimAllocation(a.GetOwner()):
					cid = claimOf(claims, cid).String()
				case len(cid) > 12:
					cid = cid[:12]
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(a.GetRail()), a.GetPool(), a.GetIp(), dash(a.GetNetwork()), pod, cid, a.GetIfName(),
					dash(a.GetDeviceId()), time.Unix(a.GetCreateTime(), 0).UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool: its name (an IPPool's or a CIDRPool's), or its store key (cidrpool/<name>)")
	cmd.Flags().StringVar(&poolType, "pool-type", "", "with --pool: ippool or cidrpool, for a name both kinds have")
	cmd.Flags().StringVar(&storeFile, "store-file", "", "the daemon's store, beside which its DRA checkpoint names the claims "+
		"of DRA allocations (default: where the daemon says, else "+defaultStoreFile+")")
	return cmd
}

// defaultStoreFile is ipam-node's default --store-file.
const defaultStoreFile = "/var/lib/cni/nv-ipam/store"

// preparedClaims reads the DRA checkpoint beside the daemon's store
// (storeFlag, else where the daemon says): the claims of the DRA allocations.
// It is never nil; a checkpoint it cannot read is said on stderr, and the
// claims are then shown by UID.
func preparedClaims(ctx context.Context, c infov1.NodeInfoServiceClient, storeFlag string, stderr io.Writer) map[types.UID]nicdra.PreparedClaim {
	path := storeFlag
	if path == "" {
		if info, err := c.GetInfo(ctx, &infov1.GetInfoRequest{}); err == nil {
			path = info.GetStoreFile()
		}
	}
	if path == "" {
		path = defaultStoreFile
	}
	cp, err := nicdra.CheckpointFile{Path: nicdra.CheckpointBeside(path)}.Load()
	if err != nil {
		fmt.Fprintf(stderr, "ipamctl: %v; DRA claims are shown by UID\n", err)
		return map[types.UID]nicdra.PreparedClaim{}
	}
	return cp.Claims
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
