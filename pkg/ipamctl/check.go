package ipamctl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/store"
)

// Severities of a finding; ok and info are not problems.
const (
	SeverityOK      = "ok"
	SeverityInfo    = "info"
	SeverityWarning = "warning"
	SeverityError   = "error"
)

// Finding is one result of `ipamctl check`.
type Finding struct {
	Severity string `json:"severity"`
	// Check names the check: daemon, store, plugin, config, pool, block, rail,
	// capacity, stale, gateway, api; dra, slices and claim for ipam-node's DRA
	// driver.
	Check   string `json:"check"`
	Subject string `json:"subject,omitempty"`
	Message string `json:"message"`
	// Fix says what to do about a warning or an error.
	Fix string `json:"fix,omitempty"`
}

// CheckReport is what `ipamctl check` prints.
type CheckReport struct {
	Node     string    `json:"node,omitempty"`
	Findings []Finding `json:"findings"`
	Errors   int       `json:"errors"`
	Warnings int       `json:"warnings"`
	// Unreachable names what check could not reach (ipam-node, the API server):
	// the findings are then incomplete, and the exit code is 2.
	Unreachable []string `json:"unreachable,omitempty"`
	// View is where the NICs were read from and the rail map applied: the
	// daemon's unless flags say otherwise.
	View *NICView `json:"view,omitempty"`
}

// ErrProblemsFound is returned by check when it found warnings or errors (exit 1).
var ErrProblemsFound = errors.New("problems found")

type checkFlags struct {
	nodeFlags
	storeFile, binDir, confDir string
	sysfsRoot, railConfig      string
	kubeconfig, nodeName, ns   string
	probe, cluster             bool
	netnsDirs                  []string
}

func checkCommand() *cobra.Command {
	var f checkFlags
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check why a pod on this node may get no address: daemon, store, plugin, pools, rails, gateways",
		Long: "check runs every health check of this node's hwipam and prints one line per finding, with its\n" +
			"severity and what to do. The daemon tells where its store, plugin and config are, where it reads the\n" +
			"NICs from (--sysfs-root) and its rail map (--rail-config); the flags override.\n" +
			"With API access (--kubeconfig, or in a pod) it also checks that every pool selecting this node has a\n" +
			"block here, that the rail NICs those pools select are present and up, and that each allocation's pod\n" +
			"still exists. When the daemon runs the DRA driver (--dra), it checks that the kubelet registered it, that\n" +
			"its ResourceSlices are published, and where each prepared claim's netdev is. Exit code: 0 healthy, 1 problems found, 2 usage error or ipam-node or the API server\n" +
			"could not be reached (the findings are printed all the same).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(f.output); err != nil {
				return err
			}
			r := f.run(cmd.Context())
			if err := writeReport(cmd.OutOrStdout(), f.output, r, checkTable); err != nil {
				return err
			}
			if len(r.Unreachable) > 0 {
				return &ConnectionError{fmt.Errorf("could not reach %s: %d error(s), %d warning(s)",
					strings.Join(r.Unreachable, " and "), r.Errors, r.Warnings)}
			}
			if r.Errors+r.Warnings > 0 {
				return fmt.Errorf("%w: %d error(s), %d warning(s)", ErrProblemsFound, r.Errors, r.Warnings)
			}
			return nil
		},
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.storeFile, "store-file", "", "the daemon's store (default: where the daemon says, else /var/lib/cni/nv-ipam/store)")
	fl.StringVar(&f.binDir, "cni-bin-dir", "", "where the plugin is installed (default: where the daemon says, else /opt/cni/bin)")
	fl.StringVar(&f.confDir, "cni-conf-dir", "", "where nv-ipam.conf is (default: where the daemon says, else /etc/cni/net.d/nv-ipam.d)")
	fl.StringVar(&f.sysfsRoot, "sysfs-root", "", "directory that contains sys/, for the rail NICs (default: the daemon's, else /)")
	fl.StringVar(&f.railConfig, "rail-config", "", "rail map, as ipam-node's --rail-config (default: the daemon's)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for the API checks (default: $KUBECONFIG, or in-cluster in a pod)")
	fl.StringVar(&f.nodeName, "node-name", "", "this node's name (default: the daemon's)")
	fl.StringVar(&f.ns, "ippools-namespace", "", "namespace of the pools (default: the daemon's)")
	fl.BoolVar(&f.cluster, "cluster", false, "also check the cluster's NetworkAttachmentDefinitions: each names an existing pool "+
		"that selects the nodes where its master netdev exists, or (ipam.rail) finds its rail's pools, with a block on each node with the rail")
	fl.StringSliceVar(&f.netnsDirs, "netns-dir", DefaultNetNSDirs, "where to look for pods' network namespaces, for the "+
		"netdevs of DRA claims (the runtime's netns directories)")
	fl.BoolVar(&f.probe, "probe", false, "resolve each pool's gateway actively (ARP/ND from this node, only inside the pool's own subnet)")
	return cmd
}

