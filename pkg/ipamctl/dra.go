package ipamctl

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/store"
)

// What ipam-node's DRA driver (nic.hwipam.io, --dra) leaves beside the store
// for ipamctl: its checkpoint of prepared claims and its status file. Their
// allocations are in the store as every other, with network nic.hwipam.io,
// the claim's UID as container ID and "<request>:<device>" as interface.

// isClaimAllocation tells whether an allocation is a DRA claim's: by the
// daemon's ownership mark (store.Allocation.Owner), never by the network
// name, which a NAD may carry too (ipam-node marks the driver's allocations of
// earlier versions at its start).
func isClaimAllocation(owner string) bool { return owner == nicdra.OwnerDRA }

// AllocationClaim is the ResourceClaim a DRA allocation belongs to: its UID
// always, its namespace, name and state when the DRA checkpoint has it.
type AllocationClaim struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// State is PrepareStarted or PrepareCompleted.
	State string `json:"state,omitempty"`
}

// String is the claim as the table shows it: namespace/name, else the UID.
func (c *AllocationClaim) String() string {
	if c.Name == "" {
		return c.UID
	}
	return c.Namespace + "/" + c.Name
}

// claimOf is the claim of a DRA allocation whose container ID is uid.
func claimOf(claims map[types.UID]nicdra.PreparedClaim, uid string) *AllocationClaim {
	c := &AllocationClaim{UID: uid}
	if pc, ok := claims[types.UID(uid)]; ok {
		c.Namespace, c.Name, c.State = pc.Namespace, pc.Name, pc.State
	}
	return c
}

// DefaultNetNSDirs are where check looks for the network namespaces of pods:
// `ip netns` and containerd's default, and containerd's CRI state directory
// (netns_mounts_under_state_dir).
var DefaultNetNSDirs = []string{"/var/run/netns", "/run/containerd/io.containerd.grpc.v1.cri/netns"}

// draState is what the DRA driver left beside the store: nil when it never
// ran with this store (no status file).
type draState struct {
	statusPath string
	status     nicdra.DriverStatus
	checkpoint string
}

// readDRA reads the DRA driver's status file beside storeFile; nil when there
// is none. A file it cannot read is an error finding.
func readDRA(c *checker, storeFile string) *draState {
	cp := nicdra.CheckpointBeside(storeFile)
	path := nicdra.StatusFile(cp)
	st, ok, err := nicdra.ReadStatus(path)
	if err != nil {
		c.add(SeverityError, "dra", path, fmt.Sprintf("cannot read the DRA driver's status file: %v", err),
			"ipam-node rewrites it every 10 s while the driver runs: if it stays unreadable, move it away and restart ipam-node")
		return nil
	}
	if !ok {
		// No driver runs; claims it prepared before still hold addresses.
		if ckpt, err := (nicdra.CheckpointFile{Path: cp}).Load(); err == nil && len(ckpt.Claims) > 0 {
			var names []string
			for _, pc := range ckpt.Claims {
				names = append(names, pc.Namespace+"/"+pc.Name)
			}
			slices.Sort(names)
			c.add(SeverityWarning, "dra", cp, fmt.Sprintf("%d claim(s) prepared by the DRA driver, which does not run "+
				"(ipam-node without --dra): %s; their addresses stay held", len(names), strings.Join(names, ", ")),
				"run ipam-node with --dra again (deploy/overlays/dra) so that the kubelet can unprepare them, or delete "+
					"the claims and then run it once: its garbage collection releases what deleted claims held")
		}
		return nil
	}
	return &draState{statusPath: path, status: st, checkpoint: cp}
}

// draStaleAfter is how old the status file may be before check calls the
// driver stopped: the driver rewrites it every 10 s.
const draStaleAfter = time.Minute

