package system

// Issue 45's edges in the whole-system test, each an action of draActions
// with what the model expects of it:
//
//   - dra-delete-running, dra-deleted-pod-stop: a tenant deletes its running
//     pod's claim past the claim's finalizer. The driver's claim collection
//     keeps what the claim holds (its address, its port in the pod) while the
//     pod's sandbox runs, says so in its status (a release entry, for ipamctl
//     check), and releases it once the sandbox stopped: at once when the
//     kubelet unprepares it, within a minute (the collection's round) when
//     the kubelet lost track of it.
//   - dra-checkpoint-full: the filesystem of a node's store and checkpoint is
//     full while a prepare runs beside a sandbox start: that prepare alone is
//     refused, saying why; ipam-node goes on, its CNI path serves.
//   - dra-cni-race: a CNI ADD naming a port as its master and the prepare of
//     a claim for that port race: never both get it.
//   - cni-bond-master: a NAD whose master is a bond of two ports holds both:
//     neither is published, and a claim for either is refused.
//   - dra-nri-reconnect: the NRI plugin's connection to the runtime drops
//     and comes back while pods start: every pod ends up with its port
//     (a container created while the plugin was away has its RDMA devices
//     from the claim's CDI spec).
//
// The invariants they need are in check(): no ipam-node exits
// (checkDaemonsRun), one claim per port (checkOneClaimPerPort), no claim's
// port under a live NAD's master, bond included (checkPorts, masterPorts),
// a claim deleted while its pod runs keeps its address (checkClaims, as any
// prepared claim) and is in its driver's status once its collection ran
// (checkDeletedClaims); each failure an action caused is in the driver's
// status file, which is what ipamctl check reads, within statusWait, unless
// a success cleared it first (checkStatusWants); and each refusal says why
// (in the actions).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/nicdra"
)

const (
	// statusWait bounds how long an entry takes to reach the driver's status
	// file: it is rewritten at every refresh (10 s) and publication.
	statusWait = 15 * time.Second
	// releaseDue is how long after its deletion (or its daemon's start, or
	// the API server's return) a claim deleted while its pod runs must be
	// in the status as waiting for its release: the collection runs every
	// minute, and the status is written within 10 s of it.
	releaseDue = time.Minute + 25*time.Second
	// bondName is the bond cni-bond-master makes over bondSlaves, the
	// BlueField-3's two ports, as a RoCE LAG bond does.
	bondName = "bond0"
	// nodeInodes is how many inodes a node's filesystem has while it is not
	// full (see nodeFilesystem).
	nodeInodes = 200000
)

var bondSlaves = []string{"enp225s0f0np0", "enp225s0f1np1"}

// nodeFilesystem gives the node's directory (its store, its DRA checkpoint
// and status file, its NIC tree) a filesystem of its own, a tmpfs, so that
// dra-checkpoint-full can fill it without filling anyone else's.
func (w *world) nodeFilesystem(n *simNode) {
	if err := unix.Mount("tmpfs", n.dir, "tmpfs", 0, fmt.Sprintf("size=256m,nr_inodes=%d,mode=0755", nodeInodes)); err != nil {
		w.t.Fatalf("mounting a tmpfs on %s's directory %s: %v", n.name, n.dir, err)
	}
	w.t.Cleanup(func() { _ = unix.Unmount(n.dir, unix.MNT_DETACH) })
}

// fillFilesystem fills the node's filesystem: every inode is used, so that no
// file can be made (ENOSPC), while the files there (the store and its log,
// written in place) can still be written. A full data space could also fail
// the store's next checkpoint of its log into its bbolt file (when bbolt
// grows it), which stops the store's writes until ipam-node restarts, by
// design (pkg/store, poison): a fault of the store, not of the DRA
// checkpoint this is about. free makes room again.
func (w *world) fillFilesystem(n *simNode) (free func()) {
	for try := 0; ; try++ {
		var st unix.Statfs_t
		if err := unix.Statfs(n.dir, &st); err != nil {
			w.fail("statfs %s: %v", n.dir, err)
		}
		err := unix.Mount("", n.dir, "", unix.MS_REMOUNT, fmt.Sprintf("nr_inodes=%d", st.Files-st.Ffree))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINVAL) || try == 50 { // EINVAL: a file was made since the statfs
			w.fail("filling %s's filesystem: %v", n.name, err)
		}
	}
	// A file removed since the statfs left an inode.
	var fillers []string
	for k := 0; ; k++ {
		f := filepath.Join(n.dir, fmt.Sprintf(".full-%d", k))
		err := os.WriteFile(f, nil, 0o600)
		if errors.Is(err, unix.ENOSPC) {
			break
		}
		if err != nil {
			w.fail("filling %s's filesystem: %v", n.name, err)
		}
		fillers = append(fillers, f)
	}
	return func() {
		if err := unix.Mount("", n.dir, "", unix.MS_REMOUNT, fmt.Sprintf("nr_inodes=%d", nodeInodes)); err != nil {
			w.fail("making room on %s's filesystem: %v", n.name, err)
		}
		for _, f := range fillers {
			_ = os.Remove(f)
		}
	}
}