// checker accumulates findings.
type checker struct {
	r *CheckReport
}

func (c *checker) add(sev, check, subject, msg, fix string) {
	c.r.Findings = append(c.r.Findings, Finding{Severity: sev, Check: check, Subject: subject, Message: msg, Fix: fix})
	switch sev {
	case SeverityError:
		c.r.Errors++
	case SeverityWarning:
		c.r.Warnings++
	}
}

// apiError adds an error finding about the API server, which is also marked
// unreachable when err carries no answer from it (not a refusal or a NotFound).
func (c *checker) apiError(subject string, err error, msg, fix string) {
	c.add(SeverityError, "api", subject, msg, fix)
	var answered apierrors.APIStatus
	if !errors.As(err, &answered) && !slices.Contains(c.r.Unreachable, "the API server") {
		c.r.Unreachable = append(c.r.Unreachable, "the API server")
	}
}

// daemonState is what the daemon answered.
type daemonState struct {
	info     *infov1.GetInfoResponse
	pools    []*infov1.PoolInfo
	allocs   []*infov1.AllocationRecord
	failures []*infov1.Failure
	// nics is the daemon's NIC inventory; nil from a daemon without ListNICs.
	nics *infov1.ListNICsResponse
}

func (f *checkFlags) run(ctx context.Context) *CheckReport {
	c := &checker{r: &CheckReport{Findings: []Finding{}}}
	d := f.checkDaemon(ctx, c)
	info := &infov1.GetInfoResponse{}
	if d != nil {
		info = d.info
	}
	pick := func(flag, fromDaemon, def string) string {
		switch {
		case flag != "":
			return flag
		case fromDaemon != "":
			return fromDaemon
		}
		return def
	}
	storeFile := pick(f.storeFile, info.GetStoreFile(), "/var/lib/cni/nv-ipam/store")
	binDir := pick(f.binDir, info.GetCniBinDir(), "/opt/cni/bin")
	confDir := pick(f.confDir, info.GetCniConfDir(), "/etc/cni/net.d/nv-ipam.d")
	c.r.Node = pick(f.nodeName, info.GetNodeName(), "")
	var daemonErr error
	if d == nil {
		daemonErr = errors.New("ipam-node did not answer")
		info = nil
	}
	view, err := newNICView(info, daemonErr, f.sysfsRoot, f.railConfig)
	if err != nil {
		c.add(SeverityWarning, "rail", view.RailConfig, err.Error(), "fix the rail map; the rail checks run without it")
	}
	c.r.View = view
	c.add(SeverityInfo, "view", "", view.String(), "")
	f.checkStore(ctx, c, storeFile, d)
	checkPlugin(c, binDir, info.GetPluginSha256())
	checkConfig(c, confDir, info.GetConfSha256())
	if d != nil {
		checkPools(c, d)
		checkFailures(c, d.failures, time.Now())
		f.checkGateways(ctx, c, d)
	}
	dra := readDRA(c, storeFile)
	if dra != nil {
		checkDRADriver(c, dra, time.Now())
		checkClaims(c, dra, storeFile, f.netnsDirs)
	}
	f.checkAPI(ctx, c, d, view, pick(f.ns, info.GetPoolsNamespace(), "kube-system"), dra)
	return c.r
}

func (f *checkFlags) checkDaemon(ctx context.Context, c *checker) *daemonState {
	var d daemonState
	err := f.call(ctx, func(ctx context.Context, cl infov1.NodeInfoServiceClient) error {
		info, err := cl.GetInfo(ctx, &infov1.GetInfoRequest{})
		if err != nil {
			return err
		}
		pools, err := cl.ListPools(ctx, &infov1.ListPoolsRequest{})
		if err != nil {
			return err
		}
		allocs, err := cl.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
		if err != nil {
			return err
		}
		failures, err := cl.ListFailures(ctx, &infov1.ListFailuresRequest{})
		if err != nil {
			return err
		}
		nics, err := daemonNICs(ctx, cl)
		if err != nil {
			return err
		}
		d = daemonState{info: info, pools: pools.GetPools(), allocs: allocs.GetAllocations(), failures: failures.GetFailures(), nics: nics}
		return nil
	})
	if err != nil {
		c.add(SeverityError, "daemon", f.socket, err.Error(),
			"CNI ADDs on this node fail until ipam-node serves: check its pod (kubectl -n <ns> get pods -o wide, kubectl logs)")
		c.r.Unreachable = append(c.r.Unreachable, "ipam-node")
		return nil
	}
	c.add(SeverityOK, "daemon", f.socket, fmt.Sprintf("ipam-node %s serves %d pool(s), %d allocation(s)",
		dash(d.info.GetVersion()), len(d.pools), len(d.allocs)), "")
	return &d
}

func allocKey(pool, cid, ifName string) string { return pool + "|" + cid + "|" + ifName }

