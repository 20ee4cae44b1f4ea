package ipamnode

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

// NIC label publishing modes (--nic-labels).
const (
	NICLabelsNode        = "node"
	NICLabelsNodeFeature = "nodefeature"
	NICLabelsOff         = "off"
)

// NICLabelFieldManager is the server-side apply field manager that owns the
// nic.hwipam.io labels; no other label is ever part of its apply.
const NICLabelFieldManager = "hwipam-nic-labels"

// NodeFeatureGVK is NFD's NodeFeature, which NFD's master turns into node labels.
var NodeFeatureGVK = schema.GroupVersionKind{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Kind: "NodeFeature"}

// nfdNodeNameLabel tells NFD's master which node a NodeFeature object is for.
const nfdNodeNameLabel = "nfd.node.kubernetes.io/node-name"

// nicLabeler scans the node's NICs and publishes the label set whenever it
// changes: periodically, on SIGHUP, and (on the live root) when a netdev appears
// or goes away. Every error is logged once and retried at the next scan: labels
// never stop allocation.
type nicLabeler struct {
	client    client.Client
	reader    client.Reader
	node      string
	mode      string
	namespace string // NodeFeature mode
	root      string
	rails     nicdiscovery.Rails
	interval  time.Duration
	hup       <-chan os.Signal
	log       logr.Logger
	// view, when set, gets every scan's inventory, for ipamctl.
	view *nicView
	// prepared, when set, returns the host netdevs of the DRA claims' devices
	// by PCI address (nicdra.PreparedNetdevs): a port in a claim's pod keeps
	// its labels, also when the daemon never saw it on the host.
	prepared func() map[string]string

	last         map[string]string // what is published, as far as we know; nil until read
	netdevs      map[string]nicPorts
	lastWarnings string
	problems     problems
	lastRead     time.Time
}

// driftCheckIntervals is how many rescan intervals apart the published labels are
// read back even when the hardware did not change.
const driftCheckIntervals = 5

// nicPorts are a function's netdev ports as last seen in the host namespace.
type nicPorts struct {
	driver string
	ports  []nicdiscovery.Port
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*nicLabeler) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (l *nicLabeler) Start(ctx context.Context) error {
	setForbidden(featureNICLabels, false)
	rescan := make(chan struct{}, 1)
	if l.root == "/" {
		go l.watchLinks(ctx, func() {
			select {
			case rescan <- struct{}{}:
			default:
			}
		})
	}
	t := time.NewTicker(l.interval)
	defer t.Stop()
	l.publish(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.hup:
			l.log.Info("SIGHUP: rescanning the NICs")
		case <-rescan:
			// Let a burst of link events (a driver reload adds many) settle.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(2 * time.Second):
			}
		case <-t.C:
		}
		l.publish(ctx)
	}
}