// driverStatus reads node i's DRA driver status file, as ipamctl check does.
func (w *world) driverStatus(i int) nicdra.DriverStatus {
	path := nicdra.StatusFile(nicdra.CheckpointBeside(filepath.Join(w.nodes[i].dir, "store")))
	st, _, err := nicdra.ReadStatus(path)
	if err != nil {
		w.fail("reading the DRA status file of %s: %v", w.nodes[i].name, err)
	}
	return st
}

// waitStatus waits (bounded) until node i's status file satisfies ok.
func (w *world) waitStatus(i int, within time.Duration, ok func(nicdra.DriverStatus) bool) bool {
	deadline := time.Now().Add(within)
	for !ok(w.driverStatus(i)) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}

// statusWant is what a node's driver status file must show by a deadline
// (for ipamctl check), checked after every step (checkStatusWants) rather
// than waited for: the file is rewritten every 10 s.
type statusWant struct {
	node int
	// started is the daemon's start it is about: the failures are in the
	// daemon's memory, so a restart since makes it moot.
	started time.Time
	by      time.Time
	ok      func(nicdra.DriverStatus) bool
	// moot, when set, says that it no longer holds (a success since
	// cleared the failure, say).
	moot func() bool
	// kind and what name the violation when it is not met in time; seen
	// is counted when it is.
	kind, what, seen string
}

// wantStatus adds what node i's status file must show within statusWait.
func (w *world) wantStatus(i int, want statusWant) {
	want.node, want.started, want.by = i, w.nodes[i].started, time.Now().Add(statusWait)
	w.statusWants = append(w.statusWants, want)
}

// checkStatusWants checks the status files against what they must show.
func (w *world) checkStatusWants() {
	now := time.Now()
	w.statusWants = slices.DeleteFunc(w.statusWants, func(want statusWant) bool {
		n := w.nodes[want.node]
		switch {
		case n.cmd == nil || !n.started.Equal(want.started) || (want.moot != nil && want.moot()):
			return true
		case want.ok(w.driverStatus(want.node)):
			w.counts[want.seen]++
			return true
		case now.After(want.by):
			w.violation(want.kind, "%s, but %s after, ipam-node on %s's status file does not say so (failures: %+v)", want.what,
				statusWait, n.name, w.driverStatus(want.node).Failures)
			return true
		}
		return false
	})
}

// failureOf returns the status's entry of op for the claim or pod
// (namespace/name), nil when there is none.
func failureOf(st nicdra.DriverStatus, op, claim, pod string) *nicdra.Failure {
	for i, f := range st.Failures {
		if f.Op == op && f.Claim == claim && f.Pod == pod {
			return &st.Failures[i]
		}
	}
	return nil
}

// ---- a claim deleted while its pod runs ----

// draDeleteRunning: a tenant deletes its running pod's claim past the
// claim's delete-protection finalizer (the test's scheduler sets none, so
// the tenant's part is the delete alone). What the claim holds stays held
// (check: its address under its UID, its port in the pod) until its pod
// stops (draDeletedPodStop). Half the time the node's daemon is killed and
// started again, so that its claim collection runs at once, right after its
// NRI plugin has synchronized with the runtime (which runs the pod): the
// collection must keep the claim, and say why in the status.
func (w *world) draDeleteRunning() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && c.pod != nil && w.nodes[c.node].cmd != nil })
	if c != nil {
		w.deleteRunning(c, w.rng.IntN(2) == 0)
	}
}