func (f *checkFlags) checkStore(ctx context.Context, c *checker, path string, d *daemonState) {
	var snap map[string]*store.PoolState
	var diff []string
	for attempt := range 3 {
		var err error
		if snap, err = store.Snapshot(path); err != nil {
			c.add(SeverityError, "store", path, err.Error(), "see docs/troubleshooting.md, \"The store\"")
			return
		}
		if d == nil {
			break
		}
		diff = storeDiff(snap, d.allocs)
		if len(diff) == 0 || attempt == 2 {
			break
		}
		// An allocation committed between the two reads: read both again.
		time.Sleep(200 * time.Millisecond)
		if err := f.call(ctx, func(ctx context.Context, cl infov1.NodeInfoServiceClient) error {
			resp, err := cl.ListAllocations(ctx, &infov1.ListAllocationsRequest{})
			if err == nil {
				d.allocs = resp.GetAllocations()
			}
			return err
		}); err != nil {
			break
		}
	}
	n := 0
	for _, p := range snap {
		n += len(p.Allocations)
	}
	if len(diff) > 0 {
		c.add(SeverityWarning, "store", path, fmt.Sprintf("the store and the daemon disagree on %d allocation(s): %s",
			len(diff), strings.Join(diff[:min(len(diff), 5)], "; ")),
			"is --store-file the daemon's store? If it is, restart ipam-node: it loads the store at start")
		return
	}
	c.add(SeverityOK, "store", path, fmt.Sprintf("readable and consistent, %d allocation(s)", n), "")
}

// storeDiff lists the allocations one of store and daemon has and the other lacks.
func storeDiff(snap map[string]*store.PoolState, allocs []*infov1.AllocationRecord) []string {
	inStore := map[string]string{}
	for key, p := range snap {
		for _, a := range p.Allocations {
			inStore[allocKey(key, a.ContainerID, a.IfName)] = a.IP
		}
	}
	var diff []string
	for _, a := range allocs {
		k := allocKey(a.GetPool(), a.GetContainerId(), a.GetIfName())
		ip, _, _ := strings.Cut(a.GetIp(), "/")
		switch sip, ok := inStore[k]; {
		case !ok:
			diff = append(diff, fmt.Sprintf("%s %s not in the store", a.GetPool(), ip))
		case sip != ip:
			diff = append(diff, fmt.Sprintf("%s %s/%s: %s in the store, %s in the daemon", a.GetPool(), a.GetContainerId(), a.GetIfName(), sip, ip))
		}
		delete(inStore, k)
	}
	for k, ip := range inStore {
		pool, _, _ := strings.Cut(k, "|")
		diff = append(diff, fmt.Sprintf("%s %s only in the store", pool, ip))
	}
	slices.Sort(diff)
	return diff
}

