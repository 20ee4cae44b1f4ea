package nicdra_test

import (
	"context"
	"fmt"
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

// The runtime's hooks answer from memory while a prepare is stuck (in the
// store, the sysfs scan, the checkpoint's fsyncs): PodDevices and
// DeviceAttached of a prepared pod return within milliseconds, not after the
// prepare; what DeviceAttached recorded reaches the checkpoint file once the
// prepare is done.
func TestHooksAnswerBesideASlowPrepare(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	a := claim("ready", map[string]string{"nic": "pci-0000-18-00-0"})
	a.Status.ReservedFor[0].UID = "pod-ready"
	if _, err := p.Prepare(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	b := claim("slow", map[string]string{"nic": "pci-0000-40-00-0"},
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "pool": "spare"}`))
	b.Status.ReservedFor[0].UID = "pod-slow"
	slow := &blockingAllocator{Allocator: n.alloc, entered: make(chan struct{}), release: make(chan struct{})}
	p.Allocator = slow
	done := make(chan error, 1)
	go func() {
		_, err := p.Prepare(context.Background(), b)
		done <- err
	}()
	<-slow.entered
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
