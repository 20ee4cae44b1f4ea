package ipamctl

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"

	"github.com/hwipam/hwipam/nicdiscovery"
)

// scanFlags are the flags of the commands that scan this node's NICs themselves
// (no daemon needed).
type scanFlags struct {
	root    string
	verbose bool
}

func (f *scanFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.root, "sysfs-root", "/", "directory that contains sys/ (a captured tree, or / for this node)")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "also say which NVIDIA functions are skipped and why")
}

func (f *scanFlags) scan(cmd *cobra.Command) (*nicdiscovery.Inventory, error) {
	return nicdiscovery.Scan(cmd.Context(), nicdiscovery.Options{Root: f.root, Logger: stderrLogger(cmd.ErrOrStderr(), f.verbose)})
}

// stderrLogger prints discovery's warnings as plain lines.
func stderrLogger(w io.Writer, verbose bool) logr.Logger {
	v := 0
	if verbose {
		v = 1
	}
	return funcr.New(func(_, args string) { fmt.Fprintln(w, "ipamctl:", args) }, funcr.Options{Verbosity: v})
}

func nicsCommand() *cobra.Command {
	var f scanFlags
	var output string
	cmd := &cobra.Command{
		Use:   "nics",
		Short: "List this node's NVIDIA NIC functions (PFs and VFs) from sysfs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			inv, err := f.scan(cmd)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					NICs          []nicdiscovery.NIC `json:"nics"`
					NetdevsHidden bool               `json:"netdevsHidden,omitempty"`
				}{inv.NICs, inv.NetdevsHidden})
			}
			if inv.NetdevsHidden {
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: note: this network namespace shows none of the NICs' netdevs "+
					"(a pod without hostNetwork?): Ethernet ports are named from their RDMA GID table, InfiniBand ports have none")
			}
			return nicsTable(cmd.OutOrStdout(), inv.NICs)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func nicsTable(w io.Writer, nics []nicdiscovery.NIC) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PCI\tMODEL\tFN\tPF\tDRIVER\tNUMA\tNETDEVS\tLINK\tSPEED\tRDMA\tVFS\tSTATE\tESWITCH")
	for _, n := range nics {
		numa, vfs := "-", "-"
		if n.NUMANode >= 0 {
			numa = strconv.Itoa(n.NUMANode)
		}
		if n.SRIOVTotalVFs > 0 {
			vfs = fmt.Sprintf("%d/%d", n.SRIOVNumVFs, n.SRIOVTotalVFs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.PCIAddress, n.Model, n.Function, dash(n.PhysFn),
			dash(n.Driver), numa, dash(strings.Join(n.Netdevs, ",")), dash(linkLayers(n)), speed(n.SpeedMbps),
			dash(strings.Join(n.RDMADevices, ",")), vfs, dash(n.PortState), dash(n.EswitchMode))
	}
	return tw.Flush()
}

// linkLayers lists each port's link layer: "InfiniBand,Ethernet" for a VPI card.
func linkLayers(n nicdiscovery.NIC) string {
	var ls []string
	for _, p := range n.Ports {
		if p.LinkLayer != "" {
			ls = append(ls, p.LinkLayer)
		}
	}
	return strings.Join(ls, ",")
}

func speed(mbps int) string {
	switch {
	case mbps <= 0:
		return "-"
	case mbps%1000 == 0:
		return fmt.Sprintf("%dG", mbps/1000)
	}
	return fmt.Sprintf("%dM", mbps)
}

func labelsCommand() *cobra.Command {
	var f scanFlags
	var railConfig string
	cmd := &cobra.Command{
		Use:   "labels",
		Short: "Print the nic.hwipam.io node labels ipam-node would publish for this node, one key=value per line",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rails nicdiscovery.Rails
			if railConfig != "" {
				var err error
				if rails, err = nicdiscovery.LoadRails(railConfig); err != nil {
					return err
				}
			}
			inv, err := f.scan(cmd)
			if err != nil {
				return err
			}
			labels, warnings := nicdiscovery.Labels(inv, rails)
			for _, w := range warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: warning:", w)
			}
			keys := make([]string, 0, len(labels))
			for k := range labels {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s=%s\n", k, labels[k]); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&railConfig, "rail-config", "", "rail map (YAML: rail name to netdev names or PCI addresses), as ipam-node's --rail-config")
	return cmd
}