func checkPlugin(c *checker, binDir, wantSum string) {
	path := filepath.Join(binDir, "nv-ipam")
	fi, err := os.Stat(path)
	if err != nil {
		c.add(SeverityError, "plugin", path, fmt.Sprintf("the nv-ipam plugin is not installed: %v", err),
			"ipam-node installs it at start into its --cni-bin-dir: is that the runtime's CNI bin dir? Restart ipam-node")
		return
	}
	if fi.Mode()&0o111 == 0 {
		c.add(SeverityError, "plugin", path, "the plugin is not executable", "restart ipam-node, which reinstalls it")
		return
	}
	if wantSum == "" {
		c.add(SeverityOK, "plugin", path, "installed (the daemon did not install it: not compared)", "")
		return
	}
	file, err := os.Open(path)
	if err != nil {
		c.add(SeverityError, "plugin", path, err.Error(), "")
		return
	}
	defer file.Close()
	h := sha256.New()
	if _, err := io.Copy(h, file); err != nil {
		c.add(SeverityError, "plugin", path, err.Error(), "")
		return
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != wantSum {
		c.add(SeverityWarning, "plugin", path, "the installed plugin is not the one this daemon installed (another version?)",
			"restart ipam-node to reinstall its plugin; check that no other DaemonSet installs nv-ipam into this directory")
		return
	}
	c.add(SeverityOK, "plugin", path, "installed, and the one this daemon installed", "")
}

// checkConfig checks nv-ipam.conf: there, parsed, the one the daemon wrote
// (wantSum, when it says), and naming a socket that answers.
func checkConfig(c *checker, confDir, wantSum string) {
	path := filepath.Join(confDir, "nv-ipam.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		c.add(SeverityError, "config", path, fmt.Sprintf("nv-ipam.conf is missing: %v", err),
			"ipam-node writes it at start into --cni-conf-dir; the plugin reads it from its confDir")
		return
	}
	var conf struct {
		DaemonSocket string `json:"daemonSocket"`
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		c.add(SeverityError, "config", path, fmt.Sprintf("nv-ipam.conf does not parse: %v", err), "restart ipam-node, which rewrites it")
		return
	}
	if sum := sha256.Sum256(b); wantSum != "" && hex.EncodeToString(sum[:]) != wantSum {
		c.add(SeverityWarning, "config", path, "nv-ipam.conf is not the one this daemon wrote (edited by hand, or written by another daemon?)",
			"restart ipam-node, which rewrites it; check that no other DaemonSet writes nv-ipam.conf into this directory")
	}
	sock, ok := strings.CutPrefix(conf.DaemonSocket, "unix://")
	if conf.DaemonSocket == "" || !ok {
		c.add(SeverityWarning, "config", path, fmt.Sprintf("daemonSocket %q is not a unix:// socket", conf.DaemonSocket),
			"set ipam-node's --cni-daemon-socket")
		return
	}
	if _, err := os.Stat(sock); err != nil {
		if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
			// In a pod, the socket is where the pod mounts it; the plugin runs on
			// the host, whose path may differ.
			c.add(SeverityInfo, "config", path, fmt.Sprintf("the plugin calls %s, which is not at that path in this pod: "+
				"run ipamctl check on the host to see whether the host has it", conf.DaemonSocket), "")
			return
		}
		c.add(SeverityError, "config", path, fmt.Sprintf("the plugin calls %s, which does not exist: %v", conf.DaemonSocket, err),
			"ipam-node's --cni-daemon-socket must name its --bind-address socket as the host sees it")
		return
	}
	// The plugin's compact endpoint beside the socket: without it the plugin still
	// works, over gRPC, but pays more per call.
	fastPath := ipamwire.FastSocketPath(sock)
	wc, err := ipamwire.Dial(conf.DaemonSocket, time.Now().Add(5*time.Second))
	switch {
	case err != nil:
		c.add(SeverityError, "config", path, fmt.Sprintf("the plugin calls %s, which does not answer: %v", conf.DaemonSocket, err),
			"check that ipam-node runs and serves that socket")
		return
	case wc.Transport() != ipamwire.TransportFast:
		_ = wc.Close()
		c.add(SeverityInfo, "config", path, fmt.Sprintf("the plugin calls %s over gRPC: nothing serves its compact endpoint %s",
			conf.DaemonSocket, fastPath), "ipam-node serves it unless --fast-endpoint=false (versions before it do not); CNI calls work either way, a little slower")
		return
	}
	_ = wc.Close()
	c.add(SeverityOK, "config", path, fmt.Sprintf("the plugin calls %s (compact endpoint %s)", conf.DaemonSocket, fastPath), "")
}

func checkPools(c *checker, d *daemonState) {
	for _, p := range d.pools {
		switch {
		case !p.GetActive() && p.GetAllocated() == 0:
			// A pool no longer giving this node a block: nothing is held. The daemon
			// forgets a pool deleted from the API server once it holds nothing, so this
			// is a pool that still exists (or one deleted while the daemon cannot
			// list the pools). Whether it should give this node a block is the API
			// check's (block).
			c.add(SeverityInfo, "pool", p.GetKey(), "no block on this node any more, nothing held; the pool still exists "+
				"(the daemon forgets a deleted pool at its next pool listing once it holds nothing)", "")
		case !p.GetActive():
			c.add(SeverityWarning, "block", p.GetKey(), fmt.Sprintf("no active block on this node, %d allocation(s) kept from "+
				"the last one; new allocations from it are refused", p.GetAllocated()),
				"the pool no longer gives this node a block: check the pool's nodeSelector and status (kubectl get ippool -o yaml); "+
					"the kept addresses go when their pods do (and with the last of them the pool, if it was deleted)")
		case p.GetFree() == "0":
			c.add(SeverityError, "pool", p.GetKey(), fmt.Sprintf("block %s-%s is full: %d allocated", p.GetStart(), p.GetEnd(),
				p.GetAllocated()), "raise perNodeBlockSize (or the prefix), or find allocations whose pods are gone")
		default:
			c.add(SeverityOK, "pool", p.GetKey(), fmt.Sprintf("block %s-%s, %d used, %s free", p.GetStart(), p.GetEnd(),
				p.GetAllocated(), p.GetFree()), "")
		}
		if o := p.GetOrphans(); o > 0 && p.GetActive() {
			c.add(SeverityWarning, "pool", p.GetKey(), fmt.Sprintf("%d allocation(s) outside the current block (the pool was "+
				"edited while they were live)", o), "they stay reserved until their pods go; see docs/pools.md, \"Editing a pool that is in use\"")
		}
	}
}

// failureWindow is how far back check reports failed allocations.
const failureWindow = 15 * time.Minute

