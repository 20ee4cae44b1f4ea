package poolcontroller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// MemoryLeaseName is the Lease, in the leader election's namespace, that keeps
// the controller's memory of held reports (see Memory).
const MemoryLeaseName = "hwipam-held-reports"

// MemoryAnnotation is the annotation of that Lease that holds the memory: the
// JSON object {node: report} (see Memory.payload), gzipped, in base64.
const MemoryAnnotation = "ipam.hwipam.io/held-reports"

// maxMemoryBytes bounds the annotation's value: the API server refuses an
// object whose annotations exceed 256 KiB in all.
const maxMemoryBytes = 200 << 10

// Memory is what the controller knows of the daemons' held reports that the
// Nodes may no longer show (see lastReports): the report of a Node re-registered
// without annotations while its daemon is down, or of a Node that is gone, which
// the controller keeps and honours. One Memory serves the reconcilers of both
// pool kinds.
//
// With Lease set it is also kept in that Lease, so that a controller that
// restarts (killed, rescheduled, a new leader) still knows it: before the first
// reconcile reads the reports, the Lease is read, and Start writes it again
// whenever what it would keep changes. It keeps, per node:
//   - the whole last report of a node whose Node lacks the annotation (or is
//     gone);
//   - of a node whose Node shows its report, the pools in which the daemon holds
//     addresses outside its block (what no pool status records), so that a Node
//     re-registered while the controller is down too is still covered. A block
//     the daemon reports is in its pool's status, as long as the pool exists.
//
// A Lease, because the controller may already write Leases in that namespace
// (leader election), under hwipam's RBAC and under network-operator's.
type Memory struct {
	// Lease names the Lease that keeps the memory; empty: memory only.
	Lease types.NamespacedName
	// Reader reads the Lease from the API server (not a cache, which would
	// need list and watch); Client writes it.
	Reader client.Reader
	Client client.Client
	Log    logr.Logger
	// Interval is how often Start saves a change; 0 means one second.
	Interval time.Duration

	mu      sync.Mutex
	reports map[string]seenReport
	loaded  bool
	saved   string // the payload the Lease holds (as far as this process knows)
	warned  string // the last save error logged
}

// seenReport is a node's held report and when the controller last saw it.
type seenReport struct {
	raw  string
	seen time.Time
	// live: the Node showed the report when last seen.
	live bool
}

// load reads the Lease once, before the first reports are used; a reconcile
// that gets an error requeues. A Lease the controller may not read (RBAC) leaves
// the memory in this process alone, logged once; one that cannot be decoded is
// logged and ignored.
func (m *Memory) load(ctx context.Context, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loaded {
		return nil
	}
	if m.reports == nil {
		m.reports = map[string]seenReport{}
	}
	if m.Lease.Name == "" {
		m.loaded = true
		return nil
	}
	var lease coordinationv1.Lease
	err := m.Reader.Get(ctx, m.Lease, &lease)
	switch {
	case apierrors.IsNotFound(err):
		m.loaded = true
		return nil
	case apierrors.IsForbidden(err):
		m.Log.Error(err, "cannot read the Lease that keeps the daemons' held reports across restarts; "+
			"they are kept in memory only: grant get, create and update on leases in its namespace", "lease", m.Lease.String())
		m.loaded = true
		return nil
	case err != nil:
		return fmt.Errorf("reading Lease %s (the daemons' held reports): %w", m.Lease, err)
	}
	m.loaded = true
	value := lease.Annotations[MemoryAnnotation]
	if value == "" {
		return nil
	}
	payload, kept, err := decodeMemory(value)
	if err != nil {
		m.Log.Error(err, "ignoring the held reports kept in the Lease", "lease", m.Lease.String())
		return nil
	}
	for node, raw := range kept {
		if _, ok := m.reports[node]; !ok {
			m.reports[node] = seenReport{raw: raw, seen: now}
		}
	}
	m.saved = payload
	m.Log.Info("read the daemons' held reports kept in the Lease", "lease", m.Lease.String(), "nodes", len(kept))
	return nil
}

