package nicdra

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
)

// DeviceData is what a device's status entry holds in data: what networkData
// has no field for (KEP-4817 gives it interface name, addresses and MAC only).
type DeviceData struct {
	Pools    []string `json:"pools"`
	PoolType string   `json:"poolType"`
	Rail     string   `json:"rail,omitempty"`
	Gateway  string   `json:"gateway,omitempty"`
	Routes   []string `json:"routes,omitempty"`
	// HostNetdev and PCIAddress are the port on the node.
	HostNetdev string `json:"hostNetdev,omitempty"`
	PCIAddress string `json:"pciAddress"`
}

// ApplyClaimStatus writes the status of the claim's devices that this node
// prepared (pool: the node's resource pool) with server-side apply, as field
// manager nic.hwipam.io: status.devices is a map list (driver, pool, device,
// shareID), so only this driver's entries are written and other drivers' stay
// as they are. It needs no more than patch on resourceclaims/status, which the
// API server lets a node's service account use only for claims allocated on
// its node (resourceclaims/driver, associated-node:patch, docs/rbac.md).
func ApplyClaimStatus(ctx context.Context, c kubernetes.Interface, namespace, name, pool string, devs []PreparedDevice) error {
	status := resourcev1ac.ResourceClaimStatus()
	for _, d := range devs {
		raw, err := json.Marshal(DeviceData{Pools: d.Pools, PoolType: d.PoolType, Rail: d.Rail, Gateway: d.Gateway,
			Routes: d.Routes, HostNetdev: d.HostNetdev, PCIAddress: d.PCIAddress})
		if err != nil {
			return err
		}
		nd := resourcev1ac.NetworkDeviceData().WithInterfaceName(d.InterfaceName).WithIPs(d.Addresses...)
		if d.MAC != "" {
			nd = nd.WithHardwareAddress(d.MAC)
		}
		status = status.WithDevices(resourcev1ac.AllocatedDeviceStatus().WithDriver(DriverName).WithPool(pool).
			WithDevice(d.Device).WithNetworkData(nd).WithData(runtime.RawExtension{Raw: raw}))
	}
	claim := resourcev1ac.ResourceClaim(name, namespace).WithStatus(status)
	if _, err := c.ResourceV1().ResourceClaims(namespace).ApplyStatus(ctx, claim,
		metav1.ApplyOptions{FieldManager: DriverName, Force: true}); err != nil {
		return fmt.Errorf("writing the status of claim %s/%s: %w", namespace, name, err)
	}
	return nil
}