// checkDRADriver reports the status file's news: fresh, registered with the
// kubelet (and its sockets there), devices published.
func checkDRADriver(c *checker, d *draState, now time.Time) {
	st := d.status
	if age := now.Sub(st.Updated); age > draStaleAfter {
		c.add(SeverityWarning, "dra", d.statusPath, fmt.Sprintf("the DRA driver last wrote its status %s ago (at %s): it seems "+
			"stopped; what follows is as of then", age.Round(time.Second), st.Updated.UTC().Format(time.RFC3339)),
			"check that ipam-node runs (kubectl -n <ns> get pods -o wide, kubectl logs): claims on this node are neither prepared "+
				"nor unprepared meanwhile; if ipam-node now runs without --dra on purpose, remove this file")
	}
	if st.CheckpointError != "" {
		c.add(SeverityError, "dra", d.checkpoint, "the DRA driver refuses every prepare and unprepare, publishes no device "+
			"and releases nothing, because it cannot read its checkpoint: "+st.CheckpointError,
			"restore the file from a backup, or move it away (claims prepared before are then released only by the garbage "+
				"collection once deleted, and their netdevs come back to the host when their pods stop); the driver reads it "+
				"again every 10 s, no restart needed; ipam-node's CNI path is not affected")
	}
	reg, sock := nicdra.RegistrationSocket(st.KubeletDir), nicdra.PluginSocket(st.KubeletDir)
	where := fmt.Sprintf("ipam-node's --dra-kubelet-dir (%s) must be the kubelet's --root-dir, with %s and %s mounted from the "+
		"host at the same paths (deploy/overlays/dra); the kubelet's log says what its plugin watcher saw",
		st.KubeletDir, filepath.Dir(reg), filepath.Dir(sock))
	if !st.Registered {
		why := st.RegistrationError
		if why == "" {
			why = "the driver does not say why"
		}
		c.add(SeverityError, "dra", nicdra.DriverName, "the kubelet has not registered the DRA plugin: "+why+
			": pods with claims of this driver stay pending on this node", where)
	}
	var missing []string
	for _, p := range []string{reg, sock} {
		if fi, err := os.Stat(p); err != nil {
			missing = append(missing, err.Error())
		} else if fi.Mode()&os.ModeSocket == 0 {
			missing = append(missing, p+" is not a socket")
		}
	}
	switch {
	case len(missing) > 0:
		c.add(SeverityError, "dra", nicdra.DriverName, "the kubelet plugin's sockets are not where the kubelet looks: "+
			strings.Join(missing, "; "), where+"; ipam-node makes them when the driver starts: restart it")
	case st.Registered:
		c.add(SeverityOK, "dra", nicdra.DriverName, fmt.Sprintf("registered with the kubelet (%s), serving %s", reg, sock), "")
	}
	switch {
	case st.PublishError != "":
		c.add(SeverityError, "slices", nicdra.DriverName, "publishing the ResourceSlices failed: "+st.PublishError,
			"the scheduler allocates only what the API server's slices say: see ipam-node's log; its service account must be "+
				"allowed to write this node's ResourceSlices (deploy/overlays/dra, docs/rbac.md)")
	case st.Devices == 0 && st.CheckpointError != "":
		// Said above: no device while the checkpoint cannot be read.
	case st.Devices == 0:
		c.add(SeverityWarning, "slices", nicdra.DriverName, "the driver publishes no device: it finds no NVIDIA NIC port on this node",
			"compare `ipamctl nics`: claims of nic.hwipam.io cannot be allocated on this node")
	default:
		c.add(SeverityOK, "slices", nicdra.DriverName, fmt.Sprintf("%d device(s) published at %s", st.Devices,
			st.Published.UTC().Format(time.RFC3339)), "")
	}
	checkDRAFailures(c, st.Failures, now)
	for _, w := range st.Withheld {
		subject := w.Device + " (" + w.PCIAddress
		if w.Netdev != "" {
			subject += ", " + w.Netdev
		}
		subject += ")"
		c.add(SeverityInfo, "slices", subject, "not published to claims: "+w.Reason, withheldFix(w.Reason))
	}
}

