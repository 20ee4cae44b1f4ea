package nicdra

import (
	"slices"
	"sync"
	"time"
)

// What a Failure was doing.
const (
	FailedPrepare   = "prepare"
	FailedUnprepare = "unprepare"
	FailedAttach    = "attach"
	FailedDetach    = "detach"
	// WaitingRelease is not a failure: a claim deleted while its pod still
	// runs, whose release waits for the pod's sandbox to stop.
	WaitingRelease = "release"
	// PortHeld is not a failure of the driver either: a claim unprepared
	// while its port was in a network namespace that outlived its pod; the
	// port's addresses stay held until it is back on the host (ErrPortsHeld).
	PortHeld = "held"
)

// Failure is a prepare, unprepare, attach or detach that failed, as the
// driver's status file keeps it for `ipamctl check`.
type Failure struct {
	At time.Time `json:"at"`
	// Op is one of the Failed* constants.
	Op string `json:"op"`
	// Claim (namespace/name) for a prepare or unprepare, Pod (namespace/name)
	// for an attach or detach.
	Claim   string `json:"claim,omitempty"`
	Pod     string `json:"pod,omitempty"`
	Message string `json:"message"`
}

// subject is what a later success of the same operation clears.
func (f Failure) subject() string { return f.Op + " " + f.Claim + f.Pod }

// FailureLog keeps the driver's recent failures: the last of each operation
// and claim or pod, until the same operation succeeds for it or it is older
// than FailureWindow, at most maxFailures of each operation. The zero value is ready; a nil *FailureLog records
// nothing.
type FailureLog struct {
	mu   sync.Mutex
	list []Failure // oldest first
	now  func() time.Time
	// changed has a value after each Add or Succeeded (see Changed).
	changedInit sync.Once
	changed     chan struct{}
}

// Changed has a value once a failure was added or cleared since it was last
// read: the driver writes its status file then, so that ipamctl check shows a
// failure within a second rather than at the next refresh.
func (l *FailureLog) Changed() <-chan struct{} { return l.changedCh() }

func (l *FailureLog) changedCh() chan struct{} {
	l.changedInit.Do(func() { l.changed = make(chan struct{}, 1) })
	return l.changed
}

func (l *FailureLog) notify() {
	select {
	case l.changedCh() <- struct{}{}:
	default:
	}
}

// FailureWindow is how long a failure is kept.
const FailureWindow = 15 * time.Minute

// maxFailures bounds the failures kept of each operation (the status file is
// rewritten every 10 s): one tenant's claims failing to prepare, again and
// again, never push another pod's failed detach out of the list.
const maxFailures = 32

func (l *FailureLog) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// Add records that op failed for the claim or pod with err.
func (l *FailureLog) Add(op, claim, pod string, err error) {
	if l == nil || err == nil {
		return
	}
	switch op {
	case FailedPrepare, FailedUnprepare, FailedAttach, FailedDetach:
		failures.WithLabelValues(op).Inc()
	}
	f := Failure{At: l.clock().UTC(), Op: op, Claim: claim, Pod: pod, Message: err.Error()}
	defer l.notify()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = slices.DeleteFunc(l.list, func(o Failure) bool { return o.subject() == f.subject() })
	l.list = append(l.list, f)
	// One added at a time: at most one over the bound, the oldest of its
	// operation goes.
	same := 0
	for _, o := range l.list {
		if o.Op == f.Op {
			same++
		}
	}
	if same > maxFailures {
		i := slices.IndexFunc(l.list, func(o Failure) bool { return o.Op == f.Op })
		l.list = slices.Delete(l.list, i, i+1)
	}
}

// Succeeded clears the failures of op for the claim or pod.
func (l *FailureLog) Succeeded(op, claim, pod string) {
	if l == nil {
		return
	}
	s := Failure{Op: op, Claim: claim, Pod: pod}.subject()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.list)
	l.list = slices.DeleteFunc(l.list, func(o Failure) bool { return o.subject() == s })
	if len(l.list) != n {
		l.notify()
	}
}

// Recent returns the failures of the last FailureWindow, newest first.
func (l *FailureLog) Recent() []Failure {
	if l == nil {
		return nil
	}
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = slices.DeleteFunc(l.list, func(o Failure) bool { return now.Sub(o.At) > FailureWindow })
	out := slices.Clone(l.list)
	slices.Reverse(out)
	return out
}
