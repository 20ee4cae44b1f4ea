package nicdra_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// blockingAllocator is the allocation state, whose Allocate waits for
// release once entered is closed: a prepare stuck in a slow store commit.
type blockingAllocator struct {
	nicdra.Allocator
	entered, release chan struct{}
}

func (b *blockingAllocator) Allocate(ctx context.Context, req *nodealloc.Request) ([]nodealloc.Result, error) {
	close(b.entered)
	<-b.release
	return b.Allocator.Allocate(ctx, req)
}

// readyAndStuck prepares claim "ready" (pod-ready) with p, then starts
// preparing claim "slow" (pod-slow, pool spare), whose allocation waits until
// slow.release is closed; it returns once that prepare is stuck there, with
// the channel its outcome comes on.
func readyAndStuck(t *testing.T, n *node, p *nicdra.Preparer) (a, b *resourceapi.ResourceClaim, slow *blockingAllocator,
	done chan error) {
	t.Helper()
	a = claim("ready", map[string]string{"nic": "pci-0000-18-00-0"})
	a.Status.ReservedFor[0].UID = "pod-ready"
	if _, err := p.Prepare(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	b = claim("slow", map[string]string{"nic": "pci-0000-40-00-0"},
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "pool": "spare"}`))
	b.Status.ReservedFor[0].UID = "pod-slow"
	slow = &blockingAllocator{Allocator: n.alloc, entered: make(chan struct{}), release: make(chan struct{})}
	p.Allocator = slow
	done = make(chan error, 1)
	go func() {
		_, err := p.Prepare(context.Background(), b)
		done <- err
	}()
	<-slow.entered
	return a, b, slow, done
}

// The runtime's hooks answer from memory while a prepare is stuck (in the
// store, the sysfs scan, the checkpoint's fsyncs): PodDevices and
// DeviceAttached of a prepared pod return within milliseconds, not after the
// prepare; what DeviceAttached recorded reaches the checkpoint file once the
// prepare is done.
func TestHooksAnswerBesideASlowPrepare(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	a, b, slow, done := readyAndStuck(t, n, p)
	const bound = 100 * time.Millisecond // containerd gives a hook 2 s; a few ms is the goal
	start := time.Now()
	devs := p.PodDevices("pod-ready")
	if took := time.Since(start); took > bound || len(devs) != 1 {
		t.Errorf("PodDevices took %s beside a stuck prepare and returned %d devices", took, len(devs))
	}
	d := devs[0]
	d.MAC, d.MTU = "02:00:00:00:00:01", 2044
	start = time.Now()
	p.DeviceAttached("pod-ready", d)
	if took := time.Since(start); took > bound {
		t.Errorf("DeviceAttached took %s beside a stuck prepare", took)
	}
	if got := p.PodDevices("pod-ready"); len(got) != 1 || got[0].MAC != d.MAC || got[0].MTU != 2044 {
		t.Errorf("after DeviceAttached, memory has %+v", got)
	}
	if got := p.PodDevices("pod-slow"); len(got) != 0 {
		t.Errorf("the claim being prepared is handed to its sandbox already: %+v", got)
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the attach's MAC in the checkpoint file", func() error {
		pc := n.fileClaims(t)[a.UID]
		if len(pc.Devices) != 1 || pc.Devices[0].MAC != d.MAC || pc.Devices[0].MTU != 2044 {
			return fmt.Errorf("file has %+v", pc.Devices)
		}
		if len(n.fileClaims(t)[b.UID].Devices) != 1 {
			return fmt.Errorf("file lacks the slow claim")
		}
		return nil
	})
}

// A checkpoint write that fails (a full disk) while an attach waits to record
// itself refuses that prepare, clearly, and nothing else: ipam-node goes on (an
// attach's record used to clone the checkpoint the failed write had dropped from
// memory, in its own goroutine, and the process panicked, the CNI path with it);
// the attach's MAC and MTU stay in memory and reach the file with the next
// write that goes through (issue 45, item 3).
func TestFailedCheckpointWriteBesideAnAttach(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	var full atomic.Bool
	p.WriteCheckpoint = func(c *nicdra.Checkpoint) error {
		if full.Load() {
			return fmt.Errorf("writing the checkpoint: %w", syscall.ENOSPC)
		}
		return p.Checkpoint.Save(c)
	}
	a, b, slow, done := readyAndStuck(t, n, p)
	d := p.PodDevices("pod-ready")[0]
	d.MAC, d.MTU = "02:00:00:00:00:01", 2044
	p.DeviceAttached("pod-ready", d) // its write waits for the prepare
	full.Store(true)
	close(slow.release)
	if err := <-done; err == nil || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("the prepare whose checkpoint write failed returned %v, want the write's error", err)
	}
	time.Sleep(200 * time.Millisecond) // the attach's write runs, and fails too
	if got := p.PodDevices("pod-ready"); len(got) != 1 || got[0].MAC != d.MAC || got[0].MTU != 2044 {
		t.Errorf("after the failed writes, memory has %+v for the attached pod", got)
	}
	// The kubelet tries the prepare again, once the disk has room.
	full.Store(false)
	p.Allocator = n.alloc
	if _, err := p.Prepare(t.Context(), b); err != nil {
		t.Fatalf("the prepare tried again once the disk has room: %v", err)
	}
	if got := n.fileClaims(t)[b.UID]; len(got.Devices) != 1 {
		t.Errorf("the prepare tried again is not in the checkpoint file: %+v", got)
	}
	pc := n.fileClaims(t)[a.UID]
	if len(pc.Devices) != 1 || pc.Devices[0].MAC != d.MAC || pc.Devices[0].MTU != 2044 {
		t.Errorf("the attach's record is not in the checkpoint file after the next write: %+v", pc.Devices)
	}
}

// What an attach recorded, whose own write failed (a full filesystem) while
// no prepare or unprepare came after it, reaches the checkpoint file at the
// driver's next refresh (PersistAttached) once there is room: a restart
// before any other change must not lose the port's state before the attach,
// which the detach or the claim collection restores (the whole-system seed
// 199031 saw a port left down: the record of its attach, written while the
// filesystem was full, was lost at the next kill).
func TestAttachRecordWrittenAgainAfterAFailedWrite(t *testing.T) {
	n, p, a, full, writes := preparedOnAFillableDisk(t)
	full.Store(true)
	before := writes.Load()
	d := p.PodDevices("pod-ready")[0]
	up := true
	d.MAC, d.MTU, d.HostUp = "02:00:00:00:00:01", 2044, &up
	p.DeviceAttached("pod-ready", d)
	waitFor(t, "the attach's write tried", func() error {
		if writes.Load() == before {
			return errors.New("not yet")
		}
		return nil
	})
	p.PersistAttached() // still full: fails again, still waiting
	full.Store(false)
	if got := n.fileClaims(t)[a.UID]; len(got.Devices) != 1 || got.Devices[0].HostUp != nil {
		t.Fatalf("the file has the attach's record before any write went through: %+v", got.Devices)
	}
	p.PersistAttached()
	pc := n.fileClaims(t)[a.UID]
	if len(pc.Devices) != 1 || pc.Devices[0].MAC != d.MAC || pc.Devices[0].HostUp == nil || !*pc.Devices[0].HostUp {
		t.Errorf("the attach's record is not in the checkpoint file after a refresh with room: %+v", pc.Devices)
	}
	n2 := writes.Load()
	p.PersistAttached()
	if writes.Load() != n2 {
		t.Errorf("PersistAttached wrote the checkpoint with nothing waiting")
	}
}

// The driver's refresh never waits for a stuck prepare to write what an
// attach recorded: PersistAttached returns at once while one runs.
func TestPersistAttachedDoesNotWaitForAPrepare(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	_, _, slow, done := readyAndStuck(t, n, p)
	d := p.PodDevices("pod-ready")[0]
	d.MAC = "02:00:00:00:00:02"
	p.DeviceAttached("pod-ready", d) // dirty; its own write waits for the prepare
	start := time.Now()
	p.PersistAttached()
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("PersistAttached took %s beside a stuck prepare", took)
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the attach's record in the file once the prepare is done", func() error {
		for _, pc := range n.fileClaims(t) {
			for _, x := range pc.Devices {
				if x.MAC == d.MAC {
					return nil
				}
			}
		}
		return errors.New("not yet")
	})
}

// After an attach's write failed, the next attach's write goes through on its
// own (not only at the driver's refresh), with both records.
func TestNextAttachWritesAfterAFailedWrite(t *testing.T) {
	n, p, a, full, writes := preparedOnAFillableDisk(t)
	full.Store(true)
	before := writes.Load()
	d := p.PodDevices("pod-ready")[0]
	d.MAC = "02:00:00:00:00:01"
	p.DeviceAttached("pod-ready", d)
	waitFor(t, "the first attach's write tried", func() error {
		if writes.Load() == before {
			return errors.New("not yet")
		}
		return nil
	})
	full.Store(false)
	d.MTU = 2044 // the attach learns more
	p.DeviceAttached("pod-ready", d)
	waitFor(t, "the second attach's record in the file", func() error {
		pc := n.fileClaims(t)[a.UID]
		if len(pc.Devices) != 1 || pc.Devices[0].MAC != d.MAC || pc.Devices[0].MTU != 2044 {
			return fmt.Errorf("the file has %+v", pc.Devices)
		}
		return nil
	})
}

// preparedOnAFillableDisk is a node whose checkpoint writes fail with ENOSPC
// while full is set (writes counts them), with claim a prepared for pod
// "pod-ready".
func preparedOnAFillableDisk(t *testing.T) (n *node, p *nicdra.Preparer, a *resourceapi.ResourceClaim, full *atomic.Bool,
	writes *atomic.Int32) {
	t.Helper()
	n = newNode(t)
	p = n.preparer()
	full, writes = &atomic.Bool{}, &atomic.Int32{}
	p.WriteCheckpoint = func(c *nicdra.Checkpoint) error {
		writes.Add(1)
		if full.Load() {
			return fmt.Errorf("writing the checkpoint: %w", syscall.ENOSPC)
		}
		return p.Checkpoint.Save(c)
	}
	a = claim("ready", map[string]string{"nic": "pci-0000-18-00-0"})
	a.Status.ReservedFor[0].UID = "pod-ready"
	if _, err := p.Prepare(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	return n, p, a, full, writes
}

// The prepare records the device's host link (its MAC, MTU and state), so
// that a pod's stop still finds the device, and gives it back up as it was,
// when the attach's own record was lost with the process: ipam-node killed
// as the sandbox started, before the record reached the checkpoint (seen in
// the whole-system test with seed 291205: the detach found only the PCI
// address, which a veth port has no parent for, and left the port in the pod).
func TestPrepareRecordsTheHostLinkForAStopAfterALostAttachRecord(t *testing.T) {
	e := newAttachEnv(t, "ibp24s0", 2044)
	h := e.host.Handle(t)
	hostLink := link(t, e.host, "ibp24s0")
	if err := h.LinkSetUp(hostLink); err != nil {
		t.Fatal(err)
	}
	n := newNode(t)
	p := n.preparer()
	p.HostState = e.att.HostState
	c := claim("u1", map[string]string{"nic": "pci-0000-18-00-0"})
	if _, err := p.Prepare(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	rec := n.fileClaims(t)[c.UID].Devices
	mac := hostLink.Attrs().HardwareAddr.String()
	if len(rec) != 1 || rec[0].MAC != mac || rec[0].MTU != 2044 || rec[0].HostUp == nil || !*rec[0].HostUp {
		t.Fatalf("the checkpoint after the prepare: %+v, want the host link's MAC %s, MTU 2044 and up", rec, mac)
	}
	// The sandbox starts: the port moves into the pod, and the process dies
	// before what the attach learnt is written (DeviceAttached never runs).
	d := p.PodDevices("pod-uid")[0]
	if _, err := e.att.Attach(e.pod.Path, d); err != nil {
		t.Fatal(err)
	}
	if link(t, e.host, "ibp24s0") != nil || link(t, e.pod, d.InterfaceName) == nil {
		t.Fatal("the port is not in the pod after the attach")
	}
	// Restarted, the daemon knows the device from the checkpoint alone.
	restarted := n.preparer()
	d = restarted.PodDevices("pod-uid")[0]
	out, err := e.att.Detach(e.pod.Path, d)
	if err != nil || out != nicdra.Detached {
		t.Fatalf("the pod's stop after a restart: %s, %v", out, err)
	}
	e.checkOnHost(t, d, 2044)
	if up := link(t, e.host, "ibp24s0").Attrs().Flags&net.FlagUp != 0; !up {
		t.Errorf("ibp24s0 came back down; it was up before the pod")
	}
}
