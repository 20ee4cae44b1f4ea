package nicdra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// The checkpoint keeps what a prepared claim needs later and neither the claim
// (Unprepare gets only its UID, name and namespace, and it may be gone) nor the
// store (which has only the addresses) can give back: which devices it has, the
// host netdev to bring back, and what the pod was told. The addresses live in
// the store, keyed by claim UID, request and device, as every other
// allocation; a prepare that finds its claim here recomputes nothing it
// already did.

// checkpointVersion is the format this build writes. Version 2 gave
// PrepareStarted entries their devices and pools (written before anything is
// allocated) and added the unpreparing state; a build that reads only version 1
// would misread them, so it refuses the file instead. This build reads both:
// a version 1 entry means what it meant then (see PrepareStarted). Version 3
// added portsHeld, which a build that reads up to version 2 would take for a
// claim it may release; it is written only while a claim has it (otherwise
// the file is version 2, which such a build still reads).
const checkpointVersion = 3

// checkpointVersionWithoutHeldPorts is what a checkpoint without a claim
// whose ports are held is written as.
const checkpointVersionWithoutHeldPorts = 2

// oldestCheckpointVersion is the oldest format this build reads.
const oldestCheckpointVersion = 1

// ErrCheckpoint is what Load returns, wrapped, for a checkpoint it cannot
// read: damaged, of another format, or unreadable. The driver then refuses to
// prepare or unprepare claims (it must not forget what it prepared) and says
// so in its status file; ipam-node's CNI path goes on.
var ErrCheckpoint = errors.New("the DRA checkpoint cannot be read")

// Claim states: a claim whose prepare started may hold some of its addresses
// (and its devices may have moved); one whose prepare completed holds all.
// A started claim's Devices are recorded before anything is allocated, with
// the pools each device's addresses come from (and without addresses): what
// it may hold, for Unprepare to release and the next Prepare to finish in the
// same pools. (A PrepareStarted entry without devices was written by an
// older build before it allocated: what it holds is released by the claim
// garbage collection once the claim is gone.)
const (
	PrepareStarted   = "PrepareStarted"
	PrepareCompleted = "PrepareCompleted"
)

// Checkpoint is the checkpoint file's content.
type Checkpoint struct {
	Version int `json:"version"`
	// BootID is the node's boot ID when it was written: after a reboot every
	// netdev is back on the host, whatever the checkpoint says.
	BootID string                      `json:"bootID"`
	Claims map[types.UID]PreparedClaim `json:"claims"`
}

// PreparedClaim is one claim as prepared on this node.
type PreparedClaim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// PodName and PodUID are the pod the claim is reserved for: the pod whose
	// sandbox gets the devices (NRI names sandboxes by pod UID).
	PodName string `json:"podName,omitempty"`
	PodUID  string `json:"podUID,omitempty"`
	State   string `json:"state"`
	// Unpreparing is set before Unprepare releases the claim's addresses:
	// some may be released already, so a Prepare allocates them again (in the
	// recorded pools) instead of returning what is recorded.
	Unpreparing bool `json:"unpreparing,omitempty"`
	// PortsHeld is set when Unprepare found ports of the claim on the host
	// nowhere: each is in a network namespace that outlived its pod, where
	// its addresses may still be configured and up. Devices are then those
	// ports alone, whose addresses stay held; the claim is unprepared for the
	// kubelet, and the driver releases them once the port is back on the
	// host (Preparer.ReleaseHeldPorts). Written only in checkpoint version 3.
	PortsHeld bool             `json:"portsHeld,omitempty"`
	Devices   []PreparedDevice `json:"devices"`
}

