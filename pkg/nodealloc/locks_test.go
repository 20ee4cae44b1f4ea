package nodealloc_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/store"
)

// hookedStore is the real store with a hook run before every Commit, to make a
// commit stall or panic.
type hookedStore struct {
	*store.Store
	beforeCommit func()
}

func (s *hookedStore) Commit(puts []store.Put, deletes []store.Key) error {
	if s.beforeCommit != nil {
		s.beforeCommit()
	}
	return s.Store.Commit(puts, deletes)
}

// newHookedManager opens a manager over a fresh store whose commits run
// beforeCommit (when set), with the rail0 pool (v4Pool) configured.
func newHookedManager(t *testing.T, beforeCommit func(), opts ...nodealloc.Option) *nodealloc.Manager {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := nodealloc.New(&hookedStore{Store: st, beforeCommit: beforeCommit}, "node-1", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPool(v4Pool("rail0")); err != nil {
		t.Fatal(err)
	}
	return m
}

// mustPanic runs f, which must panic, and recovers as the gRPC server does.
func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s did not panic", what)
		}
	}()
	f()
}

// within runs f and returns its error, or fails the test when f has not returned
// after d (f is then left running).
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Errorf("%s did not return within %s", what, d)
		return nil
	}
}

// TestPanicUnderThePoolLockDoesNotWedgeThePool: a panic while a request holds the
// pool's lock, recovered by the caller (as the gRPC server's interceptor does),
// leaves the pool usable.
func TestPanicUnderThePoolLockDoesNotWedgeThePool(t *testing.T) {
	var panicNow atomic.Bool
	clock := func() time.Time {
		if panicNow.CompareAndSwap(true, false) {
			panic("injected: clock broke with the pool locked")
		}
		return time.Now()
	}
	m := newHookedManager(t, nil, nodealloc.WithClock(clock))
	panicNow.Store(true)
	mustPanic(t, "Allocate with a panicking clock", func() { _, _ = m.Allocate(t.Context(), req("c1", "rail0")) })

	for _, cid := range []string{"c2", "c1"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := within(t, 5*time.Second, "Allocate after the panic", func() error {
			_, err := m.Allocate(ctx, req(cid, "rail0"))
			return err
		})
		cancel()
		if err != nil {
			t.Fatalf("Allocate for %s after a panic under the pool's lock: %v (the pool is wedged)", cid, err)
		}
	}
	// The panicked request reserved nothing: .2 and .3 went to c2 and c1.
	if got := m.Allocations("rail0")["rail0"]; len(got) != 2 || got[0].IP != "10.0.0.3" || got[1].IP != "10.0.0.2" {
		t.Errorf("allocations after the panic = %+v, want c1 10.0.0.3 and c2 10.0.0.2", got)
	}
}

// TestPanicInCommitDoesNotWedgeTheInterface: a commit that panics (with no pool
// lock held) must not leave the interface in flight for ever; its addresses may be
// on disk, so they are not handed to anyone else.
func TestPanicInCommitDoesNotWedgeTheInterface(t *testing.T) {
	var panicNow atomic.Bool
	m := newHookedManager(t, func() {
		if panicNow.CompareAndSwap(true, false) {
			panic("injected: commit broke")
		}
	})
	panicNow.Store(true)
	mustPanic(t, "Allocate with a panicking commit", func() { _, _ = m.Allocate(t.Context(), req("c1", "rail0")) })
	var addrs []string
	for _, cid := range []string{"c1", "c2"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := within(t, 5*time.Second, "Allocate after the panic", func() error {
			res, err := m.Allocate(ctx, req(cid, "rail0"))
			if err == nil {
				addrs = append(addrs, res[0].Addr.Addr().String())
			}
			return err
		})
		cancel()
		if err != nil {
			t.Fatalf("Allocate for %s after its commit panicked: %v (the interface is wedged)", cid, err)
		}
	}
	if len(addrs) != 2 || addrs[0] == "10.0.0.2" || addrs[1] == "10.0.0.2" {
		t.Errorf("after the panicked commit of 10.0.0.2, c1 and c2 got %v: an address that may be on disk was handed out again", addrs)
	}

	// A release whose commit panics keeps the allocation, so that a retry releases it.
	panicNow.Store(true)
	mustPanic(t, "Deallocate with a panicking commit", func() { _ = m.Deallocate(t.Context(), req("c1", "rail0")) })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := m.IsAllocated(ctx, req("c1", "rail0")); err != nil {
		t.Errorf("after a panicked release: %v, want the allocation still held", err)
	}
	if err := within(t, 5*time.Second, "Deallocate after the panic", func() error { return m.Deallocate(ctx, req("c1", "rail0")) }); err != nil {
		t.Fatalf("retried Deallocate: %v", err)
	}
	if err := m.IsAllocated(ctx, req("c1", "rail0")); !errors.Is(err, nodealloc.ErrNotAllocated) {
		t.Errorf("after the retried release: %v, want ErrNotAllocated", err)
	}
}

