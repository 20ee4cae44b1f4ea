package nodealloc

import (
	"net/netip"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
)

// Holds is what the daemon reports in the v1alpha1.HeldAnnotation: per pool key,
// the block it may allocate from now and the addresses it holds (or is committing)
// outside that block. Pools without an active block and without addresses are
// left out. Each pool is read under its lock, so an address is either inside the
// reported block or listed: an allocation that succeeded is never missing.
func (m *Manager) Holds() map[string]v1alpha1.PoolHold {
	m.mu.RLock()
	states := make([]*poolState, 0, len(m.pools))
	for _, p := range m.pools {
		states = append(states, p)
	}
	m.mu.RUnlock()
	out := make(map[string]v1alpha1.PoolHold, len(states))
	for _, p := range states {
		if h, ok := p.hold(); ok {
			out[p.key] = h
		}
	}
	return out
}

func (p *poolState) hold() (v1alpha1.PoolHold, bool) {
	p.lockWait()
	defer p.unlock()
	var h v1alpha1.PoolHold
	var block iprange.Range
	// A stored block not yet confirmed by a pool sync counts: the daemon may be
	// serving it while the API server does not answer.
	active := (p.active || p.provisional) && p.cfg != nil
	if active {
		block = p.cfg.Block
		h.Block = block.String()
	}
	var outside []netip.Addr
	add := func(ip netip.Addr) {
		if ip.IsValid() && (!active || !block.Contains(ip)) {
			outside = append(outside, ip)
		}
	}
	for _, ip := range p.allocs {
		add(ip)
	}
	for _, f := range p.inflight {
		for _, ip := range f.ips {
			add(ip)
		}
	}
	for _, r := range iprange.MergeAddrs(outside) {
		h.Held = append(h.Held, r.String())
	}
	return h, active || len(h.Held) > 0
}
