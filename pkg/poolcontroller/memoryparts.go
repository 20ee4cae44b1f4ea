package poolcontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
)

// maxMemoryParts bounds how many Leases the memory spreads over: 256 of 200 KiB
// each, some 50 MB compressed, far more than 100,000 nodes' reports and grants
// take (some 3.5 bytes a reporting node, 8 a node and pool of its covered
// blocks).
const maxMemoryParts = 256

// partName names part i of n of the memory's Lease. The count is in the name:
// a memory spread anew over another count writes a new set of Leases before the
// Lease names it, so that a controller that stops in between reads the old set
// whole (the controller may not delete Leases; a set no longer named is left
// as it is, at most one per count).
func partName(lease string, n, i int) string {
	return fmt.Sprintf("%s-%d-%d", lease, n, i)
}

// partOf is the part, of n, that keeps node's reports and grants.
func partOf(node string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return int(h.Sum32() % uint32(n))
}

// writeParts stores p in the Lease: whole while its annotation holds it,
// else its per-node parts (reports and grants) spread by node over as many
// Leases as it takes (a power of two, never fewer than the last time), the
// Lease itself keeping the rest (reservations, pools) and the count. Only the
// Leases whose value changed are written, the parts before the Lease, so that
// no object grows with the node count past what an annotation holds.
func (m *Memory) writeParts(ctx context.Context, p memoryPayload) error {
	whole, err := encodePayload(p)
	if err != nil {
		return err
	}
	m.mu.Lock()
	n, written := m.partsOf, maps.Clone(m.parts)
	m.mu.Unlock()
	if n == 0 && len(whole) <= maxMemoryBytes {
		return m.write(ctx, whole)
	}
	limit := m.MaxParts
	if limit == 0 {
		limit = maxMemoryParts
	}
	n = max(n, 2)
	var values []string
	for {
		if n > limit {
			return errTooLarge
		}
		if values, err = splitPayload(p, n); err != nil {
			return err
		}
		if fits(values) {
			break
		}
		n *= 2
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(n)*2*time.Second+10*time.Second)
	defer cancel()
	done := map[string]string{}
	for i, v := range values {
		name := partName(m.Lease.Name, n, i)
		if written[name] == v {
			done[name] = v
			continue
		}
		if err := m.writeLease(ctx, types.NamespacedName{Namespace: m.Lease.Namespace, Name: name}, v); err != nil {
			m.rememberParts(done, 0)
			return err
		}
		done[name] = v
	}
	head := memoryPayload{Reports: map[string]string{}, Reserved: p.Reserved, Pools: p.Pools, Parts: n}
	value, err := encodePayload(head)
	if err != nil {
		return err
	}
	// The parts are stored whether or not the head is: a save that fails at
	// the head writes only the head again, not every part every second.
	if len(value) > maxMemoryBytes {
		m.rememberParts(done, 0)
		return errTooLarge
	}
	if err := m.write(ctx, value); err != nil {
		m.rememberParts(done, 0)
		return err
	}
	m.rememberParts(done, n)
	return nil
}

// rememberParts records the part values written; n, when not 0, the count the
// Lease now names.
func (m *Memory) rememberParts(done map[string]string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.parts == nil {
		m.parts = map[string]string{}
	}
	maps.Copy(m.parts, done)
	if n != 0 {
		m.partsOf = n
	}
}

func fits(values []string) bool {
	for _, v := range values {
		if len(v) > maxMemoryBytes {
			return false
		}
	}
	return true
}

// splitPayload encodes p's reports and grants in n parts, by node.
func splitPayload(p memoryPayload, n int) ([]string, error) {
	parts := make([]memoryPayload, n)
	for i := range parts {
		parts[i] = memoryPayload{Reports: map[string]string{}, Given: map[string]map[string][]keptGrant{}}
	}
	for node, r := range p.Reports {
		parts[partOf(node, n)].Reports[node] = r
	}
	for key, byNode := range p.Given {
		for node, gs := range byNode {
			part := &parts[partOf(node, n)]
			if part.Given[key] == nil {
				part.Given[key] = map[string][]keptGrant{}
			}
			part.Given[key][node] = gs
		}
	}
	values := make([]string, n)
	for i, part := range parts {
		v, err := encodePayload(part)
		if err != nil {
			return nil, err
		}
		values[i] = v
	}
	return values, nil
}

func encodePayload(p memoryPayload) (string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	return encodeMemory(string(b))
}

// readParts adds to kept the reports and grants of the parts the Lease names,
// and returns their values by Lease name. A part that is missing or cannot be
// decoded is logged and left out.
func (m *Memory) readParts(ctx context.Context, kept *memoryPayload) (map[string]string, error) {
	values := map[string]string{}
	if kept.Parts <= 0 {
		return values, nil
	}
	if kept.Reports == nil {
		kept.Reports = map[string]string{}
	}
	if kept.Given == nil {
		kept.Given = map[string]map[string][]keptGrant{}
	}
	for i := range kept.Parts {
		name := partName(m.Lease.Name, kept.Parts, i)
		var l coordinationv1.Lease
		err := m.Reader.Get(ctx, types.NamespacedName{Namespace: m.Lease.Namespace, Name: name}, &l)
		switch {
		case apierrors.IsNotFound(err):
			m.Log.Info("a part of the held reports the Lease names is missing; reading the others", "lease", name)
			continue
		case err != nil:
			return nil, fmt.Errorf("reading Lease %s (the daemons' held reports): %w", name, err)
		}
		v := l.Annotations[MemoryAnnotation]
		_, part, err := decodeMemory(v)
		if err != nil {
			m.Log.Error(err, "ignoring a part of the held reports", "lease", name)
			continue
		}
		values[name] = v
		maps.Copy(kept.Reports, part.Reports)
		for key, byNode := range part.Given {
			if kept.Given[key] == nil {
				kept.Given[key] = map[string][]keptGrant{}
			}
			maps.Copy(kept.Given[key], byNode)
		}
	}
	return values, nil
}