// checkFailures reports the Allocate calls that failed lately, one per pod,
// interface and error (the runtime retries a failed sandbox over and over).
func checkFailures(c *checker, failures []*infov1.Failure, now time.Time) {
	seen := map[string]bool{}
	for _, fl := range failures { // newest first
		at := time.Unix(fl.GetTime(), 0)
		key := fl.GetPodNamespace() + "/" + fl.GetPodName() + "|" + fl.GetIfName() + "|" + fl.GetMessage()
		if now.Sub(at) > failureWindow || seen[key] {
			continue
		}
		seen[key] = true
		fix := "see the error; docs/troubleshooting.md lists the usual causes"
		switch fl.GetCode() {
		case "NotFound":
			fix = "the pool does not exist, or gives this node no block: check the NAD's poolName and `ipamctl pools --cluster`"
		case "ResourceExhausted":
			fix = "the node's block is full: raise perNodeBlockSize, or find allocations whose pods are gone"
		case "InvalidArgument":
			fix = "the network's ipam config is wrong: check the NAD"
		}
		pod := fl.GetPodNamespace() + "/" + fl.GetPodName()
		if fl.GetPodName() == "" {
			pod = "container " + fl.GetContainerId()
		}
		c.add(SeverityWarning, "failure", pod, fmt.Sprintf("an address for %s (%s, pool %s) was refused %s ago: %s: %s", pod,
			fl.GetIfName(), strings.Join(fl.GetPools(), ","), now.Sub(at).Round(time.Second), fl.GetCode(), fl.GetMessage()), fix)
	}
}

// checkGateways looks each active pool's gateway up in the neighbour table of
// the link this node has an address of the pool's subnet on; --probe resolves it.
func (f *checkFlags) checkGateways(ctx context.Context, c *checker, d *daemonState) {
	for _, p := range d.pools {
		if !p.GetActive() || p.GetGateway() == "" {
			continue
		}
		gw, err1 := netip.ParseAddr(p.GetGateway())
		prefix, err2 := netip.ParsePrefix(p.GetPrefix())
		if err1 != nil || err2 != nil || !prefix.Contains(gw) {
			continue
		}
		link, ok := linkInPrefix(prefix)
		if !ok {
			c.add(SeverityInfo, "gateway", p.GetKey(), fmt.Sprintf("no address of this node is in %s: gateway %s is "+
				"reachable from pods only, not checked here", prefix, gw), "")
			continue
		}
		if f.probe {
			probe(ctx, gw)
		}
		state := neighState(link, gw, f.probe)
		switch state {
		case "reachable", "stale", "delay", "probe", "permanent", "noarp":
			c.add(SeverityOK, "gateway", p.GetKey(), fmt.Sprintf("gateway %s answers on %s (%s)", gw, link.Attrs().Name, state), "")
		case "failed", "incomplete":
			c.add(SeverityError, "gateway", p.GetKey(), fmt.Sprintf("gateway %s does not answer on %s (neighbour %s)", gw,
				link.Attrs().Name, state), "check the gateway on the rail's switch and the pool's gateway field")
		default:
			msg := fmt.Sprintf("gateway %s is not in %s's neighbour table yet", gw, link.Attrs().Name)
			if f.probe {
				msg = fmt.Sprintf("gateway %s did not answer on %s within 3s", gw, link.Attrs().Name)
				c.add(SeverityError, "gateway", p.GetKey(), msg, "check the gateway on the rail's switch and the pool's gateway field")
				continue
			}
			c.add(SeverityInfo, "gateway", p.GetKey(), msg, "run with --probe to resolve it")
		}
	}
}

// linkInPrefix is the link holding an address of this node in prefix.
func linkInPrefix(prefix netip.Prefix) (netlink.Link, bool) {
	family := netlink.FAMILY_V4
	if prefix.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(nil, family)
	if err != nil {
		return nil, false
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !prefix.Contains(ip.Unmap()) {
			continue
		}
		if l, err := netlink.LinkByIndex(a.LinkIndex); err == nil {
			return l, true
		}
	}
	return nil, false
}

// probe makes the kernel resolve gw: a datagram to the discard port needs its
// link-layer address first.
func probe(ctx context.Context, gw netip.Addr) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", netip.AddrPortFrom(gw, 9).String())
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("hwipam check"))
}

