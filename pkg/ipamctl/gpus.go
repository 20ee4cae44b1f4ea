package ipamctl

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/rails"
)

// GPUNIC is one row of `ipamctl gpus`: a GPU, a NIC port near it, the port's
// rail and pools, and the DRA claim that holds the port, if any.
type GPUNIC struct {
	GPU    int    `json:"gpu"`
	GPUPCI string `json:"gpuPCI"`
	Model  string `json:"model,omitempty"`
	// NIC is the port's netdev (its PCI address when it has none here).
	NIC    string `json:"nic,omitempty"`
	NICPCI string `json:"nicPCI,omitempty"`
	// Near is nicdiscovery.GPUSharesSwitch or GPUSharesRoot.
	Near string `json:"near,omitempty"`
	Rail string `json:"rail,omitempty"`
	// Pools are the pools labelled for the rail, as the DRA driver last
	// published them (or, for a port a claim holds, the claim's pools).
	Pools string `json:"pools,omitempty"`
	// Preparable is the device's preparable attribute (nil: the port is not
	// published, or the driver does not run).
	Preparable *bool `json:"preparable,omitempty"`
	// Claim (namespace/name), Pod, Interface and Addresses are the claim's
	// that holds the port.
	Claim     string   `json:"claim,omitempty"`
	Pod       string   `json:"pod,omitempty"`
	Interface string   `json:"interface,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
}

// GPUsReport is `ipamctl gpus -o json|yaml`.
type GPUsReport struct {
	GPUs []GPUNIC `json:"gpus"`
	View *NICView `json:"view,omitempty"`
}

func gpusCommand() *cobra.Command {
	var f scanFlags
	var output, railConfig, storeFile string
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "Per GPU: the NIC ports near it, their rails and pools, and the DRA claims that hold them with their addresses",
		Long: "gpus lists, for each NVIDIA GPU of the node, the NIC ports behind the same PCIe switch (near: switch)\n" +
			"and those sharing only its root complex (near: root), each with its rail, the pools labelled for the rail\n" +
			"and whether a claim for it can be prepared (from the DRA driver's last publication), and the DRA claim that\n" +
			"holds the port: its pod, the interface in the pod and its addresses (from the driver's checkpoint beside the\n" +
			"store). A GPU with no NIC near it gets one row without a NIC.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			v, err := f.view(cmd, railConfig)
			if err != nil {
				return err
			}
			live := false
			inv, err := nicdiscovery.Scan(cmd.Context(), nicdiscovery.Options{Root: v.SysfsRoot, Live: &live,
				Logger: stderrLogger(cmd.ErrOrStderr(), f.verbose)})
			if err != nil {
				return err
			}
			path := storeFile
			if path == "" {
				if info, err := daemonInfo(cmd.Context(), f.socket, f.timeout); err == nil {
					path = info.GetStoreFile()
				}
			}
			if path == "" {
				path = defaultStoreFile
			}
			cpPath := nicdra.CheckpointBeside(path)
			var claims map[string]nicdra.PreparedClaim
			if cp, err := (nicdra.CheckpointFile{Path: cpPath}).Load(); err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "ipamctl: %v; claims are not shown (see --store-file)\n", err)
			} else {
				claims = map[string]nicdra.PreparedClaim{}
				for _, pc := range cp.Claims {
					for _, d := range pc.Devices {
						claims[d.PCIAddress] = pc
					}
				}
			}
			st, ok, err := nicdra.ReadStatus(nicdra.StatusFile(cpPath))
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "ipamctl: %v; pools are not shown\n", err)
			} else if !ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "ipamctl: the DRA driver has no status beside %s (it does not run with this "+
					"store); pools are not shown\n", path)
			}
			r := GPUsReport{GPUs: gpuRows(inv, v.rails, claims, st.Ports), View: v}
			if output != "table" {
				return writeReport(cmd.OutOrStdout(), output, r, nil)
			}
			return gpuRowsTable(cmd.OutOrStdout(), r.GPUs)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().StringVar(&railConfig, "rail-config", "", "rail map, as ipam-node's --rail-config (default: the running daemon's)")
	cmd.Flags().StringVar(&storeFile, "store-file", "", "the daemon's store, beside which the DRA driver keeps its checkpoint and "+
		"status (default: where the daemon says, else "+defaultStoreFile+")")
	return cmd
}

// gpuRows joins the GPUs and their near NIC ports (PFs, and VFs a claim holds)
// with the ports' rails, the driver's published ports, and the claims by PCI
// address.
func gpuRows(inv *nicdiscovery.Inventory, railMap nicdiscovery.Rails, claims map[string]nicdra.PreparedClaim,
	ports []nicdra.PublishedPort) []GPUNIC {
	railOf := rails.PFRails(inv, railMap)
	published := map[string]nicdra.PublishedPort{}
	for _, p := range ports {
		published[p.PCIAddress] = p
	}
	var out []GPUNIC
	for _, g := range inv.GPUs {
		var rows []GPUNIC
		for _, n := range inv.NICs {
			_, held := claims[n.PCIAddress]
			if n.Function == nicdiscovery.FunctionVF && !held {
				continue
			}
			i := slices.IndexFunc(n.GPUs, func(ng nicdiscovery.NearGPU) bool { return ng.PCIAddress == g.PCIAddress })
			if i < 0 {
				continue
			}
			pf := n.PCIAddress
			if n.Function == nicdiscovery.FunctionVF {
				pf = n.PhysFn
			}
			row := GPUNIC{GPU: g.Index, GPUPCI: g.PCIAddress, Model: g.Model, NIC: n.PCIAddress, NICPCI: n.PCIAddress,
				Near: n.GPUs[i].Shares, Rail: railOf[pf]}
			if len(n.Netdevs) > 0 {
				row.NIC = n.Netdevs[0]
			}
			if p, ok := published[n.PCIAddress]; ok {
				row.Pools, row.Rail = p.Pools, cmpOr(p.Rail, row.Rail)
				prep := p.Preparable
				row.Preparable = &prep
			}
			if pc, ok := claims[n.PCIAddress]; ok {
				row.Claim, row.Pod = pc.Namespace+"/"+pc.Name, pc.PodName
				if row.Pod != "" && !strings.Contains(row.Pod, "/") {
					row.Pod = pc.Namespace + "/" + row.Pod
				}
				for _, d := range pc.Devices {
					if d.PCIAddress == n.PCIAddress {
						row.NIC = cmpOr(d.HostNetdev, row.NIC)
						row.Interface, row.Addresses = d.InterfaceName, d.Addresses
						row.Pools, row.Rail = strings.Join(d.Pools, ","), cmpOr(d.Rail, row.Rail)
					}
				}
			}
			rows = append(rows, row)
		}
		// The switch's ports first, then the root complex's, each by PCI address.
		slices.SortStableFunc(rows, func(a, b GPUNIC) int {
			if a.Near != b.Near {
				if a.Near == nicdiscovery.GPUSharesSwitch {
					return -1
				}
				return 1
			}
			return strings.Compare(a.NICPCI, b.NICPCI)
		})
		if len(rows) == 0 {
			rows = []GPUNIC{{GPU: g.Index, GPUPCI: g.PCIAddress, Model: g.Model}}
		}
		out = append(out, rows...)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func gpuRowsTable(w io.Writer, rows []GPUNIC) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no NVIDIA GPU found on this node")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tGPU PCI\tNIC\tNIC PCI\tNEAR\tRAIL\tPOOLS\tPREPARABLE\tCLAIM\tPOD\tINTERFACE\tADDRESSES")
	for _, r := range rows {
		prep := "-"
		if r.Preparable != nil {
			prep = strconv.FormatBool(*r.Preparable)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GPU, r.GPUPCI, dash(r.NIC), dash(r.NICPCI), dash(r.Near),
			dash(r.Rail), dash(r.Pools), prep, dash(r.Claim), dash(r.Pod), dash(r.Interface), dash(strings.Join(r.Addresses, ",")))
	}
	return tw.Flush()
}