// TestLockWaitsHonourTheContext: requests waiting for a pool that another request
// holds, or for an operation in flight on the same interface, stop waiting when
// their context ends, and leave nothing behind.
func TestLockWaitsHonourTheContext(t *testing.T) {
	entered, resume := make(chan struct{}), make(chan struct{})
	var stallClock, stallCommit atomic.Bool
	stall := func(flag *atomic.Bool) {
		if flag.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-resume
		}
	}
	m := newHookedManager(t, func() { stall(&stallCommit) },
		nodealloc.WithClock(func() time.Time { stall(&stallClock); return time.Now() }))
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	expired := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	check := func(what string, want error, f func() error) {
		t.Helper()
		if err := within(t, 3*time.Second, what, f); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}

	// A request holds the pool's lock (its clock stalls).
	stallClock.Store(true)
	holder := make(chan error, 1)
	go func() { _, err := m.Allocate(t.Context(), req("holder", "rail0")); holder <- err }()
	<-entered
	check("Allocate past its deadline while the pool is locked", context.DeadlineExceeded, func() error {
		_, err := m.Allocate(expired(), req("waiter", "rail0"))
		return err
	})
	check("Allocate with a cancelled context while the pool is locked", context.Canceled, func() error {
		_, err := m.Allocate(cancelled, req("waiter", "rail0"))
		return err
	})
	check("IsAllocated with a cancelled context while the pool is locked", context.Canceled, func() error {
		return m.IsAllocated(cancelled, req("waiter", "rail0"))
	})
	check("Deallocate with a cancelled context while the pool is locked", context.Canceled, func() error {
		return m.Deallocate(cancelled, req("waiter", "rail0"))
	})
	resume <- struct{}{}
	if err := <-holder; err != nil {
		t.Fatal(err)
	}
	if got := m.Allocations("rail0")["rail0"]; len(got) != 1 || got[0].ContainerID != "holder" {
		t.Errorf("allocations = %+v, want only the holder's: the requests that gave up left something behind", got)
	}

	// The same interface's allocation is in flight (its commit stalls).
	stallCommit.Store(true)
	first := make(chan error, 1)
	go func() { _, err := m.Allocate(t.Context(), req("c1", "rail0")); first <- err }()
	<-entered
	check("Allocate of an interface in flight, past its deadline", context.DeadlineExceeded, func() error {
		_, err := m.Allocate(expired(), req("c1", "rail0"))
		return err
	})
	check("Deallocate of an interface in flight, past its deadline", context.DeadlineExceeded, func() error {
		return m.Deallocate(expired(), req("c1", "rail0"))
	})
	resume <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	res, err := m.Allocate(t.Context(), req("c1", "rail0"))
	if err != nil || res[0].Addr.String() != "10.0.0.3/24" {
		t.Errorf("c1 after its flight = %v %v, want 10.0.0.3/24 (held once)", res, err)
	}
}