// PreparedDevice is one allocated device of a claim.
type PreparedDevice struct {
	// Request is the claim's request (or "request/subrequest"), Device the
	// device's name in this driver's pool.
	Request    string `json:"request"`
	Device     string `json:"device"`
	PCIAddress string `json:"pciAddress"`
	// HostNetdev and MTU are what the netdev is brought back as.
	HostNetdev string `json:"hostNetdev"`
	MTU        int    `json:"mtu,omitempty"`
	// InterfaceName is its name in the pod.
	InterfaceName string `json:"interfaceName"`
	// Pools (their kind: PoolType) and what the pod gets from them.
	Pools    []string `json:"pools"`
	PoolType string   `json:"poolType"`
	Rail     string   `json:"rail,omitempty"`
	// RequestedIPs and RequestedIndex are the configuration's static
	// addresses or index in the pools' blocks, for a prepare that is finished
	// after a crash.
	RequestedIPs   []string `json:"requestedIPs,omitempty"`
	RequestedIndex *int32   `json:"requestedIndex,omitempty"`
	Addresses      []string `json:"addresses"`
	Gateway        string   `json:"gateway,omitempty"`
	// Gateways are the gateways of the device's pools, one per family (Gateway
	// is the first).
	Gateways []string `json:"gateways,omitempty"`
	Routes   []string `json:"routes,omitempty"`
	MAC      string   `json:"mac,omitempty"`
	// What the attach learnt of the host link, to find the port again by
	// what it is rather than by a name a pod can give to anything (and to
	// give it back as it was): its permanent MAC address (PermMAC, when the
	// driver reports one), its parent device (ParentDev: the PCI address of a
	// NIC's function, "" for a virtual link), its ifindex in the pod's
	// network namespace after the move (PodIfIndex), and whether it was up on
	// the host before (HostUp; nil: not recorded, brought back down).
	PermMAC    string `json:"permMAC,omitempty"`
	ParentDev  string `json:"parentDev,omitempty"`
	PodIfIndex int    `json:"podIfIndex,omitempty"`
	HostUp     *bool  `json:"hostUp,omitempty"`
}

// CheckpointFile is where the checkpoint is kept: the kubelet plugin's data
// directory, /var/lib/kubelet/plugins/nic.hwipam.io/checkpoint.json.
type CheckpointFile struct {
	Path string
}

// Load reads the checkpoint; a missing file is an empty one. A file it cannot
// read is an error that says what to do: the driver must not forget claims it
// prepared (their addresses would stay held, their netdevs in pods).
func (f CheckpointFile) Load() (*Checkpoint, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Checkpoint{Version: checkpointVersion, Claims: map[types.UID]PreparedClaim{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w: ipam-node will not prepare or unprepare claims until it can read it",
			ErrCheckpoint, f.Path, err)
	}
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%w: the DRA checkpoint %s is damaged (%v): ipam-node will not prepare or unprepare claims "+
			"until it is restored from a backup or moved away, which it notices without a restart (once moved away, "+
			"claims prepared before are released only by the claim garbage collection, and their netdevs come back "+
			"to the host when their pods stop)", ErrCheckpoint, f.Path, err)
	}
	if c.Version < oldestCheckpointVersion || c.Version > checkpointVersion {
		return nil, fmt.Errorf("%w: the DRA checkpoint %s has format version %d; this ipam-node reads versions %d to %d: "+
			"run the ipam-node that wrote it, or one that reads it", ErrCheckpoint, f.Path, c.Version,
			oldestCheckpointVersion, checkpointVersion)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]PreparedClaim{}
	}
	return &c, nil
}

// Save writes the checkpoint whole: to a temporary file beside it, synced,
// then renamed over it, and the directory synced, so that a crash leaves the
// old checkpoint or the new one, never a part.
func (f CheckpointFile) Save(c *Checkpoint) error {
	c.Version = checkpointVersionWithoutHeldPorts
	for _, pc := range c.Claims {
		if pc.PortsHeld {
			c.Version = checkpointVersion
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	dir := filepath.Dir(f.Path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("writing the DRA checkpoint: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing the DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("syncing the DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("replacing the DRA checkpoint %s: %w", f.Path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// BootID reads the node's boot ID under root (the directory holding proc/).
func BootID(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "proc", "sys", "kernel", "random", "boot_id"))
	if err != nil {
		return "", fmt.Errorf("reading the node's boot ID: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