// deleteRunning is draDeleteRunning's deletion of claim c, with a restart
// of its daemon when restart is set.
func (w *world) deleteRunning(c *draClaim, restart bool) {
	w.draDelete(c)
	c.deleted = time.Now()
	w.counts["dra-deleted-while-running"]++
	w.tracef("the tenant deletes %s past its finalizer while its pod runs", c)
	if !restart || !w.proxy.Up() {
		return
	}
	n := w.nodes[c.node]
	w.killDaemon(c.node)
	w.startDaemon(c.node)
	w.tracef("kill -9 ipam-node on %s and start it again: its claim collection runs at its start", n.name)
	if !w.nriConnected(c.node, draRetryFor) {
		w.fail("ipam-node on %s did not connect to the runtime's NRI socket after its restart", n.name)
	}
	claim := namespace + "/" + c.name
	w.wantStatus(c.node, statusWant{kind: "failure-not-visible", seen: "dra-release-waits-visible",
		what: fmt.Sprintf("%s was deleted while its pod runs, and its daemon restarted (its collection ran)", c),
		ok:   func(st nicdra.DriverStatus) bool { return failureOf(st, nicdra.WaitingRelease, claim, "") != nil },
		moot: func() bool { _, ok := w.claims[c.uid]; return !ok }})
}

// draDeletedPodStop: the pod of a claim deleted while it ran stops. Two
// times in three its kubelet unprepares the claim (it keeps the claims of
// its pods, deleted or not): the claim must hold nothing at once, and its
// status entry must go. Otherwise the kubelet lost track of it, and the
// driver's collection must release it within a minute (draGCLate). With the
// node's daemon down the stop is missed, and the collection at the daemon's
// start releases it (draGCBound).
func (w *world) draDeletedPodStop() {
	var cands []*draClaim
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		if c := w.claims[types.UID(uid)]; !c.deleted.IsZero() {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return
	}
	c := cands[w.rng.IntN(len(cands))]
	w.deletedPodStop(c, w.rng.IntN(3) != 0)
}

// deletedPodStop is draDeletedPodStop's stop of claim c's pod, with the
// kubelet's unprepare when unprepare is set.
func (w *world) deletedPodStop(c *draClaim, unprepare bool) {
	n := w.nodes[c.node]
	if n.cmd == nil {
		if c.pod != nil {
			ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
			_ = n.nri.rt.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: c.pod.sandbox()}) // no plugin to tell
			cancel()
			w.podGone(c.pod, true)
			c.pod = nil
		}
		delete(w.claims, c.uid)
		w.collect[c.uid] = &draGone{name: c.name, node: c.node}
		w.counts["dra-deleted-pod-stop-missed"]++
		w.tracef("%s's pod stopped while ipam-node on %s is down", c, n.name)
		return
	}
	if !w.nriConnected(c.node, draRetryFor) {
		return
	}
	claim := namespace + "/" + c.name
	unprepared := w.podStop(c, unprepare) && unprepare
	delete(w.claims, c.uid)
	if !unprepared {
		w.collect[c.uid] = &draGone{name: c.name, node: c.node, deadline: time.Now().Add(draGCLate)}
		w.counts["dra-deleted-pod-stop-lost"]++
		w.tracef("%s's pod stopped, and its kubelet lost track of it: the claim collection must release it", c)
		return
	}
	w.counts["dra-deleted-pod-stop-unprepared"]++
	w.tracef("%s's pod stopped, and its kubelet unprepared it", c)
	if failureOf(w.driverStatus(c.node), nicdra.WaitingRelease, claim, "") != nil {
		w.wantStatus(c.node, statusWant{kind: "stale-status", seen: "dra-release-entry-cleared",
			what: fmt.Sprintf("%s is unprepared and holds nothing: its release no longer waits", c),
			ok:   func(st nicdra.DriverStatus) bool { return failureOf(st, nicdra.WaitingRelease, claim, "") == nil }})
	}
}

// checkDeletedClaims: a claim deleted while its pod runs is in its driver's
// status as waiting for its release, once the driver's collection ran with
// the API server there (releaseDue after the deletion, the daemon's start
// and the API server's return).
func (w *world) checkDeletedClaims() {
	now := time.Now()
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		n := w.nodes[c.node]
		if c.deleted.IsZero() || n.cmd == nil || !w.proxy.Up() {
			continue
		}
		since := c.deleted
		for _, t := range []time.Time{n.started, w.apiUpAt} {
			if t.After(since) {
				since = t
			}
		}
		if now.Sub(since) < releaseDue {
			continue
		}
		if failureOf(w.driverStatus(c.node), nicdra.WaitingRelease, namespace+"/"+c.name, "") == nil {
			w.violation("failure-not-visible", "%s was deleted while its pod runs, %s ago; ipam-node on %s's status file has no "+
				"%q entry for it", c, now.Sub(c.deleted).Round(time.Second), n.name, nicdra.WaitingRelease)
		}
	}
}

