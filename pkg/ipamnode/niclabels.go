package ipamnode

import (
	"context"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
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
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/nicdiscovery"
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
// or goes away. Every error is logged and retried at the next scan: labels never
// stop allocation.
type nicLabeler struct {
	client    client.Client
	reader    client.Reader
	node      string
	mode      string
	namespace string // NodeFeature mode
	root      string
	rails     nicdiscovery.Rails
	interval  time.Duration
	log       logr.Logger

	last         map[string]string // what was last published
	lastWarnings string
	lastScanErr  string
	warned       bool
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (*nicLabeler) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (l *nicLabeler) Start(ctx context.Context) error {
	rescan := make(chan struct{}, 1)
	trigger := func() {
		select {
		case rescan <- struct{}{}:
		default:
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if l.root == "/" {
		l.watchLinks(ctx, trigger)
	}
	t := time.NewTicker(l.interval)
	defer t.Stop()
	l.publish(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
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
// the operstate changes that are most of rtnetlink's link messages).
func (l *nicLabeler) watchLinks(ctx context.Context, trigger func()) {
	updates := make(chan netlink.LinkUpdate, 64)
	err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { l.log.V(1).Info("link events", "error", err.Error()) },
	})
	if err != nil {
		l.log.Info("warning: cannot watch link events; NIC changes are noticed at the next periodic scan", "error", err.Error())
		return
	}
	go func() {
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
	}()
}

func (l *nicLabeler) publish(ctx context.Context) {
	inv, err := nicdiscovery.Scan(ctx, nicdiscovery.Options{Root: l.root, Logger: l.log})
	if err != nil {
		if msg := err.Error(); msg != l.lastScanErr {
			l.lastScanErr = msg
			l.log.Info("warning: scanning the NICs failed; labels are left as they are", "error", msg)
		}
		return
	}
	l.lastScanErr = ""
	nicCount.Set(float64(len(inv.NICs)))
	labels, warnings := nicdiscovery.Labels(inv, l.rails)
	if w := strings.Join(warnings, "; "); w != l.lastWarnings {
		l.lastWarnings = w
		for _, w := range warnings {
			l.log.Info("warning: NIC labels: " + w)
		}
	}
	if l.last == nil {
		// After a restart, what this daemon published before is the base: nothing
		// is written when it still holds, and a down port keeps its speed.
		if have, owned, err := l.published(ctx); err == nil && owned {
			l.last = have
		}
	}
	l.keepSpeeds(labels)
	if l.last != nil && maps.Equal(labels, l.last) {
		return
	}
	have, owned, err := l.published(ctx)
	switch {
	case err == nil && owned && maps.Equal(have, labels):
		l.last = labels
		return
	case apierrors.IsNotFound(err) && l.mode == NICLabelsNode:
		// Never create the Node (server-side apply would): --node-name is wrong.
		if !l.warned {
			l.warned = true
			l.log.Info("warning: this node does not exist in the API; check --node-name", "node", l.node)
		}
		return
	}
	switch l.mode {
	case NICLabelsNode:
		err = l.client.Apply(ctx, corev1ac.Node(l.node).WithLabels(labels),
			client.FieldOwner(NICLabelFieldManager), client.ForceOwnership)
	case NICLabelsNodeFeature:
		err = l.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(l.nodeFeature(labels)),
			client.FieldOwner(NICLabelFieldManager), client.ForceOwnership)
	}
	switch {
	case err == nil:
		nicLabelWrites.Inc()
		l.log.Info("published the NIC labels", "mode", l.mode, "labels", len(labels), "added", diffKeys(labels, l.last),
			"removed", diffKeys(l.last, labels))
		l.last = labels
		l.warned = false
	case apierrors.IsForbidden(err):
		if !l.warned {
			l.warned = true
			what := "patch on nodes"
			if l.mode == NICLabelsNodeFeature {
				what = "get, create and patch on nodefeatures.nfd.k8s-sigs.io in namespace " + l.namespace
			}
			l.log.Info("warning: cannot publish the NIC labels (allocation is not affected); pools that select "+
				"nodes by nic.hwipam.io labels will not find this node. Grant "+what+" to the node's service account, "+
				"or run with --nic-labels=off.", "node", l.node, "error", err.Error())
		}
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		if !l.warned {
			l.warned = true
			l.log.Info("warning: cannot publish the NIC labels: is NFD's NodeFeature CRD installed? (or use --nic-labels=node)",
				"error", err.Error())
		}
	default:
		l.log.V(1).Info("publishing the NIC labels failed; will retry", "error", err.Error())
	}
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

// published reads the labels our field manager has on the object, and whether it
// owns them (a restart finds them there and writes nothing).
func (l *nicLabeler) published(ctx context.Context) (map[string]string, bool, error) {
	var obj client.Object
	switch l.mode {
	case NICLabelsNode:
		obj = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: l.node}}
	default:
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(NodeFeatureGVK)
		u.SetName(nodeFeatureName(l.node))
		u.SetNamespace(l.namespace)
		obj = u
	}
	if err := l.reader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return nil, false, err
	}
	owned := slices.ContainsFunc(obj.GetManagedFields(), func(mf metav1.ManagedFieldsEntry) bool {
		return mf.Manager == NICLabelFieldManager && mf.Operation == metav1.ManagedFieldsOperationApply
	})
	have := map[string]string{}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		have, _, _ = unstructured.NestedStringMap(u.Object, "spec", "labels")
	} else {
		for k, v := range obj.GetLabels() {
			if strings.HasPrefix(k, nicdiscovery.LabelPrefix) {
				have[k] = v
			}
		}
	}
	return have, owned, nil
}

func nodeFeatureName(node string) string { return "hwipam-" + node }

// nodeFeature is the NodeFeature object for NFD: the labels in spec.labels.
func (l *nicLabeler) nodeFeature(labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(NodeFeatureGVK)
	u.SetName(nodeFeatureName(l.node))
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
