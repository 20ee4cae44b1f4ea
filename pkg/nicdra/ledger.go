package nicdra

import (
	"fmt"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// PortLedger is where the CNI path and the DRA driver decide, under one lock,
// which of them takes a NIC port. Each side checks the other's uses and
// records its own in one step, so that a CNI ADD and a prepare that race for
// one port never both get it:
//
//   - a CNI ADD that names a device (TakeForCNI) is refused when a claim holds
//     the port or a prepare is taking it; otherwise it counts as adding until
//     its store commit is over (done), succeeded or failed;
//   - a prepare (Preparer.Prepare, with the ledger set) is refused when a CNI
//     ADD is adding on the port, or a committed CNI allocation uses it (InUse,
//     read under the lock); otherwise its ports count as taken until its
//     checkpoint records the claim, from when on the checkpoint's claims hold
//     them (the Preparer tells the ledger after each checkpoint write).
//
// Ports are named as each side knows them: PCI addresses, netdev names and
// device names; a name either side gives counts. The lock is never held across
// a store commit or a checkpoint write: only across InUse, one pass over the
// store's allocations, during a prepare.
type PortLedger struct {
	// InUse returns the ports committed CNI allocations use, by PCI address:
	// who uses each (nil: none known).
	InUse func() map[string]string

	mu     sync.Mutex
	claims map[string]ledgerClaim // the checkpoint's claims' ports
	taking map[string]ledgerClaim // prepares between their check and their record
	adding map[string]int         // CNI ADDs between their check and their commit
}

// ledgerClaim is a claim that holds or takes a port.
type ledgerClaim struct {
	uid  types.UID
	name string // namespace/name
}

// deviceNames are the names a device's port goes by.
func deviceNames(d PreparedDevice) []string {
	var out []string
	for _, n := range []string{d.PCIAddress, d.HostNetdev, d.Device} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// setClaims records the ports of the checkpoint's claims (every state: a
// started prepare holds what it recorded; a claim whose ports are held, those).
func (l *PortLedger) setClaims(claims map[types.UID]PreparedClaim) {
	if l == nil {
		return
	}
	held := map[string]ledgerClaim{}
	for uid, pc := range claims {
		for _, d := range pc.Devices {
			for _, n := range deviceNames(d) {
				held[n] = ledgerClaim{uid: uid, name: pc.Namespace + "/" + pc.Name}
			}
		}
	}
	l.mu.Lock()
	l.claims = held
	l.mu.Unlock()
}

// holder is the claim that holds or takes any of the names; with mu held.
func (l *PortLedger) holder(names []string) (ledgerClaim, bool) {
	for _, n := range names {
		if n == "" {
			continue
		}
		if c, ok := l.claims[n]; ok {
			return c, true
		}
		if c, ok := l.taking[n]; ok {
			return c, true
		}
	}
	return ledgerClaim{}, false
}

// HeldBy names the claim (namespace/name) that holds or is being prepared
// with a port, by any of its names; "" when none does.
func (l *PortLedger) HeldBy(names ...string) string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c, _ := l.holder(names)
	return c.name
}

// TakeForCNI is a CNI ADD's check of the port its device names (by any of
// names): the claim that holds it or is being prepared with it, or "" and
// done, which the ADD calls once its store commit is over. Until then a
// prepare of the port is refused.
func (l *PortLedger) TakeForCNI(names ...string) (claim string, done func()) {
	if l == nil {
		return "", func() {}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.holder(names); ok {
		return c.name, nil
	}
	var counted []string
	for _, n := range names {
		if n != "" && !slices.Contains(counted, n) {
			counted = append(counted, n)
		}
	}
	if l.adding == nil {
		l.adding = map[string]int{}
	}
	for _, n := range counted {
		l.adding[n]++
	}
	var once sync.Once
	return "", func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, n := range counted {
				if l.adding[n]--; l.adding[n] <= 0 {
					delete(l.adding, n)
				}
			}
		})
	}
}

// takeForClaim is a prepare's check of its devices' ports: refused
// (ErrPortUnavailable) when a CNI ADD is adding on one, a committed CNI
// allocation uses one, or another claim holds or takes one; otherwise they
// count as taken by the claim until done, which the prepare calls once its
// checkpoint records the claim (or it gave up).
func (l *PortLedger) takeForClaim(uid types.UID, name string, devs []PreparedDevice) (done func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var inUse map[string]string
	if l.InUse != nil {
		inUse = l.InUse()
	}
	var taken []string
	for _, d := range devs {
		names := deviceNames(d)
		for _, n := range names {
			if l.adding[n] > 0 {
				return nil, fmt.Errorf("%w: NIC port %s (%s): a pod's CNI attachment is taking it right now; the claim "+
					"waits for it (the kubelet tries again), or delete the pod and its claim to have another port allocated",
					ErrPortUnavailable, d.Device, n)
			}
		}
		if who, ok := inUse[d.PCIAddress]; ok && d.PCIAddress != "" {
			return nil, fmt.Errorf("%w: NIC port %s (%s) is in use by %s; the claim waits for it (the kubelet tries "+
				"again), or delete the pod and its claim to have another port allocated", ErrPortUnavailable, d.Device,
				d.PCIAddress, who)
		}
		if c, ok := l.holder(names); ok && c.uid != uid {
			return nil, fmt.Errorf("%w: NIC port %s is held by claim %s (UID %s)", ErrPortUnavailable, d.Device, c.name, c.uid)
		}
		taken = append(taken, names...)
	}
	if l.taking == nil {
		l.taking = map[string]ledgerClaim{}
	}
	for _, n := range taken {
		l.taking[n] = ledgerClaim{uid: uid, name: name}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, n := range taken {
				if l.taking[n].uid == uid {
					delete(l.taking, n)
				}
			}
		})
	}, nil
}