// checkOneClaimPerPort: no two claims are prepared with one port.
func (w *world) checkOneClaimPerPort() {
	byPort := map[string][]*draClaim{}
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		if c := w.claims[types.UID(uid)]; c.state == claimPrepared {
			k := fmt.Sprintf("%s %s", w.nodes[c.node].name, c.device)
			byPort[k] = append(byPort[k], c)
		}
	}
	for _, k := range sortedKeys(byPort) {
		if cs := byPort[k]; len(cs) > 1 {
			w.violation("two-owners", "port %s has %d prepared claims: %v", k, len(cs), cs)
		}
	}
}

// deletedFinal stops the pods of the claims deleted while they ran, and
// unprepares the claims as their kubelet does. The claims left to the
// collection's next round (up to a minute away) are not waited for: their
// daemons restart, and the collection at the start releases them within
// draGCBound.
func (w *world) deletedFinal() {
	var restart []int
	for _, g := range w.collect {
		if !g.deadline.IsZero() && time.Until(g.deadline) > draGCBound && !slices.Contains(restart, g.node) {
			restart = append(restart, g.node)
		}
	}
	slices.Sort(restart)
	for _, i := range restart {
		w.killDaemon(i)
		w.startDaemon(i)
		w.tracef("kill -9 ipam-node on %s and start it again: its claim collection runs at its start", w.nodes[i].name)
	}
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		if c.deleted.IsZero() {
			continue
		}
		if c.pod != nil {
			if !w.nriConnected(c.node, 30*time.Second) {
				w.fail("the NRI plugin of %s did not connect within 30s of everything being up", w.nodes[c.node].name)
			}
			w.podStop(c, false)
		}
		w.unprepareUntilDone(c, "after its pod stopped (deleted while it ran)")
		delete(w.claims, c.uid)
	}
}

// ---- a checkpoint write that fails ----

// draCheckpointFull: the filesystem of a node's store and DRA checkpoint is
// full (fillFilesystem) while a new claim is prepared beside a sandbox start
// of another claim's pod (whose attach records the port's MAC and MTU in the
// checkpoint too), half the time with the prepare's NIC scan slow, so that
// the sandbox starts while the prepare runs. The prepare is refused, for the
// checkpoint's write (or before it, for a reason of its own), never answered
// as prepared, and holds nothing; nothing else fails: ipam-node goes on
// (checkDaemonsRun), a CNI ADD meanwhile succeeds (addWhileFull), the pod
// starts with its port (check). Once the filesystem has room the refusal is
// in the driver's status (checkStatusWants) until a prepare of the kubelet's
// (dra-kubelet-sync) succeeds.
func (w *world) draCheckpointFull() {
	c := w.pickClaim(func(c *draClaim) bool { return c.state == claimPrepared && w.nodes[c.node].cmd != nil })
	if c == nil || !w.proxy.Up() || !w.nriConnected(c.node, draRetryFor) || !w.draRegister(c.node, draRetryFor) {
		return
	}
	i := c.node
	n := w.nodes[i]
	// A claim of the other rail, whose pool has a block on the node: its
	// prepare gets as far as recording the claim.
	nc := &draClaim{node: i, what: "rail", pool: poolDefs[3]}
	if c.rail == nc.pool.rail {
		nc.pool = poolDefs[4]
	}
	nc.rail = nc.pool.rail
	if !w.nodeBlock(i, v1alpha1.PoolKey(nc.pool.kind, nc.pool.name)).Start.IsValid() || !w.draAllocate(nc) {
		return
	}
	if c.pod != nil {
		w.podStop(c, false)
	}
	var stopSlow func()
	if w.rng.IntN(2) == 0 {
		stopSlow = w.slowFile(filepath.Join(n.sysfs, "sys", "class", "net", "enp225s0f1np1", "operstate"), n.dir, 2*time.Second)
		time.Sleep(1100 * time.Millisecond) // past the daemon's inventory cache
	}
	free := w.fillFilesystem(n)
	w.counts["dra-checkpoint-filled"]++
	w.tracef("%s's filesystem (store, DRA checkpoint) is full; %s is prepared beside the start of %s's pod", n.name, nc, c.name)
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: namespace, Uid: string(nc.uid), Name: nc.name}}}
	type answer struct {
		resp *drapb.NodePrepareResourcesResponse
		err  error
	}
	done := make(chan answer, 1)
	ctx, cancel := context.WithTimeout(w.ctx, draCallTimeout)
	plugin := n.dra
	go func() {
		resp, err := plugin.NodePrepareResources(ctx, req)
		done <- answer{resp, err}
	}()
	if stopSlow != nil {
		time.Sleep(500 * time.Millisecond)
	} else {
		time.Sleep(time.Duration(w.rng.IntN(20)) * time.Millisecond)
	}
	w.podStart(c)
	w.addWhileFull(i)
	a := <-done
	cancel()
	free()
	if stopSlow != nil {
		stopSlow()
	}
	w.tracef("%s's filesystem has room again", n.name)
	w.checkDaemonsRun()
	refusal := ""
	switch {
	case a.err != nil:
		nc.state = claimUncertain
		nc.uncertainIn = append(nc.uncertainIn, w.nodeBlock(i, v1alpha1.PoolKey(nc.pool.kind, nc.pool.name)))
		w.tracef("kubelet: prepare %s failed as a whole: %v", nc, firstLine(a.err))
	case a.resp.Claims[string(nc.uid)] == nil:
		w.fail("prepare %s: the answer %v has no entry for the claim", nc, a.resp.Claims)
	case a.resp.Claims[string(nc.uid)].Error == "":
		w.violation("prepared-unrecorded", "%s was prepared while its checkpoint's filesystem was full: the claim cannot have "+
			"been recorded (%v)", nc, a.resp.Claims[string(nc.uid)].Devices)
		nc.state = claimUncertain
	default:
		// Refused for the write, or before it (its port in use by a NAD's
		// pod, say).
		refusal = a.resp.Claims[string(nc.uid)].Error
		w.tracef("kubelet: prepare %s refused: %s", nc, refusal)
		if strings.Contains(refusal, "no space left on device") {
			w.counts["dra-checkpoint-full-refused"]++
		} else {
			w.counts["dra-checkpoint-full-refused-before-write"]++
		}
	}
	if refusal != "" {
		claim := namespace + "/" + nc.name
		w.wantStatus(i, statusWant{kind: "failure-not-visible", seen: "dra-checkpoint-full-visible",
			what: fmt.Sprintf("the prepare of %s failed (%s)", nc, refusal),
			ok: func(st nicdra.DriverStatus) bool {
				f := failureOf(st, nicdra.FailedPrepare, claim, "")
				return f != nil && f.Message == refusal
			},
			moot: func() bool { return w.claims[nc.uid] != nc || nc.state != claimPending }}) // prepared since, or gone
	}
}