// withheldFix says what makes a withheld port available to claims.
func withheldFix(reason string) string {
	switch {
	case strings.HasPrefix(reason, nicdra.WithheldUplink):
		return "the port carries the node's own network: moving it into a pod would cut the node off; it is never published"
	case strings.HasPrefix(reason, nicdra.WithheldExcluded):
		return "remove it from ipam-node's --dra-exclude-devices to publish it"
	}
	return "published again once the pod's attachment is gone (within 10 s); until then claims get other ports"
}

// checkSlicesAPI compares the driver's publication with the ResourceSlices the
// API server has of this node.
func checkSlicesAPI(ctx context.Context, c *checker, cl client.Client, node string, d *draState) {
	var list resourceapi.ResourceSliceList
	err := cl.List(ctx, &list, client.MatchingFields{"spec.nodeName": node, "spec.driver": nicdra.DriverName})
	if err != nil {
		if apierrors.IsForbidden(err) {
			c.add(SeverityWarning, "slices", nicdra.DriverName, fmt.Sprintf("listing ResourceSlices: %v", err),
				"the slices are not compared: run check with a kubeconfig that may list resourceslices")
			return
		}
		c.apiError(nicdra.DriverName, err, fmt.Sprintf("listing ResourceSlices: %v", err), "")
		return
	}
	// The pool's current generation only: slices of an older one are being replaced.
	var gen int64
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	n, count := 0, 0
	for _, s := range list.Items {
		if s.Spec.Pool.Generation == gen {
			n += len(s.Spec.Devices)
			count++
		}
	}
	switch {
	case count == 0:
		c.add(SeverityError, "slices", nicdra.DriverName, fmt.Sprintf("the API server has no ResourceSlice of driver %s for node %s "+
			"(the driver says it published %d device(s))", nicdra.DriverName, node, d.status.Devices),
			"the scheduler cannot allocate this node's NICs: see ipam-node's log for the ResourceSlice controller's errors; "+
				"its service account must be allowed to create this node's slices (deploy/overlays/dra)")
	case n != d.status.Devices:
		c.add(SeverityWarning, "slices", nicdra.DriverName, fmt.Sprintf("the API server's ResourceSlices of node %s have %d device(s), "+
			"the driver published %d", node, n, d.status.Devices),
			"a publication in flight settles within seconds; if it stays, see ipam-node's log")
	default:
		c.add(SeverityOK, "slices", nicdra.DriverName, fmt.Sprintf("the API server has the %d device(s) in %d ResourceSlice(s) of node %s",
			n, count, node), "")
	}
}

