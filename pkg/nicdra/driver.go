package nicdra

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/store"
)

// The kubelet plugin's places under the kubelet's root directory
// (--root-dir, /var/lib/kubelet): the registration socket the kubelet's plugin
// watcher finds, and the directory of the DRA socket.
const (
	RegistryDir = "plugins_registry"
	PluginsDir  = "plugins"
)

// RegistrationSocket and PluginSocket are the sockets the plugin serves under
// the kubelet's root directory.
func RegistrationSocket(kubeletDir string) string {
	return filepath.Join(kubeletDir, RegistryDir, DriverName+"-reg.sock")
}

// PluginSocket is the DRA gRPC socket the kubelet calls.
func PluginSocket(kubeletDir string) string {
	return filepath.Join(kubeletDir, PluginsDir, DriverName, "dra.sock")
}

// Driver is the kubelet plugin: it publishes the node's NIC ports as
// ResourceSlices, prepares and unprepares claims for the kubelet through a
// Preparer, writes their status, reports device health, and releases the
// allocations of claims that no longer exist.
type Driver struct {
	// Failures keeps the failed prepares, unprepares, attaches and detaches
	// for the status file (`ipamctl check`); Run makes one when nil, and
	// gives it to NRI when that has none.
	Failures *FailureLog
	NodeName string
	Client   kubernetes.Interface
	Preparer *Preparer
	// KubeletDir is the kubelet's root directory.
	KubeletDir string
	// Inventory scans the node's NICs (a recent scan is fine).
	Inventory func() (*nicdiscovery.Inventory, error)
	// PoolsByRail returns the pools labelled for each rail, and whether the
	// pools have been listed yet.
	PoolsByRail func() (map[string][]string, bool)
	// Allocations walks the store's allocations; Release releases one if it
	// is still the same (nodealloc.Manager's EachAllocation and ReleaseIf).
	Allocations func(fn func(poolKey string, a store.Allocation) error) error
	Release     func(ctx context.Context, poolKey string, a store.Allocation) (bool, error)
	// RefreshInterval is how often the inventory and pools are read again for
	// the slices and health (default 10s); GCInterval how often claims are
	// checked for existence (default 1m).
	RefreshInterval, GCInterval time.Duration
	Log                         logr.Logger
	// Kick, when set, asks for a refresh now (the pools of a rail changed).
	Kick <-chan struct{}
	// NRI, when set, attaches the prepared devices to their pods' sandboxes
	// through the runtime's NRI socket NRISocket.
	NRI       *NRIPlugin
	NRISocket string
	// CDI, when set, writes each prepared claim's CDI spec: its ports' RDMA
	// character devices go to the containers that reference the claim
	// (the NRI plugin then adds none). Nil: the NRI plugin gives them to
	// every container of the pod (a runtime without CDI).
	CDI *CDISpecs
	// NRIWait bounds how long Run waits for the NRI plugin to connect before
	// the kubelet plugin registers (default 10s).
	NRIWait time.Duration

	// waitingRelease counts the claims the last collection kept because
	// their pod still runs (hwipam_dra_claims{state="waiting_release"}).
	waitingRelease atomic.Int64

	helper atomic.Pointer[kubeletplugin.Helper]
	// statusMu serializes writes of the status file.
	statusMu  sync.Mutex
	fatal     chan error
	mu        sync.Mutex
	published map[string]resourceapi.Device // by device name, as last published
	devices   []resourceapi.Device
	changed   chan struct{} // closed and replaced when devices change
	status    DriverStatus
	// applied is, per claim, the devices whose status was last written.
	applied map[types.UID][]PreparedDevice
}