// neighState is the neighbour entry's state for ip on link ("" when none); with
// wait, it waits up to 3s for resolution to finish.
func neighState(link netlink.Link, ip netip.Addr, wait bool) string {
	deadline := time.Now().Add(3 * time.Second)
	for {
		state := ""
		family := netlink.FAMILY_V4
		if ip.Is6() {
			family = netlink.FAMILY_V6
		}
		neighs, _ := netlink.NeighList(link.Attrs().Index, family)
		for _, n := range neighs {
			if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
				state = neighStateName(n.State)
			}
		}
		if !wait || (state != "" && state != "incomplete" && state != "none") || time.Now().After(deadline) {
			return state
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkAPI compares the cluster's view with the node's: pools selecting this node
// have a block and the daemon serves it, the rail NICs they select are here and
// up, blocks hold the VFs of their rail, and allocations' pods exist.
func (f *checkFlags) checkAPI(ctx context.Context, c *checker, d *daemonState, view *NICView, ns string, dra *draState) {
	if f.kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		c.add(SeverityInfo, "api", "", "the pool, rail and stale-allocation checks need the API server: give --kubeconfig", "")
		return
	}
	if c.r.Node == "" {
		c.add(SeverityWarning, "api", "", "this node's name is not known (the daemon did not say)", "give --node-name")
		return
	}
	cl, err := newClusterClient(f.kubeconfig, f.timeout)
	if err != nil {
		c.apiError("", err, err.Error(), "check --kubeconfig (in a pod: the service account's RBAC)")
		return
	}
	var node corev1.Node
	if err := cl.Get(ctx, client.ObjectKey{Name: c.r.Node}, &node); err != nil {
		c.apiError("", err, fmt.Sprintf("reading node %s: %v", c.r.Node, err), "check --kubeconfig and --node-name")
		return
	}
	c.add(SeverityOK, "api", "", "node "+c.r.Node+" read", "")
	var ipPools v1alpha1.IPPoolList
	var cidrPools v1alpha1.CIDRPoolList
	if err := cl.List(ctx, &ipPools, client.InNamespace(ns)); err != nil {
		c.apiError(ns, err, fmt.Sprintf("listing IPPools: %v", err), "")
		return
	}
	if err := cl.List(ctx, &cidrPools, client.InNamespace(ns)); err != nil && !meta.IsNoMatchError(err) {
		c.apiError(ns, err, fmt.Sprintf("listing CIDRPools: %v", err), "")
		return
	}
	// This node's blocks of pools above ipam-controller's threshold are in its
	// NodeIPAM only.
	fillFromNodeIPAMs(ctx, cl, ns, c.r.Node, ipPools.Items, cidrPools.Items)
	served := map[string]*infov1.PoolInfo{}
	if d != nil {
		for _, p := range d.pools {
			served[p.GetKey()] = p
		}
	}
	var inv *nicdiscovery.Inventory
	scan := func() *nicdiscovery.Inventory {
		if inv == nil {
			var err error
			live := true // link state from netlink, also for a tree mounted from the host
			if inv, err = nicdiscovery.Scan(ctx, nicdiscovery.Options{Root: view.SysfsRoot, Live: &live}); err != nil {
				c.add(SeverityWarning, "rail", view.SysfsRoot, fmt.Sprintf("cannot scan the NICs: %v", err), "check --sysfs-root")
				inv = &nicdiscovery.Inventory{}
			}
		}
		return inv
	}
	var daemonNICs *infov1.ListNICsResponse
	if d != nil {
		daemonNICs = d.nics
	}
	check := func(kind, name string, sel *corev1.NodeSelector, hasBlock bool, ready *string) {
		key := v1alpha1.PoolKey(kind, name)
		if sel != nil {
			s, err := nodeaffinity.NewNodeSelector(sel)
			if err != nil || !s.Match(&node) {
				return
			}
		}
		switch p := served[key]; {
		case !hasBlock:
			msg := fmt.Sprintf("%s %s/%s selects this node but gives it no block", kind, ns, name)
			if ready != nil {
				msg += ": " + *ready
			}
			c.add(SeverityError, "block", key, msg, "see the pool's conditions (kubectl describe); is ipam-controller running?")
		case p == nil || !p.GetActive():
			c.add(SeverityError, "block", key, fmt.Sprintf("%s %s/%s gives this node a block the daemon does not serve", kind, ns, name),
				"ipam-node's pool sync lags or fails: see its log (RBAC on ippools/cidrpools, --ippools-namespace)")
		}
		if sel != nil {
			checkRails(c, key, sel, scan(), view, daemonNICs, served[key])
		}
	}
	for i := range ipPools.Items {
		p := &ipPools.Items[i]
		check(v1alpha1.KindIPPool, p.Name, p.Spec.NodeSelector, slices.ContainsFunc(p.Status.Allocations,
			func(a v1alpha1.Allocation) bool { return a.NodeName == c.r.Node }), readyMessage(p.Status.Conditions))
	}
	for i := range cidrPools.Items {
		p := &cidrPools.Items[i]
		check(v1alpha1.KindCIDRPool, p.Name, p.Spec.NodeSelector, slices.ContainsFunc(p.Status.Allocations,
			func(a v1alpha1.CIDRPoolAllocation) bool { return a.NodeName == c.r.Node }), readyMessage(p.Status.Conditions))
	}
	if d != nil {
		checkStale(ctx, c, cl, c.r.Node, d.allocs)
	}
	if dra != nil {
		checkSlicesAPI(ctx, c, cl, c.r.Node, dra)
	}
	if f.cluster {
		s, err := readCluster(ctx, cl, ns)
		if err != nil {
			c.apiError(ns, err, err.Error(), "")
			return
		}
		s.nadFindings(c)
		s.claimFindings(c)
		recordFindings(ctx, c, cl, ns, ipPools.Items, cidrPools.Items)
	}
}

func readyMessage(conds []metav1.Condition) *string {
	if cond := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); cond != nil && cond.Message != "" {
		return &cond.Message
	}
	return nil
}