// checkClaims checks every claim of the DRA checkpoint: prepared to the end,
// its addresses held in the store under its UID, its netdevs on the host or in
// a network namespace; and no allocation of the driver's held for a claim the
// checkpoint does not know. The checkpoint and the store are read again (up
// to three times in all) while they disagree: a prepare or unprepare may run
// between the two reads.
func checkClaims(c *checker, d *draState, storeFile string, netnsDirs []string) {
	var cp *nicdra.Checkpoint
	var found []Finding
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		var err error
		if cp, err = (nicdra.CheckpointFile{Path: d.checkpoint}).Load(); err != nil {
			c.add(SeverityError, "claim", d.checkpoint, err.Error(), "until then, no claim is prepared or unprepared on this node")
			return
		}
		snap, err := store.Snapshot(storeFile)
		if err != nil {
			break // the store finding says why; the netdevs are checked all the same
		}
		if found = claimsVsStore(cp, snap, storeFile); len(found) == 0 {
			break
		}
	}
	for _, f := range found {
		c.add(f.Severity, f.Check, f.Subject, f.Message, f.Fix)
	}
	uids := make([]types.UID, 0, len(cp.Claims))
	for uid := range cp.Claims {
		uids = append(uids, uid)
	}
	slices.SortFunc(uids, func(a, b types.UID) int {
		return strings.Compare(claimOf(cp.Claims, string(a)).String(), claimOf(cp.Claims, string(b)).String())
	})
	links := &linkFinder{dirs: netnsDirs}
	completed := 0
	for _, uid := range uids {
		pc := cp.Claims[uid]
		subject := claimOf(cp.Claims, string(uid)).String()
		if pc.PortsHeld {
			checkHeldPorts(c, links, subject, uid, pc)
			continue
		}
		if pc.Unpreparing {
			c.add(SeverityWarning, "claim", subject, fmt.Sprintf("claim %s (UID %s, pod %s/%s): its unprepare did not finish: "+
				"some of its addresses may be released already", subject, uid, pc.Namespace, dash(pc.PodName)),
				"the kubelet retries the unprepare; once the claim is deleted, the garbage collection by claim finishes it")
			continue
		}
		if pc.State != nicdra.PrepareCompleted {
			c.add(SeverityWarning, "claim", subject, fmt.Sprintf("claim %s (UID %s, pod %s/%s): its prepare did not finish (state %s): "+
				"its pod waits, and some of its addresses may be held", subject, uid, pc.Namespace, dash(pc.PodName), pc.State),
				"the kubelet retries the prepare while the pod waits: see the pod's events and ipam-node's log; "+
					"once the claim is deleted, its unprepare or the garbage collection by claim releases what it holds")
			continue
		}
		completed++
		for _, pd := range pc.Devices {
			c.add(SeverityInfo, "claim", subject, fmt.Sprintf("claim %s holds port %s (%s, host netdev %s) for pod %s/%s", subject,
				pd.Device, pd.PCIAddress, dash(pd.HostNetdev), pc.Namespace, dash(pc.PodName)),
				"")
			checkNetdev(c, links, subject, pc, pd)
		}
	}
	if len(uids) == 0 {
		c.add(SeverityOK, "claim", "", "no claim is prepared on this node", "")
	} else if completed == len(uids) && len(found) == 0 {
		c.add(SeverityOK, "claim", "", fmt.Sprintf("%d prepared claim(s), each address held in the store under its claim's UID",
			completed), "")
	}
}

// claimsVsStore lists where the checkpoint and the store disagree: an address
// of a prepared claim the store does not hold under its UID (error), an
// allocation of the driver for a claim the checkpoint does not know (warning).
func claimsVsStore(cp *nicdra.Checkpoint, snap map[string]*store.PoolState, storeFile string) []Finding {
	type key struct{ uid, ifName, ip string }
	held := map[key]bool{}
	var out []Finding
	var unknown []string
	for poolKey, p := range snap {
		for _, a := range p.Allocations {
			if !isClaimAllocation(a.Owner) {
				continue
			}
			held[key{a.ContainerID, a.IfName, a.IP}] = true
			if _, ok := cp.Claims[types.UID(a.ContainerID)]; !ok {
				unknown = append(unknown, fmt.Sprintf("%s %s (claim UID %s, %s)", poolKey, a.IP, a.ContainerID, a.IfName))
			}
		}
	}
	slices.Sort(unknown)
	if len(unknown) > 0 {
		out = append(out, Finding{Severity: SeverityWarning, Check: "claim", Subject: storeFile, Message: fmt.Sprintf(
			"%d address(es) held for claims the DRA checkpoint does not know: %s", len(unknown), strings.Join(unknown[:min(5, len(unknown))], "; ")),
			Fix: "ipam-node's garbage collection releases them once no ResourceClaim has that UID; while the claim exists they stay held: " +
				"delete the claim (and its pod) to release them"})
	}
	for uid, pc := range cp.Claims {
		if pc.State != nicdra.PrepareCompleted || pc.Unpreparing {
			continue
		}
		subject := claimOf(cp.Claims, string(uid)).String()
		for _, pd := range pc.Devices {
			for _, a := range pd.Addresses {
				ip, _, _ := strings.Cut(a, "/")
				if held[key{string(uid), pd.Request + ":" + pd.Device, ip}] {
					continue
				}
				out = append(out, Finding{Severity: SeverityError, Check: "claim", Subject: subject, Message: fmt.Sprintf(
					"claim %s (UID %s), device %s: its address %s (pool %s) is not in the store under the claim's UID: the store "+
						"and the DRA checkpoint disagree", subject, uid, pd.Device, a, strings.Join(pd.Pools, ",")),
					Fix: "the pod has an address the store may give to another: delete the pod, so that its claim is unprepared " +
						"and prepared again; check that --store-file is the daemon's store"})
			}
		}
	}
	slices.SortFunc(out, func(a, b Finding) int { return strings.Compare(a.Subject+a.Message, b.Subject+b.Message) })
	return out
}

