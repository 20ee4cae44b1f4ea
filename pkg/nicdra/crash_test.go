package nicdra_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// Fault injection for the prepare's crash points: the allocation state and
// the checkpoint writes fail, or the daemon dies ("crash": a panic, after
// which the test restarts it over the same store and checkpoint), at the
// n-th call, before or after the call did its work.

type faultMode int

const (
	failBefore  faultMode = iota // an error, nothing done
	failAfter                    // done, then an error (a commit whose reply was lost)
	crashBefore                  // the daemon dies before the call
	crashAfter                   // the daemon dies once the call is done
)

func (m faultMode) String() string {
	return [...]string{"fail", "failAfterDoing", "crashBefore", "crashAfter"}[m]
}

var errInjected = errors.New("injected failure")

// crash is the panic value of an injected crash.
type crash struct{ what string }

// fault fires at the n-th call of op ("allocate", "deallocate", "write").
type fault struct {
	op   string
	n    int
	mode faultMode
}

// faults counts calls and fires the fault once.
type faults struct {
	f     fault
	calls map[string]int
	fired bool
}

// at runs do as the call of op would, with the fault when it is its turn.
func (fs *faults) at(op string, do func() error) error {
	if fs.calls == nil {
		fs.calls = map[string]int{}
	}
	fs.calls[op]++
	if fs.fired || fs.f.op != op || fs.f.n != fs.calls[op] {
		return do()
	}
	fs.fired = true
	switch fs.f.mode {
	case failBefore:
		return errInjected
	case crashBefore:
		panic(crash{op})
	}
	err := do()
	if fs.f.mode == crashAfter {
		panic(crash{op})
	}
	return errors.Join(err, errInjected)
}

// faultyAllocator is the allocation state with faults.
type faultyAllocator struct {
	nicdra.Allocator
	fs *faults
}

func (a *faultyAllocator) Allocate(ctx context.Context, req *nodealloc.Request) (res []nodealloc.Result, err error) {
	err = a.fs.at("allocate", func() error {
		res, err = a.Allocator.Allocate(ctx, req)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (a *faultyAllocator) Deallocate(ctx context.Context, req *nodealloc.Request) error {
	return a.fs.at("deallocate", func() error { return a.Allocator.Deallocate(ctx, req) })
}

// faultyPreparer is the node's Preparer whose allocation state and checkpoint
// writes fail as fs says.
func (n *node) faultyPreparer(fs *faults) *nicdra.Preparer {
	p := n.preparer()
	p.Allocator = &faultyAllocator{Allocator: n.alloc, fs: fs}
	p.WriteCheckpoint = func(c *nicdra.Checkpoint) error {
		return fs.at("write", func() error { return p.Checkpoint.Save(c) })
	}
	return p
}

// try runs op, turning an injected crash into crashed.
func try(op func() error) (crashed bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crash); !ok {
				panic(r)
			}
			crashed = true
		}
	}()
	return false, op()
}

