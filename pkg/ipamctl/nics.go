package ipamctl

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

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
	socket  string
	timeout time.Duration
}

func (f *scanFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.root, "sysfs-root", "", "directory that contains sys/ (a captured tree, or / for this node; "+
		"default: the running daemon's --sysfs-root, else /)")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "also say which NVIDIA functions are skipped and why")
	cmd.Flags().StringVar(&f.socket, "socket", DefaultSocket, "ipam-node's gRPC address, asked for its --sysfs-root and --rail-config")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 2*time.Second, "how long to wait for the daemon")
}

// stderrLogger prints discovery's warnings as plain lines.
func stderrLogger(w io.Writer, verbose bool) logr.Logger {
	v := 0
	if verbose {
		v = 1
	}
	return funcr.New(func(_, args string) { fmt.Fprintln(w, "ipamctl:", args) }, funcr.Options{Verbosity: v})
}

// nicsReport is `ipamctl nics -o json|yaml`.
type nicsReport struct {
	NICs          []nicdiscovery.NIC       `json:"nics"`
	GPUs          []nicdiscovery.GPU       `json:"gpus,omitempty"`
	NetdevsHidden bool                     `json:"netdevsHidden,omitempty"`
	Labels        []nicdiscovery.PortLabel `json:"labels,omitempty"`
	// View is where the NICs were read from and the rail map applied.
	View *NICView `json:"view,omitempty"`
}

func nicsCommand() *cobra.Command {
	var f scanFlags
	var output, railConfig string
	var live bool
	cmd := &cobra.Command{
		Use:   "nics",
		Short: "List this node's NVIDIA NIC functions (PFs and VFs) from sysfs, their links from netlink, and their labels",
		Long: "nics lists the node's NVIDIA NIC functions (sysfs), and, from netlink when the scan is live (the\n" +
			"node's own /, or --live), each port's link state and the VFs as their PF reports them. Each port\n" +
			"shows the label it is published under and the rails that name it. Each function shows its PCIe\n" +
			"root complex and the NVIDIA GPUs behind the same PCIe switch (index and PCI address); a table of\n" +
			"the GPUs follows, with the NICs behind each one's switch and those sharing only its root complex.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			v, err := f.view(cmd, railConfig)
			if err != nil {
				return err
			}
			rails := v.rails
			opts := nicdiscovery.Options{Root: v.SysfsRoot, Logger: stderrLogger(cmd.ErrOrStderr(), f.verbose)}
			if cmd.Flags().Changed("live") {
				opts.Live = &live
			}
			inv, err := nicdiscovery.Scan(cmd.Context(), opts)
			if err != nil {
				return err
			}
			r := nicsReport{NICs: inv.NICs, GPUs: inv.GPUs, NetdevsHidden: inv.NetdevsHidden,
				Labels: nicdiscovery.PortLabels(inv, rails), View: v}
			if output != "table" {
				return writeReport(cmd.OutOrStdout(), output, r, nil)
			}
			if inv.NetdevsHidden {
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: note: this network namespace shows none of the NICs' netdevs "+
					"(a pod without hostNetwork?): Ethernet ports are named from their RDMA GID table, InfiniBand ports have none")
			}
			return nicsTables(cmd.OutOrStdout(), r)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	cmd.Flags().BoolVar(&live, "live", false, "read link state from netlink (default: only when --sysfs-root is /)")
	cmd.Flags().StringVar(&railConfig, "rail-config", "", "rail map (YAML: rail name to netdev names or PCI addresses), as ipam-node's "+
		"--rail-config (default: the running daemon's)")
	return cmd
}

// nicsTables prints the functions, then, where netlink answered, every port's link
// and every PF's VFs.
func nicsTables(w io.Writer, r nicsReport) error {
	if err := nicsTable(w, r.NICs); err != nil {
		return err
	}
	if len(r.GPUs) > 0 {
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
		if err := gpusTable(w, r.GPUs, r.NICs); err != nil {
			return err
		}
	}
	labelOf := map[string]nicdiscovery.PortLabel{}
	for _, l := range r.Labels {
		labelOf[l.PCIAddress+"/"+strconv.Itoa(l.Port)] = l
	}
	var links, vfs bytes.Buffer
	lt := tabwriter.NewWriter(&links, 0, 4, 2, ' ', 0)
	fmt.Fprintln(lt, "NETDEV\tPCI\tPORT\tADMIN\tOPER\tCARRIER\tMTU\tMAC\tSPEED\tADDRESSES\tLABEL\tRAILS")
	vt := tabwriter.NewWriter(&vfs, 0, 4, 2, ' ', 0)
	fmt.Fprintln(vt, "PF\tVF\tMAC\tVLAN\tQOS\tSPOOFCHK\tTRUST\tLINK")
	anyLink, anyVF := false, false
	for _, n := range r.NICs {
		for _, p := range n.Ports {
			if p.Netdev == "" || p.AdminUp == nil {
				continue
			}
			anyLink = true
			l := labelOf[n.PCIAddress+"/"+strconv.Itoa(p.Number)]
			fmt.Fprintf(lt, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Netdev, n.PCIAddress, p.Number, upDown(*p.AdminUp),
				dash(p.OperState), yesNo(*p.Carrier), p.MTU, dash(p.MAC), speed(p.SpeedMbps), dash(strings.Join(p.Addresses, ",")),
				dash(l.Key), dash(strings.Join(l.Rails, ",")))
		}
		pf := n.PCIAddress
		if len(n.Netdevs) > 0 {
			pf = n.Netdevs[0]
		}
		for _, v := range n.VFStates {
			anyVF = true
			fmt.Fprintf(vt, "%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\n", pf, v.Index, dash(v.MAC), v.VLAN, v.QoS,
				onOff(v.SpoofCheck), onOff(v.Trust), v.LinkState)
		}
	}
	for _, t := range []struct {
		any bool
		tw  *tabwriter.Writer
		buf *bytes.Buffer
	}{{anyLink, lt, &links}, {anyVF, vt, &vfs}} {
		if !t.any {
			continue
		}
		if err := t.tw.Flush(); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "\n%s", t.buf.String()); err != nil {
			return err
		}
	}
	return nil
}