// checkNetdev says where a prepared device's netdev is: on the host under its
// host name (the pod's sandbox has not started, or has stopped), or in a
// network namespace (the pod's), found by its MAC address; nowhere is an error.
// checkHeldPorts reports a claim unprepared while some of its ports were on
// the host nowhere (PortsHeld): each port, the addresses held for it, and
// where it is when a namespace ipamctl can read has it.
func checkHeldPorts(c *checker, links *linkFinder, subject string, uid types.UID, pc nicdra.PreparedClaim) {
	links.load()
	for _, pd := range pc.Devices {
		where := "in no network namespace ipamctl can read (" + strings.Join(links.dirs, ", ") + "): one that outlived pod " +
			pc.Namespace + "/" + dash(pc.PodName) + " and is not mounted there; `lsns -t net` and " +
			"`ip -all netns exec ip -br link` find it"
		if pd.MAC != "" {
			if l := links.hostByMAC(pd.MAC); l != nil {
				where = "back on the host as " + l.Attrs().Name + ": ipam-node releases it at its next refresh (10 s)"
			} else if ns, l := links.inNamespace(pd.MAC); l != nil {
				where = "in network namespace " + ns + " as " + l.Attrs().Name
			}
		}
		c.add(SeverityWarning, "claim", subject, fmt.Sprintf("claim %s (UID %s) was unprepared while its port %s (%s, host netdev %s) "+
			"was not on the host; the addresses %s stay held, since they may still be up on the port: the port is %s",
			subject, uid, pd.Device, pd.PCIAddress, dash(pd.HostNetdev), strings.Join(pd.Addresses, ", "), where),
			"delete that namespace (`ip netns del <name>`, or stop what holds it) or move the port back (`ip -n <name> link set "+
				"<link> netns 1`): ipam-node then renames it "+dash(pd.HostNetdev)+", releases the addresses and publishes the device again")
	}
}