// Run serves the kubelet until ctx ends or a fatal error.
func (d *Driver) Run(ctx context.Context) error {
	if d.RefreshInterval <= 0 {
		d.RefreshInterval = 10 * time.Second
	}
	if d.GCInterval <= 0 {
		d.GCInterval = time.Minute
	}
	if d.NRIWait <= 0 {
		d.NRIWait = 10 * time.Second
	}
	if d.Failures == nil {
		d.Failures = &FailureLog{}
	}
	if d.NRI != nil && d.NRI.Failures == nil {
		d.NRI.Failures = d.Failures
	}
	metricsDriver.Store(d)
	d.fatal = make(chan error, 1)
	d.changed = make(chan struct{})
	// Claims this node prepared must be readable before any is prepared or
	// unprepared: while the checkpoint cannot be read the driver refuses
	// both, collects nothing, publishes no device and says why in its status
	// file; it does not stop (ipam-node's CNI path serves on).
	if err := d.Preparer.CheckpointError(); err != nil {
		d.Log.Error(err, "the DRA driver refuses every prepare and unprepare until its checkpoint can be read; the CNI path is not affected")
	}
	for _, dir := range []string{filepath.Join(d.KubeletDir, RegistryDir), filepath.Dir(PluginSocket(d.KubeletDir))} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("creating the kubelet plugin's directory: %w", err)
		}
	}
	// The devices are read once before the kubelet can ask for their health.
	d.refresh()
	// Ports whose pods stopped while the driver was down get their names
	// back, before the runtime's events are served.
	d.Preparer.ReclaimAll(d.Log)
	d.pruneCDISpecs()
	// ipamctl check reads the driver's state from its status file from the
	// start and at every refresh interval, also while the registration and
	// the first publication wait for the kubelet or the API server (the
	// ResourceSlice controller waits for its first listing), and within
	// statusCoalesce of a failure added or cleared.
	d.writeStatus()
	statusDone := make(chan struct{})
	defer close(statusDone)
	go func() {
		t := time.NewTicker(d.RefreshInterval)
		defer t.Stop()
		for {
			select {
			case <-statusDone:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				d.writeStatus()
			case <-d.Failures.Changed():
				// Failures that come together are written together.
				select {
				case <-time.After(statusCoalesce):
				case <-ctx.Done():
					return
				}
				d.writeStatus()
			}
		}
	}()
	if d.NRI != nil {
		nriDone := make(chan struct{})
		nctx, stopNRI := context.WithCancel(ctx)
		go func() {
			defer close(nriDone)
			if err := d.NRI.Run(nctx, d.NRISocket); err != nil {
				d.Log.Error(err, "the NRI plugin stopped")
			}
		}()
		// Stopped after the kubelet plugin: no claim is prepared for a pod
		// whose sandbox then finds no one to attach it.
		defer func() { stopNRI(); <-nriDone }()
		// And registered after the NRI plugin is connected, for the same
		// reason (a bounded wait: without NRI, claims still get addresses).
		select {
		case <-d.NRI.Ready():
		case <-time.After(d.NRIWait):
			d.Log.Info("the NRI plugin is not connected to the runtime yet; the kubelet plugin registers anyway, and "+
				"devices of pods that start meanwhile are attached when it connects or when their containers are created",
				"socket", d.NRISocket, "waited", d.NRIWait)
		case <-ctx.Done():
			return nil
		}
	}
	lctx := klog.NewContext(ctx, d.Log)
	helper, err := kubeletplugin.Start(lctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(d.NodeName),
		kubeletplugin.KubeClient(d.Client),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(d.KubeletDir, RegistryDir)),
		kubeletplugin.PluginDataDirectoryPath(filepath.Dir(PluginSocket(d.KubeletDir))),
		kubeletplugin.Serialize(true))
	if err != nil {
		return fmt.Errorf("starting the DRA kubelet plugin: %w", err)
	}
	d.helper.Store(helper)
	defer helper.Stop()
	d.Log.Info("DRA kubelet plugin serving", "driver", DriverName, "socket", PluginSocket(d.KubeletDir),
		"registration", RegistrationSocket(d.KubeletDir))
	if err := d.publish(ctx); err != nil {
		return err
	}
	refresh := time.NewTicker(d.RefreshInterval)
	defer refresh.Stop()
	// The collection runs at start and every GCInterval; one that could not
	// ask the API server is tried again after gcRetry.
	gc := time.NewTimer(0)
	defer gc.Stop()
	gcFailures := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.fatal:
			return err
		case <-refresh.C:
			if err := d.refreshAndPublish(ctx); err != nil {
				return err
			}
			d.checkPublished(ctx)
			d.Preparer.PersistAttached()
			d.releaseHeldPorts(ctx)
			d.pruneCDISpecs()
			d.reconcileStatus(ctx)
		case <-d.Kick:
			if err := d.refreshAndPublish(ctx); err != nil {
				return err
			}
		case <-gc.C:
			if d.collect(ctx) {
				gcFailures = 0
			} else {
				gcFailures++
			}
			gc.Reset(gcBackoff(gcFailures, d.GCInterval))
		}
	}
}