func upDown(b bool) string {
	if b {
		return "up"
	}
	return "down"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func nicsTable(w io.Writer, nics []nicdiscovery.NIC) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PCI\tMODEL\tFN\tPF\tDRIVER\tNUMA\tNETDEVS\tLINK\tSPEED\tRDMA\tVFS\tSTATE\tESWITCH\tROOT\tGPUS")
	for _, n := range nics {
		numa, vfs := "-", "-"
		if n.NUMANode >= 0 {
			numa = strconv.Itoa(n.NUMANode)
		}
		if n.SRIOVTotalVFs > 0 {
			vfs = fmt.Sprintf("%d/%d", n.SRIOVNumVFs, n.SRIOVTotalVFs)
		}
		var gpus []string
		for _, g := range n.GPUs {
			if g.Shares == nicdiscovery.GPUSharesSwitch {
				gpus = append(gpus, fmt.Sprintf("%d (%s)", g.Index, g.PCIAddress))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.PCIAddress, n.Model, n.Function,
			dash(n.PhysFn), dash(n.Driver), numa, dash(strings.Join(n.Netdevs, ",")), dash(linkLayers(n)), speed(n.SpeedMbps),
			dash(strings.Join(n.RDMADevices, ",")), vfs, dash(n.PortState), dash(n.EswitchMode), dash(n.PCIeRoot),
			dash(strings.Join(gpus, ",")))
	}
	return tw.Flush()
}

// gpusTable lists the GPUs, each with the NIC PFs behind its PCIe switch and
// those that share only its root complex (VFs are where their PF is).
func gpusTable(w io.Writer, gpus []nicdiscovery.GPU, nics []nicdiscovery.NIC) error {
	near := map[string]map[string][]string{} // GPU address → shares → NICs
	for _, n := range nics {
		if n.Function != nicdiscovery.FunctionPF && n.PhysFn != "" {
			continue
		}
		name := n.PCIAddress
		if len(n.Netdevs) > 0 {
			name = strings.Join(n.Netdevs, ",")
		} else if len(n.RDMADevices) > 0 {
			name = n.RDMADevices[0]
		}
		for _, g := range n.GPUs {
			if near[g.PCIAddress] == nil {
				near[g.PCIAddress] = map[string][]string{}
			}
			near[g.PCIAddress][g.Shares] = append(near[g.PCIAddress][g.Shares], name)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tPCI\tMODEL\tDRIVER\tNUMA\tROOT\tSWITCH-NICS\tROOT-NICS")
	for _, g := range gpus {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = strconv.Itoa(g.NUMANode)
		}
		n := near[g.PCIAddress]
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, g.PCIAddress, g.Model, dash(g.Driver), numa,
			dash(g.PCIeRoot), dash(strings.Join(n[nicdiscovery.GPUSharesSwitch], ",")),
			dash(strings.Join(n[nicdiscovery.GPUSharesRoot], ",")))
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
	var railConfig, output string
	cmd := &cobra.Command{
		Use:   "labels",
		Short: "Print the nic.hwipam.io node labels ipam-node would publish for this node, one key=value per line",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			v, err := f.view(cmd, railConfig)
			if err != nil {
				return err
			}
			switch v.NICLabels {
			case "off":
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: note: the daemon runs with --nic-labels=off: it publishes none of these")
			case "nodefeature":
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: note: the daemon publishes these in an NFD NodeFeature object (--nic-labels=nodefeature)")
			}
			inv, err := nicdiscovery.Scan(cmd.Context(), nicdiscovery.Options{Root: v.SysfsRoot, Logger: stderrLogger(cmd.ErrOrStderr(), f.verbose)})
			if err != nil {
				return err
			}
			labels, warnings := nicdiscovery.Labels(inv, v.rails)
			for _, w := range warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: warning:", w)
			}
			if output != "table" {
				return writeReport(cmd.OutOrStdout(), output, labels, nil)
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
	cmd.Flags().StringVar(&railConfig, "rail-config", "", "rail map (YAML: rail name to netdev names or PCI addresses), as ipam-node's "+
		"--rail-config (default: the running daemon's)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table (key=value lines), json or yaml (a map)")
	return cmd
}