// addWhileFull is a CNI ADD on node i while its filesystem is full, in a
// network whose pool has a block on the node: the store's log is written in
// place, so the CNI path must serve.
func (w *world) addWhileFull(i int) {
	var cands []network
	for _, nw := range networks[:5] {
		if w.nodeBlock(i, v1alpha1.PoolKey(nw.pool.kind, nw.pool.name)).Start.IsValid() {
			cands = append(cands, nw)
		}
	}
	if len(cands) == 0 {
		return
	}
	w.nextID++
	a := attachment{node: i, net: cands[w.rng.IntN(len(cands))], containerID: fmt.Sprintf("c%d", w.nextID)}
	out, err := w.call("ADD", a, nil)
	if err != nil {
		w.uncertain[key(a)] = a
		w.tracef("ADD %s while the filesystem is full failed: %v", a, firstLine(err))
		if strings.Contains(err.Error(), "no space left") || strings.Contains(err.Error(), "nothing more is written") {
			w.violation("cni-path-full", "ADD %s failed for the full filesystem, which only the DRA checkpoint's writes need: %v", a, err)
		}
		return
	}
	a.ip = resultIP(w, out)
	w.live[key(a)] = a
	w.counts["cni-add-while-full"]++
	w.tracef("ADD %s while the filesystem is full", a)
}

// ---- a CNI ADD and a prepare racing for one port ----