// watchLinks triggers a rescan when a netdev is added, renamed or deleted (not on
// the operstate changes that are most of rtnetlink's link messages). The
// subscription ends on a receive error (ENOBUFS under heavy churn); it is renewed,
// with a rescan since events may have been lost.
func (l *nicLabeler) watchLinks(ctx context.Context, trigger func()) {
	warned := false
	for ctx.Err() == nil {
		// Its own context per subscription: netlink closes the socket only when
		// done closes, not when a receive error ends the subscription.
		sctx, cancel := context.WithCancel(ctx)
		updates := make(chan netlink.LinkUpdate, 256)
		err := netlink.LinkSubscribeWithOptions(updates, sctx.Done(), netlink.LinkSubscribeOptions{
			ReceiveBufferSize: 1 << 20,
			ErrorCallback:     func(err error) { l.log.V(1).Info("link events", "error", err.Error()) },
		})
		if err != nil {
			cancel()
			if !warned {
				warned = true
				l.log.Info("warning: cannot watch link events; NIC changes are noticed at the next periodic scan",
					"error", err.Error())
			}
		} else {
			warned = false
			names := map[int32]string{}
			for u := range updates {
				idx, name := u.Index, u.Attrs().Name
				switch {
				case u.Header.Type == unix.RTM_DELLINK:
					delete(names, idx)
				case names[idx] == name:
					continue
				default:
					names[idx] = name
				}
				trigger()
			}
			cancel()
			if ctx.Err() != nil {
				return
			}
			l.log.Info("the link event subscription ended; renewing it")
			trigger()
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

func (l *nicLabeler) publish(ctx context.Context) {
	no := false
	nicScans.Inc()
	inv, err := nicdiscovery.Scan(ctx, nicdiscovery.Options{Root: l.root, Logger: l.log, Live: &no})
	if err != nil {
		l.problems.warn(l.log, "scanning the NICs failed; the labels are left as they are", err)
		if l.view != nil {
			l.view.update(nil, nil, err)
		}
		return
	}
	nicCount.Set(float64(len(inv.NICs)))
	if l.prepared != nil {
		inv = nicdra.WithPreparedNetdevs(inv, l.prepared())
	}
	kept := l.keepNetdevs(inv)
	if l.view != nil {
		l.view.update(inv, kept, nil)
	}
	labels, warnings := nicdiscovery.Labels(inv, l.rails)
	if w := strings.Join(warnings, "; "); w != l.lastWarnings {
		l.lastWarnings = w
		for _, w := range warnings {
			l.log.Info("warning: NIC labels: " + w)
		}
	}
	if l.last != nil {
		l.keepSpeeds(labels)
		// Unchanged: nothing to do, except every few intervals, when the object is
		// read back to restore labels someone else removed or changed.
		if maps.Equal(labels, l.last) && time.Since(l.lastRead) < driftCheckIntervals*l.interval {
			return
		}
	}
	l.lastRead = time.Now()
	cur, err := l.published(ctx)
	switch {
	case err == nil:
	case apierrors.IsNotFound(err) && l.mode == NICLabelsNodeFeature:
		cur = &publishedLabels{owned: true, labels: map[string]string{}} // created by the apply
	case apierrors.IsNotFound(err):
		// Never create the Node (server-side apply would).
		l.problems.warn(l.log, "cannot publish the NIC labels: this node does not exist in the API; check --node-name", nil, "node", l.node)
		return
	default:
		// Not knowing what is there (API server down, no RBAC to read): publishing
		// blind could drop a down port's speed; wait for the next scan.
		l.reportWriteError(err)
		return
	}
	if l.last == nil {
		// After a restart, what this daemon published before is the base: nothing
		// is written when it still holds, and a down port keeps its speed.
		l.last = map[string]string{}
		if cur.owned {
			l.last = cur.labels
		}
		l.keepSpeeds(labels)
	}
	// An apply of no labels leaves our manager owning nothing, and the API server
	// then drops its entry: "not owned" and nothing to publish is in place too.
	if maps.Equal(cur.labels, labels) && (cur.owned || len(labels) == 0) {
		l.last = labels
		l.problems.clear()
		setForbidden(featureNICLabels, false)
		return
	}
	switch l.mode {
	case NICLabelsNode:
		// The UID makes the apply fail rather than create a Node deleted since.
		err = l.client.Apply(ctx, corev1ac.Node(l.node).WithUID(cur.uid).WithLabels(labels),
			client.FieldOwner(NICLabelFieldManager), client.ForceOwnership)
	case NICLabelsNodeFeature:
		if len(labels) == 0 {
			// No NIC left: the object goes (an apply that empties spec.labels
			// leaves null there, which NodeFeature's schema refuses).
			err = client.IgnoreNotFound(l.client.Delete(ctx, l.nodeFeature(nil)))
		} else {
			err = l.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(l.nodeFeature(labels)),
				client.FieldOwner(NICLabelFieldManager), client.ForceOwnership)
		}
	}
	if err != nil {
		l.reportWriteError(err)
		return
	}
	nicLabelWrites.Inc()
	l.log.Info("published the NIC labels", "mode", l.mode, "labels", len(labels), "added", diffKeys(labels, l.last),
		"removed", diffKeys(l.last, labels))
	l.last = labels
	l.problems.clear()
	setForbidden(featureNICLabels, false)
}

// reportWriteError logs why the labels could not be read or written, once per
// distinct problem. A refusal by the API server (RBAC) also sets
// hwipam_node_feature_forbidden{feature="nic-labels"}, until a publish succeeds.
func (l *nicLabeler) reportWriteError(err error) {
	switch {
	case apierrors.IsForbidden(err):
		setForbidden(featureNICLabels, true)
		what := "get and patch on nodes"
		if l.mode == NICLabelsNodeFeature {
			what = "get, create, patch and delete on nodefeatures.nfd.k8s-sigs.io in namespace " + l.namespace
		}
		l.problems.warn(l.log, "cannot publish the NIC labels (allocation is not affected); pools that select nodes by "+
			"nic.hwipam.io labels will not find this node. "+forbiddenHint(err, l.node, "Grant "+what+" to the node's "+
			"service account, or run with --nic-labels=off."), err, "node", l.node)
	case meta.IsNoMatchError(err) || l.mode == NICLabelsNodeFeature && apierrors.IsNotFound(err):
		l.problems.warn(l.log, "cannot publish the NIC labels: is NFD's NodeFeature CRD installed? (or use --nic-labels=node)", err)
	default:
		l.problems.warn(l.log, fmt.Sprintf("publishing the NIC labels failed; retrying every %s", l.interval), err)
	}
}

// keepNetdevs keeps the ports of a NIC function whose netdevs left the host's
// network namespace (a PF moved into a pod or VM) or are briefly gone, for as long
// as the function is there with the same driver: its labels stay, and the node
// stays in the pools that select it. It returns the PCI addresses of the
// functions whose ports it kept.
func (l *nicLabeler) keepNetdevs(inv *nicdiscovery.Inventory) map[string]bool {
	kept := map[string]bool{}
	seen := make(map[string]bool, len(inv.NICs))
	for i := range inv.NICs {
		n := &inv.NICs[i]
		seen[n.PCIAddress] = true
		var ports []nicdiscovery.Port
		for _, p := range n.Ports {
			if p.Netdev != "" {
				ports = append(ports, p)
			}
		}
		prev, had := l.netdevs[n.PCIAddress]
		switch {
		case len(ports) > 0:
			if l.netdevs == nil {
				l.netdevs = map[string]nicPorts{}
			}
			l.netdevs[n.PCIAddress] = nicPorts{driver: n.Driver, ports: ports}
		case had && (n.Driver == "" || n.Driver == prev.driver):
			// The same driver, or none for the moment (a reload); another driver
			// (vfio-pci: the PF went to a VM) ends it.
			l.log.V(1).Info("keeping the labels of a NIC whose netdevs are not in the host namespace", "address", n.PCIAddress)
			kept[n.PCIAddress] = true
			n.Ports = append(slices.Clone(prev.ports), n.Ports...)
			for _, p := range prev.ports {
				n.Netdevs = append(n.Netdevs, p.Netdev)
			}
		default:
			delete(l.netdevs, n.PCIAddress)
		}
	}
	for addr := range l.netdevs {
		if !seen[addr] {
			delete(l.netdevs, addr)
		}
	}
	return kept
}

// keepSpeeds keeps a port's last known speed while the port exists: the speed
// reads as unknown while a link is down, and a flapping link must not move a
// node out of a pool that selects on speed.
func (l *nicLabeler) keepSpeeds(labels map[string]string) {
	for k, v := range l.last {
		base, ok := strings.CutSuffix(k, ".speed")
		if !ok {
			continue
		}
		if _, has := labels[k]; !has && labels[base] != "" {
			labels[k] = v
		}
	}
}

// publishedLabels is what the object carries under our prefix (Node) or in its
// spec (NodeFeature), and whether our field manager owns it.
type publishedLabels struct {
	labels map[string]string
	owned  bool
	uid    types.UID
}

// published reads the object the labels go to.
func (l *nicLabeler) published(ctx context.Context) (*publishedLabels, error) {
	var obj client.Object
	switch l.mode {
	case NICLabelsNode:
		obj = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: l.node}}
	default:
		obj = l.nodeFeature(nil)
	}
	if err := l.reader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return nil, err
	}
	// Only the keys our field manager owns are ours: a nic.hwipam.io/ key someone
	// else set is neither compared nor taken over.
	path, values := []string{"f:metadata", "f:labels"}, obj.GetLabels()
	if u, ok := obj.(*unstructured.Unstructured); ok {
		path = []string{"f:spec", "f:labels"}
		values, _, _ = unstructured.NestedStringMap(u.Object, "spec", "labels")
	}
	p := &publishedLabels{labels: map[string]string{}, uid: obj.GetUID()}
	for _, mf := range obj.GetManagedFields() {
		if mf.Manager != NICLabelFieldManager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.FieldsV1 == nil {
			continue
		}
		p.owned = true
		var fields map[string]any
		if err := json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields); err != nil {
			return nil, fmt.Errorf("reading the managed fields of %s: %w", l.node, err)
		}
		for _, step := range path {
			fields, _ = fields[step].(map[string]any)
		}
		for f := range fields {
			if k, ok := strings.CutPrefix(f, "f:"); ok {
				if v, ok := values[k]; ok {
					p.labels[k] = v
				}
			}
		}
	}
	return p, nil
}

// nodeFeature is the NodeFeature object for NFD, hwipam-<node>: the labels in
// spec.labels.
func (l *nicLabeler) nodeFeature(labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(NodeFeatureGVK)
	u.SetName("hwipam-" + l.node)
	u.SetNamespace(l.namespace)
	u.SetLabels(map[string]string{nfdNodeNameLabel: l.node})
	m := make(map[string]any, len(labels))
	for k, v := range labels {
		m[k] = v
	}
	u.Object["spec"] = map[string]any{"labels": m}
	return u
}

// diffKeys lists the keys of a that b lacks.
func diffKeys(a, b map[string]string) []string {
	var out []string
	for k := range a {
		if _, ok := b[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// forbiddenHint says what to do about a refused write: grant (RBAC), or, when one
// of hwipam's admission policies refused it (deploy/policy), check the node name.
func forbiddenHint(err error, node, grant string) string {
	if strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
		return "An admission policy refused the write: it lets this daemon change only the Node its pod runs on. " +
			"Check that --node-name (" + node + ") is that node (NODE_NAME from spec.nodeName)."
	}
	return grant
}