func checkNetdev(c *checker, links *linkFinder, subject string, pc nicdra.PreparedClaim, pd nicdra.PreparedDevice) {
	pod := pc.Namespace + "/" + dash(pc.PodName)
	if pd.HostNetdev == "" {
		c.add(SeverityInfo, "claim", subject, fmt.Sprintf("device %s (%s) has no netdev: nothing to move into pod %s", pd.Device,
			pd.PCIAddress, pod), "")
		return
	}
	what := fmt.Sprintf("device %s's netdev %s", pd.Device, pd.HostNetdev)
	if pd.MAC != "" {
		what = fmt.Sprintf("device %s's netdev %s (MAC %s)", pd.Device, pd.HostNetdev, pd.MAC)
	}
	links.load()
	if l := links.onHost(pd.HostNetdev); l != nil && (pd.MAC == "" || sameMAC(l, pd.MAC)) {
		c.add(SeverityOK, "claim", subject, fmt.Sprintf("%s is on the host: pod %s's sandbox has not started, or has stopped",
			what, pod), "")
		return
	}
	if pd.MAC == "" {
		c.add(SeverityInfo, "claim", subject, fmt.Sprintf("%s is not on the host, and the checkpoint has no MAC address to find it "+
			"by: presumably in pod %s", what, pod), "")
		return
	}
	if l := links.hostByMAC(pd.MAC); l != nil {
		c.add(SeverityWarning, "claim", subject, fmt.Sprintf("%s is on the host as %s, not under its host name", what, l.Attrs().Name),
			"the kernel gives a physical port back under its pod name when the pod's namespace goes: ipam-node renames it back when "+
				"the pod's sandbox stops, when the claim is unprepared, and at its start; if that fails, ipam-node's log says "+
				"why (another link with the name): free the name, or `ip link set "+l.Attrs().Name+" name "+pd.HostNetdev+"`")
		return
	}
	if ns, l := links.inNamespace(pd.MAC); l != nil {
		if name := l.Attrs().Name; name != pd.InterfaceName {
			c.add(SeverityWarning, "claim", subject, fmt.Sprintf("%s is in network namespace %s as %s, not as %s, the name pod %s asked for",
				what, ns, name, pd.InterfaceName, pod), "the move into the pod did not finish: see ipam-node's log; deleting the pod "+
				"brings the netdev back to the host")
			return
		}
		c.add(SeverityOK, "claim", subject, fmt.Sprintf("%s is in network namespace %s as %s (pod %s)", what, ns, pd.InterfaceName, pod), "")
		return
	}
	if why := links.blind(); why != "" {
		c.add(SeverityInfo, "claim", subject, fmt.Sprintf("%s is not on the host: presumably in pod %s (%s)", what, pod, why), "")
		return
	}
	if links.read == 0 {
		// The directories are there but hold no namespace: the runtime keeps
		// its pods' elsewhere. Nothing was searched, so nothing is known.
		c.add(SeverityWarning, "claim", subject, fmt.Sprintf("%s is not on the host, and ipamctl searched no network namespace "+
			"(%s hold none): it cannot tell whether pod %s has it", what, strings.Join(links.dirs, ", "), pod),
			"give --netns-dir the directory where the runtime keeps its pods' network namespaces (containerd: "+
				"<its state dir>/io.containerd.grpc.v1.cri/netns; `ip netns identify <pid of the pod's process>` or "+
				"`findmnt -t nsfs` show it)")
		return
	}
	c.add(SeverityError, "claim", subject, fmt.Sprintf("%s is neither on the host nor in any of the %d network namespace(s) under %s: "+
		"pod %s has no such interface", what, links.read, strings.Join(links.dirs, ", "), pod),
		"`ip -all netns exec ip -br link` lists every namespace's links; a port whose driver was unbound or reset loses its netdev: "+
			"once it is back, delete the pod so that its claim is prepared again; --netns-dir names where the runtime keeps "+
			"namespaces if elsewhere")
}

func sameMAC(l netlink.Link, mac string) bool {
	return strings.EqualFold(l.Attrs().HardwareAddr.String(), mac)
}

// linkFinder reads the links of ipamctl's network namespace (the host's, as
// ipam-node's with hostNetwork) and of the namespaces under dirs, once.
type linkFinder struct {
	dirs   []string
	loaded bool
	host   []netlink.Link
	spaces []nsLinks
	// read counts the namespaces whose links were read; seenDir the dirs
	// that could be listed; denied says why some could not be entered.
	read    int
	seenDir int
	denied  []string
}

type nsLinks struct {
	path  string
	links []netlink.Link
}

func (f *linkFinder) load() {
	if f.loaded {
		return
	}
	f.loaded = true
	f.host, _ = netlink.LinkList()
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	var self unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &self) == nil {
		seen[ino{self.Dev, self.Ino}] = true
	}
	for _, dir := range f.dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				f.denied = append(f.denied, err.Error())
			}
			continue
		}
		f.seenDir++
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			var st unix.Stat_t
			if unix.Stat(path, &st) != nil || seen[ino{st.Dev, st.Ino}] {
				continue
			}
			seen[ino{st.Dev, st.Ino}] = true
			links, err := linksIn(path)
			switch {
			case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
				f.denied = append(f.denied, fmt.Sprintf("%s: %v", path, err))
			case err != nil:
				// Not a namespace (a file left behind by a runtime): nothing in it.
			default:
				f.read++
				f.spaces = append(f.spaces, nsLinks{path: path, links: links})
			}
		}
	}
}