// twoDevices is a claim of two devices: one on rail ibp24s0 (dual-stack, from
// the rail's two pools), one with a static address in pool spare.
func twoDevices(uid string) *resourceapi.ResourceClaim {
	return claim(uid, map[string]string{"a": "pci-0000-18-00-0", "b": "pci-0000-40-00-0"},
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "pool": "spare", "ips": ["10.99.0.7"]}`, "b"))
}

// fileClaims is the checkpoint as a restarted daemon reads it.
func (n *node) fileClaims(t *testing.T) map[types.UID]nicdra.PreparedClaim {
	t.Helper()
	c, err := nicdra.CheckpointFile{Path: filepath.Join(n.dir, "checkpoint.json")}.Load()
	if err != nil {
		t.Fatal(err)
	}
	return c.Claims
}

// heldOf lists the addresses the store holds for the claim UID.
func heldOf(t *testing.T, n *node, uid types.UID) []string {
	t.Helper()
	var out []string
	if err := n.alloc.EachAllocation("", func(_ string, a store.Allocation) error {
		if a.ContainerID == string(uid) {
			out = append(out, a.IP)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func addrsOf(devs []nicdra.PreparedDevice) []string {
	var out []string
	for _, d := range devs {
		for _, a := range d.Addresses {
			out = append(out, strings.Split(a, "/")[0])
		}
	}
	slices.Sort(out)
	return out
}

// checkPrepared checks that the claim is prepared, the same in the store,
// the checkpoint file, memory and what Prepare returned.
func checkPrepared(t *testing.T, n *node, p *nicdra.Preparer, uid types.UID, devs []nicdra.PreparedDevice) {
	t.Helper()
	held := heldOf(t, n, uid)
	if len(held) != 3 || !slices.Equal(held, addrsOf(devs)) || !slices.Contains(held, "10.99.0.7") {
		t.Errorf("the store holds %v for the claim, Prepare returned %v", held, addrsOf(devs))
	}
	pc, ok := n.fileClaims(t)[uid]
	if !ok || pc.State != nicdra.PrepareCompleted || !slices.Equal(addrsOf(pc.Devices), held) {
		t.Errorf("the checkpoint file has %+v (there: %t), the store %v", pc, ok, held)
	}
	mem, err := p.Claims()
	if err != nil || mem[uid].State != nicdra.PrepareCompleted || !slices.Equal(addrsOf(mem[uid].Devices), held) {
		t.Errorf("memory has %+v (%v), the store %v", mem[uid], err, held)
	}
}

// checkUnprepared checks that nothing is held or recorded for the claim, and
// that its static address can be prepared again by another claim.
func checkUnprepared(t *testing.T, n *node, p *nicdra.Preparer, uid types.UID) {
	t.Helper()
	if held := heldOf(t, n, uid); len(held) != 0 {
		t.Errorf("the store holds %v for the unprepared claim", held)
	}
	if pc, ok := n.fileClaims(t)[uid]; ok {
		t.Errorf("the checkpoint file still has the unprepared claim: %+v", pc)
	}
	if mem, err := p.Claims(); err != nil || len(mem) != 0 {
		t.Errorf("memory still has claims: %v %v", mem, err)
	}
	other := twoDevices(string(uid) + "-next")
	devs, err := p.Prepare(t.Context(), other)
	if err != nil {
		t.Fatalf("a claim for the same devices and static address after the unprepare: %v", err)
	}
	checkPrepared(t, n, p, other.UID, devs)
}

// Every crash point of a prepare, and every failure of the allocation state
// or of a checkpoint write on its way (also on its failure path, where it
// releases what it got): after it, the daemon restarted (after a crash) or
// not (after a failure), the next Prepare converges to the claim prepared,
// and Unprepare instead to nothing held and nothing recorded, with its
// static address free for another claim. The store and the checkpoint
// agree at the end of each.
func TestPrepareConvergesAfterEveryCrashPoint(t *testing.T) {
	fastDisk(t)
	var cases []struct {
		allocFails int // the allocation that fails on its own (0: none), to walk the failure path
		f          fault
	}
	// A prepare calls Allocate twice (one per device) and writes the
	// checkpoint twice; on its failure path (the second allocation failing)
	// it calls Deallocate twice and writes twice.
	calls := map[string]int{"allocate": 2, "deallocate": 2, "write": 2}
	for _, allocFails := range []int{0, 2} {
		for _, op := range []string{"allocate", "deallocate", "write"} {
			for n := 1; n <= calls[op]; n++ {
				if op == "deallocate" && allocFails == 0 || op == "allocate" && n > allocFails && allocFails > 0 {
					continue // never called
				}
				for _, m := range []faultMode{failBefore, failAfter, crashBefore, crashAfter} {
					cases = append(cases, struct {
						allocFails int
						f          fault
					}{allocFails, fault{op, n, m}})
				}
			}
		}
	}
	for _, c := range cases {
		for _, then := range []string{"prepare", "unprepare"} {
			t.Run(fmt.Sprintf("allocation %d fails/%s %d %s/then %s", c.allocFails, c.f.op, c.f.n, c.f.mode, then), func(t *testing.T) {
				n := newNode(t)
				fs := &faults{f: c.f}
				p := n.faultyPreparer(fs)
				if c.allocFails > 0 {
					// The allocation that fails on its own, beneath the fault.
					inner := &faults{f: fault{"allocate", c.allocFails, failBefore}}
					p.Allocator = &faultyAllocator{Allocator: &faultyAllocator{Allocator: n.alloc, fs: inner}, fs: fs}
				}
				run(t, n, p, fs, then)
			})
		}
	}
}

// run prepares twoDevices("u") with p, whose faults are fs, then restarts
// the daemon when it crashed, and does then with a Preparer without faults.
func run(t *testing.T, n *node, p *nicdra.Preparer, fs *faults, then string) {
	t.Helper()
	c := twoDevices("u")
	crashed, err := try(func() error {
		_, err := p.Prepare(t.Context(), c)
		return err
	})
	if !fs.fired {
		t.Skip("the fault is past the prepare's last call")
	}
	if !crashed && err == nil && fs.f.mode != failAfter {
		t.Errorf("Prepare succeeded despite the fault")
	}
	after := p
	if crashed {
		n.open(t) // the daemon restarts: the allocation state from the store
		after = n.preparer()
	} else {
		// The same daemon goes on, its faults spent.
		after.Allocator, after.WriteCheckpoint = n.alloc, nil
	}
	switch then {
	case "prepare":
		devs, err := after.Prepare(t.Context(), c)
		if err != nil {
			t.Fatalf("prepare after the fault (%v): %v", fs.f, err)
		}
		checkPrepared(t, n, after, c.UID, devs)
		again, err := n.preparer().Prepare(t.Context(), c)
		if err != nil || !slices.Equal(addrsOf(again), addrsOf(devs)) {
			t.Errorf("after a restart: %v %v, want %v", addrsOf(again), err, addrsOf(devs))
		}
	case "unprepare":
		if err := after.Unprepare(t.Context(), c.UID); err != nil {
			t.Fatalf("unprepare after the fault (%v): %v", fs.f, err)
		}
		checkUnprepared(t, n, after, c.UID)
	}
}

// A release that fails on a prepare's failure path is not ignored: the
// error says the claim stays recorded as started, the checkpoint has it with
// every device and its pools, and Unprepare then releases all of it.
func TestPrepareKeepsWhatItCannotRelease(t *testing.T) {
	fastDisk(t)
	n := newNode(t)
	fs := &faults{f: fault{"deallocate", 1, failBefore}}
	inner := &faults{f: fault{"allocate", 2, failBefore}}
	p := n.preparer()
	p.Allocator = &faultyAllocator{Allocator: &faultyAllocator{Allocator: n.alloc, fs: inner}, fs: fs}
	c := twoDevices("k")
	_, err := p.Prepare(t.Context(), c)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "stays recorded as started") {
		t.Fatalf("prepare: %v, want the failure and that the claim stays recorded", err)
	}
	if held := heldOf(t, n, c.UID); len(held) != 2 {
		t.Fatalf("held %v, want the first device's two addresses", held)
	}
	pc := n.fileClaims(t)[c.UID]
	if pc.State != nicdra.PrepareStarted || len(pc.Devices) != 2 || !slices.Equal(pc.Devices[0].Pools, []string{"rail0", "rail0-v6"}) ||
		!slices.Equal(pc.Devices[1].Pools, []string{"spare"}) {
		t.Fatalf("checkpoint %+v, want the claim started with both devices and their pools", pc)
	}
	p.Allocator = n.alloc
	if err := p.Unprepare(t.Context(), c.UID); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, n, p, c.UID)
}

// A prepare cut short and finished after a restart uses the pools it
// recorded, even when the rail's pools changed meanwhile: it never takes an
// address in a second pool for the same device.
func TestPrepareFinishesInTheRecordedPools(t *testing.T) {
	n := newNode(t)
	fs := &faults{f: fault{"allocate", 2, crashBefore}}
	c := twoDevices("r")
	if crashed, _ := try(func() error { _, err := n.faultyPreparer(fs).Prepare(t.Context(), c); return err }); !crashed {
		t.Fatal("no crash")
	}
	n.open(t)
	p := n.preparer()
	p.PoolsForRail = func(string, string) ([]string, bool) { return []string{"spare"}, true } // relabelled meanwhile
	devs, err := p.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(devs[0].Pools, []string{"rail0", "rail0-v6"}) {
		t.Errorf("finished in pools %v, want the recorded rail0, rail0-v6", devs[0].Pools)
	}
	checkPrepared(t, n, p, c.UID, devs)
}

// A randomised model-based test: sequences of prepares and unprepares of
// three claims, each call with a random fault (or none), the daemon
// restarted after each crash. After every step: nothing is held for a claim
// the checkpoint file does not have, and a claim the file has as prepared
// holds exactly its recorded addresses; at the end, unpreparing all leaves
// nothing, and preparing all again succeeds. Replay with
// NICDRA_MODEL_SEED=<seed>.
func TestPrepareModel(t *testing.T) {
	seed := rand.Uint64()
	if s := os.Getenv("NICDRA_MODEL_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (replay: NICDRA_MODEL_SEED=%d)", seed, seed)
	fastDisk(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	n := newNode(t)
	claims := []*resourceapi.ResourceClaim{
		claim("m1", map[string]string{"nic": "pci-0000-18-00-0"}),
		claim("m2", map[string]string{"nic": "pci-0000-40-00-0"},
			opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "pool": "spare", "ips": ["10.99.0.7"]}`)),
		claim("m3", map[string]string{"x": "pci-0000-4f-00-0", "y": "pci-0000-5e-00-0"},
			opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "pool": "spare"}`)),
	}
	p := n.preparer()
	crashes, failures := 0, 0
	for step := range 150 {
		c := claims[rng.IntN(len(claims))]
		fs := &faults{}
		if rng.IntN(3) > 0 {
			fs.f = fault{[]string{"allocate", "deallocate", "write"}[rng.IntN(3)], 1 + rng.IntN(2), faultMode(rng.IntN(4))}
		}
		fp := p // the running daemon, with this step's faults
		fp.Allocator = &faultyAllocator{Allocator: n.alloc, fs: fs}
		fp.WriteCheckpoint = func(cp *nicdra.Checkpoint) error {
			return fs.at("write", func() error { return fp.Checkpoint.Save(cp) })
		}
		op := "prepare"
		if rng.IntN(2) == 0 {
			op = "unprepare"
		}
		crashed, err := try(func() error {
			if op == "prepare" {
				_, err := fp.Prepare(t.Context(), c)
				return err
			}
			return fp.Unprepare(t.Context(), c.UID)
		})
		what := fmt.Sprintf("step %d: %s %s with fault %+v (mode %s): crashed %t, %v", step, op, c.UID, fs.f, fs.f.mode, crashed, err)
		if err != nil {
			failures++
		}
		if crashed {
			crashes++
			n.open(t)
			p = n.preparer()
		} else {
			p.Allocator, p.WriteCheckpoint = n.alloc, nil
		}
		checkModel(t, n, what)
		if t.Failed() {
			t.Fatalf("after %s", what)
		}
	}
	t.Logf("%d crashes, %d failed calls", crashes, failures)
	if crashes == 0 || failures == 0 {
		t.Errorf("the sequence had %d crashes and %d failures: no fault exercised", crashes, failures)
	}
	for _, c := range claims {
		if err := p.Unprepare(t.Context(), c.UID); err != nil {
			t.Fatalf("final unprepare of %s: %v", c.UID, err)
		}
	}
	if held := heldBy(t, n); len(held) != 0 || len(n.fileClaims(t)) != 0 {
		t.Fatalf("after unpreparing all: held %v, checkpoint %v", held, n.fileClaims(t))
	}
	for _, c := range claims {
		if _, err := p.Prepare(t.Context(), c); err != nil {
			t.Fatalf("final prepare of %s: %v", c.UID, err)
		}
	}
	checkModel(t, n, "the final prepares")
}

// checkModel checks the store against the checkpoint file.
func checkModel(t *testing.T, n *node, what string) {
	t.Helper()
	file := n.fileClaims(t)
	byClaim := map[types.UID][]string{}
	if err := n.alloc.EachAllocation("", func(_ string, a store.Allocation) error {
		byClaim[types.UID(a.ContainerID)] = append(byClaim[types.UID(a.ContainerID)], a.IP)
		pc, ok := file[types.UID(a.ContainerID)]
		if !ok || !slices.ContainsFunc(pc.Devices, func(d nicdra.PreparedDevice) bool { return d.Request+":"+d.Device == a.IfName }) {
			t.Errorf("%s: the store holds %s for %s %s, which the checkpoint file does not record", what, a.IP, a.ContainerID, a.IfName)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for uid, pc := range file {
		slices.Sort(byClaim[uid])
		if pc.State == nicdra.PrepareCompleted && !pc.Unpreparing && !slices.Equal(byClaim[uid], addrsOf(pc.Devices)) {
			t.Errorf("%s: claim %s is prepared with %v, the store holds %v", what, uid, addrsOf(pc.Devices), byClaim[uid])
		}
	}
}

// fastDisk puts the test's temporary directories (store, checkpoint) in
// memory when the node has /dev/shm: these tests are about what is written,
// not about how fast a disk syncs, and they write a lot.
func fastDisk(t *testing.T) {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		t.Setenv("TMPDIR", "/dev/shm")
	}
}