// removeCDISpec removes an unprepared claim's CDI spec; a failure is logged
// (the refresh prunes it).
func (d *Driver) removeCDISpec(uid types.UID) {
	if err := d.CDI.Remove(uid); err != nil {
		d.Log.Error(err, "removing an unprepared claim's CDI spec; removed at the next refresh", "uid", uid)
	}
}

// pruneCDISpecs removes the CDI specs of claims no longer prepared.
func (d *Driver) pruneCDISpecs() {
	n, err := d.CDI.Prune(d.Preparer.Claims)
	if err != nil {
		d.Log.Error(err, "removing the CDI specs of claims no longer prepared")
	}
	if n > 0 {
		d.Log.Info("removed the CDI specs of claims no longer prepared", "specs", n)
	}
}

// releaseHeldPorts releases the addresses of ports held since their claim was
// unprepared while they were in a namespace that outlived their pod, once
// they are back on the host; while they are not, ipamctl check says where
// to look (a PortHeld entry, kept fresh).
func (d *Driver) releaseHeldPorts(ctx context.Context) {
	claims, _ := d.Preparer.Claims()
	for uid, err := range d.Preparer.ReleaseHeldPorts(ctx) {
		pc := claims[uid]
		claim := pc.Namespace + "/" + pc.Name
		switch {
		case err == nil:
			d.Failures.Succeeded(PortHeld, claim, "")
			d.Log.Info("a port held since its claim was unprepared is back on the host; its addresses are released",
				"claim", claim, "uid", uid)
		case errors.Is(err, ErrPortsHeld):
			d.Failures.Add(PortHeld, claim, "", err)
		default:
			d.Failures.Add(FailedUnprepare, claim, "", err)
			d.Log.Error(err, "releasing a claim's held port", "claim", claim, "uid", uid)
		}
	}
}

// Registered says whether the kubelet has registered the plugin (nil: not
// told yet), for ipamctl check.
func (d *Driver) Registered() (ok bool, why string) {
	h := d.helper.Load()
	if h == nil {
		return false, "the plugin has not started"
	}
	st := h.RegistrationStatus()
	switch {
	case st == nil:
		return false, "the kubelet has not called the registration socket " + RegistrationSocket(d.KubeletDir) + " yet"
	case !st.PluginRegistered:
		return false, "the kubelet refused the registration: " + st.Error
	}
	return true, ""
}