// linksIn lists the links of the network namespace at path, through a netlink
// socket opened in it (the calling thread does not stay there).
func linksIn(path string) ([]netlink.Link, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.LinkList()
}

func (f *linkFinder) onHost(name string) netlink.Link {
	for _, l := range f.host {
		if l.Attrs().Name == name {
			return l
		}
	}
	return nil
}

func (f *linkFinder) hostByMAC(mac string) netlink.Link {
	for _, l := range f.host {
		if sameMAC(l, mac) {
			return l
		}
	}
	return nil
}

func (f *linkFinder) inNamespace(mac string) (string, netlink.Link) {
	for _, s := range f.spaces {
		for _, l := range s.links {
			if sameMAC(l, mac) {
				return s.path, l
			}
		}
	}
	return "", nil
}

// blind says why a netdev not found may still be in a namespace ipamctl
// cannot see ("" when it sees them all).
func (f *linkFinder) blind() string {
	switch {
	case len(f.denied) > 0:
		return "ipamctl cannot enter every network namespace: " + strings.Join(f.denied[:min(3, len(f.denied))], "; ") +
			": run it as root on the host to find it"
	case f.seenDir == 0:
		return fmt.Sprintf("ipamctl sees none of %s: run it on the host, or give --netns-dir, to find it", strings.Join(f.dirs, ", "))
	}
	return ""
}

// checkDRAFailures reports the driver's failed prepares, unprepares, attaches
// and detaches of the last 15 minutes that have not succeeded since (the
// kubelet and the runtime retry them): what the pod's events say, on the node.
func checkDRAFailures(c *checker, failures []nicdra.Failure, now time.Time) {
	for _, f := range failures { // newest first
		ago := now.Sub(f.At)
		if ago > failureWindow {
			continue
		}
		subject, what, fix := "claim "+f.Claim, "", ""
		switch f.Op {
		case nicdra.FailedPrepare:
			what = "preparing claim " + f.Claim
			fix = "the kubelet retries the prepare; the pod stays ContainerCreating with a FailedPrepareDynamicResources " +
				"event until the cause is fixed (docs/dra.md, Checking it); nothing is allocated for the claim meanwhile"
		case nicdra.FailedUnprepare:
			what = "unpreparing claim " + f.Claim
			fix = "the kubelet retries; the claim's addresses stay held until it succeeds (see ipam-node's log)"
		case nicdra.FailedAttach:
			subject, what = "pod "+f.Pod, "moving pod "+f.Pod+"'s NIC ports into its network namespace"
			fix = "the runtime retries the pod's sandbox; the pod does not start without its ports (see the message, " +
				"and docs/dra.md's limits of the attach)"
		case nicdra.WaitingRelease:
			c.add(SeverityWarning, "claim", "claim "+f.Claim, "deleted, not released: "+f.Message,
				"nothing to do: the claim's addresses and ports go back once its pod stops (delete the pod to "+
					"release them now); another claim gets none of them meanwhile")
			continue
		case nicdra.PortHeld:
			continue // the checkpoint's claims say it, with where the port is
		case nicdra.FailedDetach:
			subject, what = "pod "+f.Pod, "bringing pod "+f.Pod+"'s NIC ports back to the host"
			fix = "see the message; a port left in the pod's namespace comes back when the namespace goes, and the " +
				"claims' netdev findings below say where each port is"
		default:
			what = f.Op
		}
		c.add(SeverityWarning, "failure", subject, fmt.Sprintf("%s failed %s ago: %s", what, ago.Round(time.Second), f.Message), fix)
	}
}