// draCNIRace: a CNI ADD whose NAD names a rail port as its master and the
// prepare of a claim for that port race (each started after a random delay
// of up to 30 ms). One of them gets the port and the other is refused,
// saying why: the ADD with "held by DRA claim", the prepare with "a pod's
// CNI attachment is taking it" or "in use by" (its port withheld, or in the
// ledger's InUse); never both (check: checkPorts'
// two-owners). Both may be refused, the ADD for reasons of its own (its
// store commit meets a fault), the prepare for one of the ADD's.
func (w *world) draCNIRace() {
	i := w.rng.IntN(nodeCount)
	n := w.nodes[i]
	if n.cmd == nil || !w.proxy.Up() || !w.draRegister(i, draRetryFor) {
		return
	}
	// A rail whose pool has a block on the node: both sides can get the port.
	nc := &draClaim{node: i, what: "rail", pool: []poolDef{poolDefs[3], poolDefs[4]}[w.rng.IntN(2)]}
	if !w.nodeBlock(i, v1alpha1.PoolKey(nc.pool.kind, nc.pool.name)).Start.IsValid() {
		return
	}
	nc.rail = nc.pool.rail
	p := w.portNamed(i, nc.rail)
	for _, k := range sortedKeys(w.live) {
		if a := w.live[k]; a.node == i && slices.Contains(w.masterPorts(i, a.master), p) {
			return // an attachment has it already: no race
		}
	}
	if !w.draAllocate(nc) {
		return
	}
	if nc.device != p.device {
		w.fail("the scheduler gave %s device %s, not the rail's port %s (%s)", nc, nc.device, p.name, p.device)
	}
	w.nextID++
	a := attachment{node: i, net: networkOfRail(p.name), containerID: fmt.Sprintf("c%d", w.nextID), master: p.name}
	w.podUID("ADD", a) // its pod first: the ADD below runs beside the model
	type answer struct {
		out []byte
		err error
	}
	added := make(chan answer, 1)
	addAfter := time.Duration(w.rng.IntN(30)) * time.Millisecond
	prepareAfter := time.Duration(w.rng.IntN(30)) * time.Millisecond
	go func() {
		time.Sleep(addAfter)
		out, err := w.call("ADD", a, nil)
		added <- answer{out, err}
	}()
	time.Sleep(prepareAfter)
	w.draPrepare(nc)
	r := <-added
	w.counts["dra-cni-raced"]++
	if r.err == nil {
		a.ip = resultIP(w, r.out)
		w.live[key(a)] = a
		w.tracef("ADD %s master=%s (%s after the race began; the prepare %s after)", a, p.name, addAfter, prepareAfter)
	} else {
		w.uncertain[key(a)] = a
		w.tracef("ADD %s master=%s failed (%s after the race began; the prepare %s after): %v", a, p.name, addAfter, prepareAfter,
			firstLine(r.err))
	}
	switch {
	case r.err == nil && nc.state == claimPrepared:
		w.violation("two-owners", "the ADD %s and the prepare of %s both got port %s of %s", a, nc, p.name, n.name)
	case r.err == nil && nc.state == claimPending:
		if !strings.Contains(nc.refusal, "a pod's CNI attachment is taking it") && !strings.Contains(nc.refusal, "in use by") {
			w.counts["dra-cni-race-prepare-refused-otherwise"]++
			return
		}
		w.counts["dra-cni-race-cni-won"]++
	case r.err != nil && nc.state == claimPrepared:
		if !strings.Contains(r.err.Error(), "is held by DRA claim") {
			w.counts["dra-cni-race-add-failed-otherwise"]++
			return
		}
		w.counts["dra-cni-race-prepare-won"]++
	default:
		w.counts["dra-cni-race-neither"]++
	}
}

// ---- a NAD whose master is a bond ----

// masterPorts are the ports a NAD's master names on node i: the port of that
// name, or the slaves of the bond.
func (w *world) masterPorts(i int, master string) []*hostPort {
	if master == bondName && w.nodes[i].bonded {
		return []*hostPort{w.portNamed(i, bondSlaves[0]), w.portNamed(i, bondSlaves[1])}
	}
	if p := w.portNamed(i, master); p != nil {
		return []*hostPort{p}
	}
	return nil
}

// bondSetup makes bond0 over bondSlaves in node i's NIC tree, as the kernel
// shows a bond in sysfs (fakesysfs does so for a layout's Master): a virtual
// netdev with a lower_<slave> link to each slave, which has master and
// upper_bond0 links to it. The host's namespace keeps the slaves' veths as
// they are: the CNI path and the driver find the bond's ports in sysfs.
func (w *world) bondSetup(i int) {
	n := w.nodes[i]
	if n.bonded {
		return
	}
	sys := func(parts ...string) string { return filepath.Join(append([]string{n.tree.Root, "sys"}, parts...)...) }
	link := func(target, name string) {
		rel, err := filepath.Rel(filepath.Dir(name), target)
		if err == nil {
			err = os.Symlink(rel, name)
		}
		if err != nil {
			w.fail("bond %s on %s: linking %s: %v", bondName, n.name, name, err)
		}
	}
	m := sys("devices", "virtual", "net", bondName)
	if err := os.MkdirAll(m, 0o755); err != nil {
		w.fail("bond %s on %s: %v", bondName, n.name, err)
	}
	for f, v := range map[string]string{"type": "1", "operstate": "up"} {
		if err := os.WriteFile(filepath.Join(m, f), []byte(v+"\n"), 0o644); err != nil {
			w.fail("bond %s on %s: %v", bondName, n.name, err)
		}
	}
	link(m, sys("class", "net", bondName))
	for _, s := range bondSlaves {
		dir, err := filepath.EvalSymlinks(sys("class", "net", s))
		if err != nil {
			w.fail("bond %s on %s: slave %s: %v", bondName, n.name, s, err)
		}
		link(m, filepath.Join(dir, "master"))
		link(m, filepath.Join(dir, "upper_"+bondName))
		link(dir, filepath.Join(m, "lower_"+s))
	}
	n.bonded = true
	w.tracef("%s: %s over %s in its NIC tree", n.name, bondName, strings.Join(bondSlaves, ", "))
}

