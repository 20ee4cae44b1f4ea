package poolcontroller

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/hwipam/hwipam/pkg/iprange"
)

// DecodeMemory returns the reports a MemoryAnnotation value keeps, by node.
func DecodeMemory(value string) (map[string]string, error) {
	_, kept, err := decodeMemory(value)
	return kept.Reports, err
}

// DecodeParts returns how many more Leases the memory a MemoryAnnotation value
// names is spread over.
func DecodeParts(value string) (int, error) {
	_, kept, err := decodeMemory(value)
	return kept.Parts, err
}

// DecodeReserved returns the ranges a MemoryAnnotation value keeps reserved,
// by pool (namespace/name), as "node range".
func DecodeReserved(value string) (map[string][]string, error) {
	_, kept, err := decodeMemory(value)
	out := map[string][]string{}
	for pool, rs := range kept.Reserved {
		for _, r := range rs.Ranges {
			out[pool] = append(out[pool], r.Node+" "+r.Range)
		}
	}
	return out, err
}

// EncodeMemory returns the MemoryAnnotation value that keeps reports.
func EncodeMemory(reports map[string]string) (string, error) {
	b, err := json.Marshal(memoryPayload{Reports: reports})
	if err != nil {
		return "", err
	}
	return encodeMemory(string(b))
}

// Nodes returns the nodes the memory has a report of, sorted.
func (m *Memory) Nodes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.reports))
}

// DecodePayload returns the JSON a MemoryAnnotation value holds.
func DecodePayload(value string) (string, error) {
	payload, _, err := decodeMemory(value)
	return payload, err
}

// Grants returns what the memory counts as given to node in the pool with key
// (its block in status and its grants), merged, as ranges.
func (m *Memory) Grants(key, node string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range iprange.Merge(m.grantsOf(node, key)) {
		out = append(out, r.String())
	}
	return out
}

// AddLiveReports gives the memory n live empty reports of nodes with random
// names, as that many daemons that report nothing outside their blocks.
func (m *Memory) AddLiveReports(n int, seed uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	rng := rand.New(rand.NewPCG(seed, 1))
	for range n {
		name := fmt.Sprintf("node-%016x", rng.Uint64())
		m.reports[name] = newReport("{}", m.now, true)
	}
	m.version++
}