// lastReports returns every node's held report by node name. A Node re-registered
// without annotations keeps the report last seen for as long as it exists, until
// its daemon reports again: the daemon still holds what it reported, and if it is
// down (killed, crash-looping) it cannot say otherwise, however long that takes. A
// node whose Node object is gone keeps it for grace.
func (m *Memory) lastReports(nodes []client.Object, now time.Time, grace time.Duration) map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reports == nil {
		m.reports = map[string]seenReport{}
	}
	out := map[string]string{}
	for _, n := range nodes {
		if raw, ok := n.GetAnnotations()[v1alpha1.HeldAnnotation]; ok {
			m.reports[n.GetName()] = seenReport{raw: raw, seen: now, live: true}
		} else if rep, ok := m.reports[n.GetName()]; ok {
			rep.seen, rep.live = now, false
			m.reports[n.GetName()] = rep
		}
	}
	for name, rep := range m.reports {
		if now.Sub(rep.seen) >= grace {
			delete(m.reports, name)
			continue
		}
		out[name] = rep.raw
	}
	for _, n := range nodes {
		if raw, ok := n.GetAnnotations()[v1alpha1.HeldAnnotation]; ok {
			out[n.GetName()] = raw
		}
	}
	return out
}

// payload is what the Lease is to keep (see Memory), as JSON; with mu held.
func (m *Memory) payload() string {
	kept := make(map[string]string, len(m.reports))
	for node, rep := range m.reports {
		if !rep.live {
			kept[node] = rep.raw
			continue
		}
		var holds map[string]v1alpha1.PoolHold
		if err := json.Unmarshal([]byte(rep.raw), &holds); err != nil {
			continue // reports nothing (see readReports)
		}
		maps.DeleteFunc(holds, func(_ string, h v1alpha1.PoolHold) bool { return len(h.Held) == 0 })
		if len(holds) == 0 {
			continue
		}
		b, err := json.Marshal(holds)
		if err != nil {
			continue
		}
		kept[node] = string(b)
	}
	b, _ := json.Marshal(kept) // a map of strings: sorted keys, cannot fail
	return string(b)
}

// Save writes the memory to the Lease if it changed since the last save (or
// load), creating the Lease when missing. Nothing is written before the Lease
// was read: what it kept would be lost.
func (m *Memory) Save(ctx context.Context) error {
	m.mu.Lock()
	if !m.loaded || m.Lease.Name == "" {
		m.mu.Unlock()
		return nil
	}
	payload := m.payload()
	saved := m.saved
	m.mu.Unlock()
	if payload == saved || saved == "" && payload == "{}" {
		return nil
	}
	value, err := encodeMemory(payload)
	if err != nil {
		return err
	}
	if len(value) > maxMemoryBytes {
		return fmt.Errorf("the daemons' held reports take %d bytes compressed, more than a Lease annotation may hold "+
			"(%d); the change is kept in memory only", len(value), maxMemoryBytes)
	}
	var lease coordinationv1.Lease
	err = m.Reader.Get(ctx, m.Lease, &lease)
	switch {
	case apierrors.IsNotFound(err):
		lease = coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: m.Lease.Namespace, Name: m.Lease.Name,
			Annotations: map[string]string{MemoryAnnotation: value}}}
		err = m.Client.Create(ctx, &lease)
	case err == nil:
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[MemoryAnnotation] = value
		err = m.Client.Update(ctx, &lease)
	}
	if err != nil {
		return fmt.Errorf("writing Lease %s (the daemons' held reports): %w", m.Lease, err)
	}
	m.mu.Lock()
	m.saved = payload
	m.mu.Unlock()
	return nil
}

// Start saves the memory every Interval until ctx ends; a failed save is logged
// (once until the error changes) and tried again.
func (m *Memory) Start(ctx context.Context) error {
	interval := m.Interval
	if interval == 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		err := m.Save(ctx)
		switch {
		case err != nil && err.Error() != m.warned && ctx.Err() == nil:
			m.Log.Error(err, "saving the daemons' held reports; trying again")
			m.warned = err.Error()
		case err == nil && m.warned != "":
			m.Log.Info("saved the daemons' held reports again")
			m.warned = ""
		}
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// leader reconciles, so only its memory is current.
func (*Memory) NeedLeaderElection() bool { return true }

func encodeMemory(payload string) (string, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, payload); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b.Bytes()), nil
}

// decodeMemory returns the payload an annotation value holds and its reports.
func decodeMemory(value string) (string, map[string]string, error) {
	gz, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		return "", nil, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return "", nil, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, 64<<20))
	if err != nil {
		return "", nil, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	var kept map[string]string
	if err := json.Unmarshal(data, &kept); err != nil {
		return "", nil, fmt.Errorf("annotation %s: %w", MemoryAnnotation, err)
	}
	if kept == nil {
		return "", nil, errors.New("annotation " + MemoryAnnotation + " holds no object")
	}
	return string(data), kept, nil
}

// Nodes returns the nodes the memory has a report of, sorted (for tests and
// logs).
func (m *Memory) Nodes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.reports))
}
