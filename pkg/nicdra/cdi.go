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

// The RDMA character devices of a claim's ports reach the containers that
// reference the claim (resources.claims), and no other container of the pod,
// through the Container Device Interface: Prepare returns a CDI device ID for
// each device that has them, the kubelet passes those IDs to the runtime for
// exactly those containers, and the runtime (containerd 2.x, CRI-O: CDI on by
// default) reads the spec this driver writes, one per claim, and creates the
// device nodes. The netdev's move stays NRI's: it concerns the pod's network
// namespace, not a container.

// CDIKind is the CDI kind of the claims' specs: vendor k8s.nic.hwipam.io,
// class claim. A device ID is CDIKind=<claim UID>-<device>.
const CDIKind = "k8s." + DriverName + "/claim"

// cdiVersion is the CDI spec version written: device nodes with their
// numbers, which every runtime with CDI reads.
const cdiVersion = "0.6.0"

// CDISpecs writes the claims' CDI specs into Dir, where the runtime reads them
// (its cdi_spec_dirs; /var/run/cdi by default), with the numbers of the
// devices read from the sysfs tree under SysfsRoot (RDMACharDevices).
type CDISpecs struct {
	Dir       string
	SysfsRoot string
}

type cdiSpec struct {
	CDIVersion string      `json:"cdiVersion"`
	Kind       string      `json:"kind"`
	Devices    []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	DeviceNodes []cdiNode `json:"deviceNodes"`
}

type cdiNode struct {
	Path        string `json:"path"`
	Type        string `json:"type"`
	Major       int64  `json:"major"`
	Minor       int64  `json:"minor"`
	FileMode    uint32 `json:"fileMode"`
	Permissions string `json:"permissions"`
}

// specPrefix and specSuffix frame a claim's spec file name around its UID.
const (
	specPrefix = "k8s." + DriverName + "-claim_"
	specSuffix = ".json"
)

// file is the claim's spec file.
func (c *CDISpecs) file(uid types.UID) string {
	return filepath.Join(c.Dir, specPrefix+string(uid)+specSuffix)
}

// cdiName is the device's name in its claim's spec.
func cdiName(uid types.UID, device string) string { return string(uid) + "-" + device }

// Write writes the claim's spec (whole: a temporary file renamed over it)
// and returns the CDI device IDs of each device, by device name: one for a
// device with RDMA character devices, none for one without. A claim without
// any gets no spec (one written before is removed). A device whose numbers
// cannot be read is an error naming it: a container must not start without
// the devices its claim has.
func (c *CDISpecs) Write(uid types.UID, devs []PreparedDevice) (map[string][]string, error) {
	if c == nil {
		return nil, nil
	}
	spec := cdiSpec{CDIVersion: cdiVersion, Kind: CDIKind}
	ids := map[string][]string{}
	for _, d := range devs {
		chars, err := RDMACharDevices(c.SysfsRoot, d.PCIAddress)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", d.Device, err)
		}
		if len(chars) == 0 {
			continue
		}
		dev := cdiDevice{Name: cdiName(uid, d.Device)}
		for _, ch := range chars {
			dev.ContainerEdits.DeviceNodes = append(dev.ContainerEdits.DeviceNodes, cdiNode{Path: ch.Path, Type: "c",
				Major: ch.Major, Minor: ch.Minor, FileMode: uint32(ch.Mode.Perm()), Permissions: "rw"})
		}
		spec.Devices = append(spec.Devices, dev)
		ids[d.Device] = []string{CDIKind + "=" + dev.Name}
	}
	if len(spec.Devices) == 0 {
		return ids, c.Remove(uid)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec: %w", err)
	}
	tmp, err := os.CreateTemp(c.Dir, ".tmp-"+specPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone once renamed
	_, werr := tmp.Write(b)
	if err := errors.Join(werr, tmp.Chmod(0o644), tmp.Close()); err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), c.file(uid)); err != nil {
		return nil, fmt.Errorf("writing the claim's CDI spec %s: %w", c.file(uid), err)
	}
	return ids, nil
}

// Remove removes the claim's spec; none is no error.
func (c *CDISpecs) Remove(uid types.UID) error {
	if c == nil {
		return nil
	}
	if err := os.Remove(c.file(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the claim's CDI spec: %w", err)
	}
	return nil
}

// Prune removes the specs of this driver's claims that claims (read after
// the directory, so that a spec written meanwhile is kept) does not hold as
// prepared: those of claims unprepared while ipam-node was down, or whose
// removal failed. It returns how many it removed.
func (c *CDISpecs) Prune(claims func() (map[types.UID]PreparedClaim, error)) (int, error) {
	if c == nil {
		return 0, nil
	}
	entries, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("listing the CDI specs: %w", err)
	}
	var uids []types.UID
	for _, e := range entries {
		if uid, ok := strings.CutPrefix(e.Name(), specPrefix); ok && strings.HasSuffix(uid, specSuffix) {
			uids = append(uids, types.UID(strings.TrimSuffix(uid, specSuffix)))
		}
	}
	if len(uids) == 0 {
		return 0, nil
	}
	held, err := claims()
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, uid := range uids {
		if pc, ok := held[uid]; ok && pc.State == PrepareCompleted && !pc.Unpreparing {
			continue
		}
		if err := c.Remove(uid); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