// refresh reads the inventory and pools again; it says whether the devices
// changed. Devices of prepared claims that left the scan (their netdev moved
// into a pod) stay published as they were: the device is still this node's,
// and the claim's allocation refers to it.
func (d *Driver) refresh() bool {
	inv, err := d.Inventory()
	if err != nil {
		d.Log.Error(err, "scanning the NICs for the ResourceSlices; the last published devices stay")
		return false
	}
	pools, _ := d.PoolsByRail()
	claims, err := d.Preparer.Claims()
	var devs []resourceapi.Device
	var withheld []WithheldDevice
	if err == nil {
		pub, perr := d.publishInputs(inv, claims, pools)
		if perr != nil {
			d.Log.Error(perr, "the last published devices stay")
			return false
		}
		var warnings []string
		devs, warnings = Devices(pub)
		for _, w := range warnings {
			d.Log.Info("a device attribute is not published", "warning", w)
		}
		withheld = Withheld(pub)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		// The checkpoint cannot be read: every prepare would be refused, so
		// the node offers no device until it can (Run logged why).
		claims = nil
		d.status.CheckpointError = err.Error()
	} else {
		d.status.CheckpointError = ""
	}
	d.status.Withheld = withheld
	have := map[string]bool{}
	for _, dev := range devs {
		have[dev.Name] = true
	}
	for _, pc := range claims {
		for _, pd := range pc.Devices {
			if prev, ok := d.published[pd.Device]; ok && !have[pd.Device] {
				devs = append(devs, prev)
				have[pd.Device] = true
			}
		}
	}
	slices.SortFunc(devs, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
	// A taint keeps the time it was first added, so an unchanged taint is no
	// change.
	for i := range devs {
		prev, ok := d.published[devs[i].Name]
		if !ok {
			continue
		}
		for j := range devs[i].Taints {
			for _, pt := range prev.Taints {
				if pt.Key == devs[i].Taints[j].Key && pt.Value == devs[i].Taints[j].Value {
					devs[i].Taints[j].TimeAdded = pt.TimeAdded
				}
			}
		}
	}
	if d.published != nil && reflect.DeepEqual(devs, d.devices) {
		return false
	}
	d.devices = devs
	d.published = map[string]resourceapi.Device{}
	for _, dev := range devs {
		d.published[dev.Name] = dev
	}
	close(d.changed)
	d.changed = make(chan struct{})
	return true
}

// refreshAndPublish publishes the devices when they changed.
func (d *Driver) refreshAndPublish(ctx context.Context) error {
	if !d.refresh() {
		return nil
	}
	return d.publish(ctx)
}

// publish hands the devices to the library's ResourceSlice controller.
func (d *Driver) publish(ctx context.Context) error {
	d.mu.Lock()
	devs := slices.Clone(d.devices)
	d.mu.Unlock()
	if err := d.helper.Load().PublishResources(ctx, Resources(d.NodeName, devs)); err != nil {
		return fmt.Errorf("publishing the ResourceSlices: %w", err)
	}
	d.mu.Lock()
	d.status.Devices, d.status.Published = len(devs), time.Now()
	d.status.Ports = publishedPorts(devs)
	d.mu.Unlock()
	d.writeStatus()
	d.Log.Info("ResourceSlices published", "devices", len(devs))
	return nil
}

// checkPublished clears the last publication error once the API server's
// ResourceSlices of this node have exactly the devices published: the
// library's controller retries on its own and says nothing when it succeeds.
func (d *Driver) checkPublished(ctx context.Context) {
	d.mu.Lock()
	failed := d.status.PublishError != ""
	want := make([]string, 0, len(d.devices))
	for _, dev := range d.devices {
		want = append(want, dev.Name)
	}
	d.mu.Unlock()
	if !failed {
		return
	}
	list, err := d.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + d.NodeName + ",spec.driver=" + DriverName})
	if err != nil {
		return
	}
	var gen int64
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var have []string
	for _, s := range list.Items {
		if s.Spec.Pool.Generation != gen {
			return // a publication in flight
		}
		for _, dev := range s.Spec.Devices {
			have = append(have, dev.Name)
		}
	}
	slices.Sort(have)
	slices.Sort(want)
	if !slices.Equal(have, want) {
		return
	}
	d.mu.Lock()
	d.status.PublishError = ""
	d.mu.Unlock()
	d.Log.Info("the ResourceSlices are published; the last publication error is cleared", "devices", len(want))
}

