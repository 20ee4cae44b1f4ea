package nicdra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// DriverStatus is what the driver says of itself in a file beside its
// checkpoint (dra-status.json), for ipamctl check: whether the kubelet
// registered the plugin, and what it published.
type DriverStatus struct {
	// KubeletDir is the kubelet root directory the plugin serves under.
	KubeletDir string `json:"kubeletDir"`
	// Registered is set once the kubelet has accepted the plugin;
	// RegistrationError says why it has not (or refused).
	Registered        bool   `json:"registered"`
	RegistrationError string `json:"registrationError,omitempty"`
	// Devices is how many devices the last publication had, at Published;
	// PublishError is the last error of the ResourceSlice controller.
	Devices      int       `json:"devices"`
	Published    time.Time `json:"published"`
	PublishError string    `json:"publishError,omitempty"`
	// CheckpointError says why the checkpoint of prepared claims cannot be
	// read: the driver then refuses every prepare and unprepare, collects
	// nothing and publishes no device, until the file is restored or moved
	// away (ipam-node's CNI path is not affected).
	CheckpointError string    `json:"checkpointError,omitempty"`
	Updated         time.Time `json:"updated"`
	// Withheld are the NIC ports the driver does not publish, and why (the
	// node's uplink, excluded, in use by a pod's CNI attachment).
	Withheld []WithheldDevice `json:"withheld,omitempty"`
	// Failures are the prepares, unprepares, attaches and detaches that
	// failed in the last FailureWindow and have not succeeded since, newest
	// first.
	Failures []Failure `json:"failures,omitempty"`
	// Ports are the published devices as the last publication had them: the
	// port, its rail and pools, whether it can be prepared.
	Ports []PublishedPort `json:"ports,omitempty"`
}

// PublishedPort is a published device, as the status file keeps it (for
// `ipamctl gpus`).
type PublishedPort struct {
	Device     string `json:"device"`
	PCIAddress string `json:"pciAddress,omitempty"`
	Netdev     string `json:"netdev,omitempty"`
	Rail       string `json:"rail,omitempty"`
	// Pools is the pool attribute: the pools labelled for the rail.
	Pools      string `json:"pools,omitempty"`
	Preparable bool   `json:"preparable"`
}

// publishedPorts returns what the status file keeps of devs.
func publishedPorts(devs []resourceapi.Device) []PublishedPort {
	out := make([]PublishedPort, 0, len(devs))
	str := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	for _, d := range devs {
		p := PublishedPort{Device: d.Name, PCIAddress: str(d, deviceattribute.StandardDeviceAttributePCIBusID),
			Netdev: str(d, AttrNetdev), Rail: str(d, AttrRail), Pools: str(d, AttrPool)}
		if b := d.Attributes[AttrPreparable].BoolValue; b != nil {
			p.Preparable = *b
		}
		out = append(out, p)
	}
	return out
}

// WithheldDevice is a NIC port the driver does not publish.
type WithheldDevice struct {
	// Device is the name it would have; PCIAddress and Netdev say which port.
	Device     string `json:"device"`
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev,omitempty"`
	// Reason starts with WithheldUplink, WithheldExcluded or WithheldInUse,
	// and says what makes it so.
	Reason string `json:"reason"`
}

// CheckpointBeside is where ipam-node keeps the DRA checkpoint: beside its
// store file, so that ipamctl finds it from the store's path.
func CheckpointBeside(storeFile string) string {
	return filepath.Join(filepath.Dir(storeFile), "dra-checkpoint.json")
}

// StatusFile is the driver's status file beside a checkpoint.
func StatusFile(checkpoint string) string {
	return filepath.Join(filepath.Dir(checkpoint), "dra-status.json")
}

// ReadStatus reads the driver's status file; ok is false when there is none
// (the driver never ran with this store).
func ReadStatus(path string) (st DriverStatus, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("%s: %w", path, err)
	}
	return st, true, nil
}

// statusCoalesce is how long the status file's write waits after a failure
// was added or cleared, so that failures that come together (a prepare
// retried for each claim of a pod) are written once.
const statusCoalesce = 200 * time.Millisecond

// writeStatus writes the status file (temporary file, then rename); errors
// are logged, never fatal: the file is for people.
func (d *Driver) writeStatus() {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	d.mu.Lock()
	st := d.status
	d.mu.Unlock()
	st.KubeletDir, st.Updated = d.KubeletDir, time.Now()
	st.Failures = d.Failures.Recent()
	st.Registered, st.RegistrationError = d.Registered()
	if st.Registered {
		st.RegistrationError = ""
	}
	b, err := json.Marshal(st)
	if err != nil {
		return
	}
	path := StatusFile(d.Preparer.Checkpoint.Path)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		err = os.Rename(tmp, path)
		if err != nil {
			d.Log.Error(err, "writing the driver's status file", "path", path)
		}
	}
}