// cniBondMaster: a NAD (macvlan) whose master is bond0, a bond of the
// node's two BlueField-3 ports, then a claim for one of its slaves (a
// scheduler that read the devices before the ADD). The ADD is refused when
// a claim holds a slave; otherwise it holds both: the driver withholds both
// from its devices (its status says so), and the claim's prepare is refused
// for the port in use by the NAD's pod, while the attachment lives.
func (w *world) cniBondMaster() {
	i := w.rng.IntN(nodeCount)
	n := w.nodes[i]
	if n.cmd == nil || !w.proxy.Up() || !w.draRegister(i, draRetryFor) {
		return
	}
	w.bondSetup(i)
	slaves := w.masterPorts(i, bondName)
	var holder *draClaim
	for _, uid := range sortedKeys(claimKeys(w.claims)) {
		c := w.claims[types.UID(uid)]
		if c.node == i && c.state == claimPrepared && slices.ContainsFunc(slaves, func(p *hostPort) bool { return p.device == c.device }) {
			holder = c
		}
	}
	w.nextID++
	a := attachment{node: i, net: networks[w.rng.IntN(5)], containerID: fmt.Sprintf("c%d", w.nextID), master: bondName}
	out, err := w.call("ADD", a, nil)
	if err != nil {
		w.uncertain[key(a)] = a
		w.tracef("ADD %s master=%s failed: %v", a, bondName, firstLine(err))
		if holder != nil && strings.Contains(err.Error(), "is held by DRA claim") {
			w.counts["cni-bond-master-refused-for-claim"]++
		}
		return
	}
	a.ip = resultIP(w, out)
	w.live[key(a)] = a
	w.counts["cni-bond-master-ok"]++
	w.tracef("ADD %s master=%s", a, bondName)
	if holder != nil {
		w.violation("two-owners", "ADD %s with master %s succeeded, but %s holds one of the bond's ports", a, bondName, holder)
	}
	// Neither slave is published: both are in use by the NAD's pod.
	if !w.waitStatus(i, 5*time.Second, func(st nicdra.DriverStatus) bool {
		for _, p := range slaves {
			if !slices.ContainsFunc(st.Withheld, func(d nicdra.WithheldDevice) bool {
				return d.PCIAddress == p.pci && strings.HasPrefix(d.Reason, nicdra.WithheldInUse)
			}) {
				return false
			}
		}
		return true
	}) {
		w.violation("bond-slave-published", "ADD %s with master %s holds both its ports, but ipam-node on %s does not withhold both "+
			"as in use within 5s (withheld: %+v)", a, bondName, n.name, w.driverStatus(i).Withheld)
	}
	// A claim for a slave: its pool named outright, one with a block on the
	// node if there is one, so that only the port can refuse it.
	s := slaves[w.rng.IntN(len(slaves))]
	if w.pickClaimExists(func(c *draClaim) bool { return c.node == i && c.device == s.device }) {
		return
	}
	nc := &draClaim{node: i, what: "pool", rail: s.name, device: s.device, pool: poolDefs[1]}
	for _, p := range []poolDef{poolDefs[0], poolDefs[1]} {
		if w.nodeBlock(i, v1alpha1.PoolKey(p.kind, p.name)).Start.IsValid() {
			nc.pool = p
		}
	}
	nc.config = fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"pool":%q}`, nicdra.ConfigAPIVersion, nicdra.ConfigKind, nc.pool.name)
	w.nextClaim++
	nc.name = fmt.Sprintf("d%d", w.nextClaim)
	w.draCreate(nc)
	w.claims[nc.uid] = nc
	w.tracef("create %s config=%s (a slave of %s)", nc, nc.config, bondName)
	w.draPrepare(nc)
	switch {
	case nc.state == claimPrepared:
		w.violation("two-owners", "%s was prepared while the attachment %s holds %s over its port", nc, a, bondName)
	case strings.Contains(nc.refusal, "in use by"):
		w.counts["cni-bond-slave-claim-refused"]++
	default:
		w.counts["cni-bond-slave-claim-refused-otherwise"]++
	}
}

// ---- the NRI plugin's connection dropped ----

// draNRIReconnect: the NRI plugin's connection to the runtime drops (as
// when containerd restarts), and the plugin connects again by itself. A
// prepared claim's pod starts before it is back, its first container
// created too half the time; another claim's pod of the node, if any,
// starts up to 300 ms after the runtime takes connections again, around the
// plugin's return. Each pod must end up with its port (the plugin's
// synchronization attaches what started while it was away, the pod's hook
// the rest). A container created while the plugin was away has its RDMA
// devices all the same: the runtime gives them by the claim's CDI spec
// (--dra-cdi-dir), so the driver records nothing for it.
func (w *world) draNRIReconnect() {
	noPod := func(c *draClaim) bool { return c.state == claimPrepared && c.pod == nil && w.nodes[c.node].cmd != nil }
	c := w.pickClaim(noPod)
	if c == nil || !w.nriConnected(c.node, draRetryFor) {
		return
	}
	i := c.node
	n := w.nodes[i]
	nn := n.nri
	second := w.pickClaim(func(x *draClaim) bool { return noPod(x) && x.node == i && x != c })
	synced := nn.syncs.Load()
	nn.proxy.drop()
	w.counts["dra-nri-dropped"]++
	w.tracef("runtime on %s: the NRI plugin's connection drops", n.name)
	pod, err := w.podRun(c)
	if err != nil {
		w.fail("RunPodSandbox of %s's pod with no NRI plugin connected: %v", c, err)
	}
	withContainer := w.rng.IntN(2) == 0
	ctr := &api.Container{Id: "ctr-" + pod.ns, PodSandboxId: pod.sandbox().Id, Name: "main", State: api.ContainerState_CONTAINER_RUNNING}
	if withContainer {
		w.createContainer(n, pod, ctr)
	}
	w.tracef("runtime on %s: %s's pod started before the plugin is back (its container too: %t)", n.name, c.name, withContainer)
	nn.proxy.resume()
	if second != nil {
		after := time.Duration(w.rng.IntN(300)) * time.Millisecond
		time.Sleep(after)
		if _, err := w.podRun(second); err != nil {
			w.tracef("runtime on %s: RunPodSandbox of %s's pod, %s after NRI takes connections again, refused: %v", n.name,
				second.name, after, firstLine(err))
		} else {
			w.tracef("runtime on %s: %s's pod started %s after NRI takes connections again", n.name, second.name, after)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for nn.syncs.Load() <= synced {
		if time.Now().After(deadline) {
			w.violation("nri-reconnect", "the NRI plugin of %s did not connect again within 20s of its connection's drop", n.name)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.tracef("runtime on %s: the NRI plugin is back", n.name)
	for _, x := range []*draClaim{c, second} {
		if x == nil || x.pod == nil {
			continue
		}
		p := w.portOf(i, x.device)
		deadline := time.Now().Add(5 * time.Second)
		for w.links(x.pod.ns)[p.mac] == nil {
			if time.Now().After(deadline) {
				w.violation("pod-without-device", "%s's pod runs, but 5s after the NRI plugin came back its port %s is not in it", x, p.name)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !withContainer {
		w.createContainer(n, pod, ctr) // with the plugin there: its devices are there
		return
	}
	// The daemons run with --dra-cdi-dir: the runtime gives a container its
	// claim's RDMA devices by the claim's CDI spec when it creates it, with or
	// without the NRI plugin, so such a container lacks nothing and the driver
	// records no failure for it (it did when NRI gave the devices).
}

// createContainer is the runtime creating a container of the pod (its
// CreateContainer, relayed to the plugin when connected), which it reports
// at its next synchronizations.
func (w *world) createContainer(n *simNode, pod *draPod, ctr *api.Container) {
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	_, err := n.nri.rt.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod.sandbox(), Container: ctr})
	cancel()
	if err != nil {
		w.violation("create-container", "CreateContainer %s of pod %s on %s: %v", ctr.Name, pod.name, n.name, err)
		return
	}
	n.nri.mu.Lock()
	n.nri.containers[pod.uid] = append(n.nri.containers[pod.uid], ctr)
	n.nri.mu.Unlock()
}