// reconcileStatus writes the status of claims whose devices changed since it
// was written (the attach learnt the host link's MAC), and of every claim
// once after a start; a failed write is tried again at the next refresh. A
// claim of the same name with another UID (the prepared one was deleted and
// re-created) is left alone: the claim garbage collection releases the
// prepared one.
func (d *Driver) reconcileStatus(ctx context.Context) {
	claims, err := d.Preparer.Claims()
	if err != nil {
		return
	}
	if d.applied == nil {
		d.applied = map[types.UID][]PreparedDevice{}
	}
	for uid := range d.applied {
		if _, ok := claims[uid]; !ok {
			delete(d.applied, uid)
		}
	}
	for uid, pc := range claims {
		if pc.State != PrepareCompleted || pc.Unpreparing || reflect.DeepEqual(d.applied[uid], pc.Devices) {
			continue
		}
		err := ApplyClaimStatus(ctx, d.Client, pc.Namespace, pc.Name, uid, d.NodeName, pc.Devices)
		switch {
		case errors.Is(err, ErrClaimReplaced):
			d.Log.Info("a prepared claim was replaced by one of the same name; its status is not written", "claim",
				pc.Namespace+"/"+pc.Name, "uid", uid)
		case err != nil:
			d.Log.Error(err, "updating a claim's status; tried again at the next refresh", "claim", pc.Namespace+"/"+pc.Name)
			continue
		}
		// A copy: what was written, whatever the record becomes.
		d.applied[uid] = slices.Clone(pc.Devices)
	}
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: each claim's
// devices get their addresses, and the claim's status says what they are.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		start := time.Now()
		devs, err := d.Preparer.Prepare(ctx, c)
		if err == nil {
			err = ApplyClaimStatus(ctx, d.Client, c.Namespace, c.Name, c.UID, d.NodeName, devs)
			if err != nil {
				err = fmt.Errorf("claim %s/%s: its addresses are held, but writing its status failed (the kubelet "+
					"tries again): %w", c.Namespace, c.Name, err)
			}
		}
		prepareSeconds.Observe(time.Since(start).Seconds())
		claim := c.Namespace + "/" + c.Name
		if err != nil {
			d.Log.Error(err, "preparing a claim", "claim", klog.KObj(c), "uid", c.UID)
			d.Failures.Add(FailedPrepare, claim, "", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		ids, err := d.CDI.Write(c.UID, devs)
		if err != nil {
			err = fmt.Errorf("claim %s/%s: its addresses are held, but writing its CDI spec (its ports' RDMA devices) "+
				"failed (the kubelet tries again): %w", c.Namespace, c.Name, err)
			d.Log.Error(err, "preparing a claim", "claim", klog.KObj(c), "uid", c.UID)
			d.Failures.Add(FailedPrepare, claim, "", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.Failures.Succeeded(FailedPrepare, claim, "")
		var res kubeletplugin.PrepareResult
		for _, pd := range devs {
			res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{pd.Request}, PoolName: d.NodeName,
				DeviceName: pd.Device, CDIDeviceIDs: ids[pd.Device]})
		}
		d.Log.Info("claim prepared", "claim", klog.KObj(c), "uid", c.UID, "devices", len(devs),
			"duration", time.Since(start).String())
		out[c.UID] = res
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		claim := c.NamespacedName.String() // as a failed prepare names it
		err := d.Preparer.Unprepare(ctx, c.UID)
		if err == nil || errors.Is(err, ErrPortsHeld) {
			d.removeCDISpec(c.UID)
		}
		if errors.Is(err, ErrPortsHeld) {
			// Unprepared for the kubelet: retrying cannot bring the port
			// back. Its addresses stay held; the refresh releases them once
			// the port is back.
			d.Log.Error(err, "a claim's port is not on the host; the claim is unprepared, its port's addresses stay held",
				"claim", claim, "uid", c.UID)
			d.Failures.Add(PortHeld, claim, "", err)
			d.Failures.Succeeded(FailedUnprepare, claim, "")
			d.Failures.Succeeded(WaitingRelease, claim, "")
			err = nil
		} else if err != nil {
			d.Log.Error(err, "unpreparing a claim", "claim", claim, "uid", c.UID)
			d.Failures.Add(FailedUnprepare, claim, "", err)
		} else {
			d.Log.Info("claim unprepared", "claim", claim, "uid", c.UID)
			d.Failures.Succeeded(FailedUnprepare, claim, "")
			d.Failures.Succeeded(FailedPrepare, claim, "")
			d.Failures.Succeeded(WaitingRelease, claim, "") // a deleted claim kept for its pod: released now
		}
		out[c.UID] = err
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: errors the library cannot
// recover from stop the driver (and so ipam-node, which the kubelet restarts).
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.Log.Error(err, msg)
		d.mu.Lock()
		d.status.PublishError = msg + ": " + err.Error()
		d.mu.Unlock()
		return // cleared once the API server has what was published (checkPublished)
	}
	select {
	case d.fatal <- fmt.Errorf("the DRA kubelet plugin: %s: %w", msg, err):
	default:
	}
}

// gcRetry is how soon a collection that failed is tried again the first
// time; each further failure doubles it, up to the collection's interval.
const gcRetry = 5 * time.Second

// gcBackoff is the wait before the next collection after failures failed
// ones in a row (none: the interval).
func gcBackoff(failures int, interval time.Duration) time.Duration {
	if failures == 0 {
		return interval
	}
	wait := gcRetry
	for i := 1; i < failures && wait < interval; i++ {
		wait *= 2
	}
	return min(wait, interval)
}

// healthRefresh is how often health reports are sent again: within the
// kubelet's default timeout of 30s.
const healthRefresh = 10 * time.Second

// WatchHealthStatus implements kubeletplugin.DRAPlugin: a device is
// unhealthy while its link is down (the same condition that taints it).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	t := time.NewTicker(healthRefresh)
	defer t.Stop()
	for {
		d.mu.Lock()
		devs, changed := d.devices, d.changed
		d.mu.Unlock()
		r := kubeletplugin.DeviceHealthReport{}
		now := time.Now()
		for _, dev := range devs {
			h := kubeletplugin.DeviceHealth{PoolName: d.NodeName, DeviceName: dev.Name, Health: kubeletplugin.HealthStatusHealthy,
				LastUpdated: now}
			for _, taint := range dev.Taints {
				if taint.Key == TaintLinkDown {
					h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, "link down: "+taint.Value
				}
			}
			r.Devices = append(r.Devices, h)
		}
		select {
		case <-ctx.Done():
			return nil
		case reports <- r:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changed:
		}
	}
}