// railKeys are the netdevs a nodeSelector requires by their nic.hwipam.io label,
// and the rails it requires by their nic.hwipam.io/rail.<name> label ("rail.<name>").
func railKeys(sel *corev1.NodeSelector) []string {
	var out []string
	for _, t := range sel.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			name, ok := strings.CutPrefix(e.Key, nicdiscovery.LabelPrefix)
			if !ok || e.Operator == corev1.NodeSelectorOpNotIn || e.Operator == corev1.NodeSelectorOpDoesNotExist {
				continue
			}
			if !strings.HasPrefix(name, "rail.") {
				name, _, _ = strings.Cut(name, ".")
			}
			switch name {
			case "present", "count", "rdma", "netdevs", "rail", "":
				continue
			}
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// checkRails checks the rail NICs a pool selects: present in inv (the view's
// scan) and up. Where the scan and the daemon's own inventory (daemon; nil when
// the daemon did not say) disagree on a NIC, the finding says both.
func checkRails(c *checker, key string, sel *corev1.NodeSelector, inv *nicdiscovery.Inventory, view *NICView,
	daemon *infov1.ListNICsResponse, served *infov1.PoolInfo) {
	labelled := map[string]nicdiscovery.PortLabel{}
	for _, l := range nicdiscovery.PortLabels(inv, view.rails) {
		labelled[strings.TrimPrefix(l.Key, nicdiscovery.LabelPrefix)] = l
		for _, r := range l.Rails {
			labelled["rail."+r] = l
		}
	}
	var daemonHas map[string]*infov1.NICPort
	if daemon != nil && daemon.GetError() == "" {
		daemonHas = map[string]*infov1.NICPort{}
		for _, p := range daemon.GetPorts() {
			daemonHas[p.GetName()] = p
			for _, r := range p.GetRails() {
				daemonHas["rail."+r] = p
			}
		}
	}
	scanned := fmt.Sprintf("ipamctl's scan of %s", view.SysfsRoot)
	for _, name := range railKeys(sel) {
		l, ok := labelled[name]
		dp, inDaemon := daemonHas[name]
		switch {
		case !ok && inDaemon && dp.GetKept():
			c.add(SeverityInfo, "rail", key, fmt.Sprintf("rail NIC %s (%s, port %d) is in the daemon's inventory, kept while its "+
				"netdev %s is outside the daemon's network namespace (in a pod or VM); %s does not show it: its link is not checked",
				name, dp.GetPciAddress(), dp.GetPort(), dash(dp.GetNetdev()), scanned), "")
			continue
		case !ok && inDaemon:
			c.add(SeverityWarning, "rail", key, fmt.Sprintf("rail NIC %s is in the daemon's inventory (%s, port %d, netdev %s), "+
				"but not in %s (%s): the two views differ", name, dp.GetPciAddress(), dp.GetPort(), dash(dp.GetNetdev()), scanned,
				view.String()), "run check without --sysfs-root and --rail-config to see what the daemon sees; compare `ipamctl nics`")
			continue
		case !ok:
			msg := fmt.Sprintf("the pool selects rail NIC %s, which this node does not have (its label is stale, or set by hand)", name)
			if daemonHas != nil {
				msg += fmt.Sprintf(": neither %s nor the daemon's inventory has it", scanned)
			}
			c.add(SeverityError, "rail", key, msg, "check the NIC (ipamctl nics) and the node's nic.hwipam.io labels")
			continue
		case daemonHas != nil && !inDaemon:
			c.add(SeverityWarning, "rail", key, fmt.Sprintf("rail NIC %s (%s) is in %s, but not in the daemon's inventory: the "+
				"daemon does not label it", name, l.PCIAddress, scanned), "compare the daemon's --sysfs-root and --rail-config "+
				"with this view (ipamctl check -o json: view), and the daemon's log")
		}
		i := slices.IndexFunc(inv.NICs, func(n nicdiscovery.NIC) bool { return n.PCIAddress == l.PCIAddress })
		n := inv.NICs[i]
		for _, p := range n.Ports {
			if p.Number != l.Port {
				continue
			}
			what := fmt.Sprintf("rail NIC %s (%s)", name, n.PCIAddress)
			if p.Netdev != "" && p.Netdev != name {
				what = fmt.Sprintf("rail NIC %s (%s, %s)", name, p.Netdev, n.PCIAddress)
			}
			if down := p.Carrier != nil && !*p.Carrier || p.OperState == "down" || p.PortState != "" && p.PortState != "ACTIVE"; down {
				c.add(SeverityError, "rail", key, what+" is down",
					"pods get addresses but no traffic flows: check the cable, the switch port and `ip link`")
			} else {
				c.add(SeverityOK, "rail", key, what+" is up", "")
			}
		}
		if served == nil || n.SRIOVNumVFs == 0 {
			continue
		}
		if size, err := parseUint(served.GetSize()); err == nil && size < uint64(n.SRIOVNumVFs) {
			c.add(SeverityWarning, "capacity", key, fmt.Sprintf("the block has %d addresses, rail NIC %s has %d VFs configured",
				size, name, n.SRIOVNumVFs), "pods beyond the block's size get no address: raise perNodeBlockSize")
		}
	}
}

func parseUint(s string) (uint64, error) {
	var v uint64
	_, err := fmt.Sscan(s, &v)
	return v, err
}

// checkStale finds allocations whose pod no longer exists (or is another pod of
// the same name; a static pod's mirror pod is the same pod): the cleaner releases
// them after three misses. It lists the pods
// bound to node once (metadata only, in pages), whatever the number of allocations,
// and gets by name only a pod the listing lacks (one not bound to this node, or
// gone), so a finding is what a get of each pod would say. When the listing is
// refused (a service account with get only) it gets every pod.
func checkStale(ctx context.Context, c *checker, cl client.Client, node string, allocs []*infov1.AllocationRecord) {
	onNode, err := listNodePods(ctx, cl, node)
	if err != nil {
		onNode = nil // refused or failed: every pod is read by name, as a listing would have been checked
	}
	stale := 0
	for _, a := range allocs {
		// A DRA claim's allocation is released by its claim's unprepare or
		// garbage collection, never for its pod (the claim check covers it).
		if a.GetPodName() == "" || isClaimAllocation(a.GetOwner()) {
			continue
		}
		pod, listed := onNode[a.GetPodNamespace()+"/"+a.GetPodName()]
		var err error
		if !listed {
			pod = &metav1.PartialObjectMetadata{}
			pod.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
			err = cl.Get(ctx, client.ObjectKey{Namespace: a.GetPodNamespace(), Name: a.GetPodName()}, pod)
		}
		gone := apierrors.IsNotFound(err) || err == nil && otherPod(pod, a.GetPodUid())
		if err != nil && !gone {
			c.add(SeverityWarning, "stale", a.GetPool(), fmt.Sprintf("reading pod %s/%s: %v", a.GetPodNamespace(), a.GetPodName(), err), "")
			continue
		}
		if gone {
			stale++
			c.add(SeverityWarning, "stale", a.GetPool(), fmt.Sprintf("%s is held by pod %s/%s, which no longer exists", a.GetIp(),
				a.GetPodNamespace(), a.GetPodName()), "ipam-node's cleaner releases it after three missed checks; "+
				"if it does not, check the daemon's RBAC on pods")
		}
	}
	if stale == 0 {
		c.add(SeverityOK, "stale", "", "every allocation's pod exists", "")
	}
}

// otherPod reports whether pod is not the one of the allocation's uid (an empty
// uid matches any). A static pod's allocation carries the UID the kubelet gave it,
// which its mirror pod names in kubernetes.io/config.mirror, as ipam-node's
// cleaner compares.
func otherPod(pod *metav1.PartialObjectMetadata, uid string) bool {
	if uid == "" || string(pod.UID) == uid {
		return false
	}
	mirrorOf, isMirror := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return !isMirror || mirrorOf != uid
}

// stalePageSize is how many pods one page of checkStale's listing holds.
const stalePageSize = 500

// listNodePods returns the metadata of the pods bound to node, by namespace/name.
func listNodePods(ctx context.Context, cl client.Client, node string) (map[string]*metav1.PartialObjectMetadata, error) {
	pods := map[string]*metav1.PartialObjectMetadata{}
	opts := []client.ListOption{client.MatchingFields{"spec.nodeName": node}, client.Limit(stalePageSize)}
	for cont := ""; ; {
		var page metav1.PartialObjectMetadataList
		page.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := cl.List(ctx, &page, append(opts, client.Continue(cont))...); err != nil {
			return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
		}
		for i := range page.Items {
			pods[page.Items[i].Namespace+"/"+page.Items[i].Name] = &page.Items[i]
		}
		if cont = page.Continue; cont == "" {
			return pods, nil
		}
	}
}

func checkTable(w io.Writer, v any) error {
	r := v.(*CheckReport)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEVERITY\tCHECK\tSUBJECT\tFINDING\tWHAT TO DO")
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Severity, f.Check, dash(f.Subject), f.Message, dash(f.Fix))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d error(s), %d warning(s)\n", r.Errors, r.Warnings)
	return err
}

// neighStateName names a neighbour state (NUD_*) as ip-neigh does, lower case.
func neighStateName(s int) string {
	for _, st := range []struct {
		bit  int
		name string
	}{{netlink.NUD_PERMANENT, "permanent"}, {netlink.NUD_NOARP, "noarp"}, {netlink.NUD_REACHABLE, "reachable"},
		{netlink.NUD_STALE, "stale"}, {netlink.NUD_DELAY, "delay"}, {netlink.NUD_PROBE, "probe"},
		{netlink.NUD_FAILED, "failed"}, {netlink.NUD_INCOMPLETE, "incomplete"}} {
		if s&st.bit != 0 {
			return st.name
		}
	}
	return "none"
}
