package nicdra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
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

// ErrClaimReplaced is ApplyClaimStatus's refusal to write the status of a
// claim that is not the one prepared: same namespace and name, another UID.
var ErrClaimReplaced = errors.New("the claim was replaced by another of the same name")

// ApplyClaimStatus writes the status of the claim's devices that this node
// prepared (pool: the node's resource pool): this driver's entries of
// status.devices are replaced, other drivers' entries stay as they are.
//
// It reads the claim and patches status.devices whole with the claim's
// resourceVersion as precondition, trying again on a conflict, and writes
// nothing when the entries are already there. (Server-side apply would be the
// natural tool, but the API server of 1.37 refuses an apply to the status of a
// claim whose allocation holds opaque configuration: "status.allocation:
// Invalid value: null: field cannot be modified once set"; TestApplyClaimStatus.)
// It needs no more than get on resourceclaims and patch on
// resourceclaims/status, which the API server lets a node's service account
// use only for claims allocated on its node (resourceclaims/driver,
// associated-node:patch, docs/rbac.md).
//
// It writes only to the claim with the given UID, the one prepared: a claim
// of the same name with another UID (deleted and re-created, for instance
// while ipam-node was down) is left alone, and the error is ErrClaimReplaced.
// The patch carries the UID as a precondition too.
func ApplyClaimStatus(ctx context.Context, c kubernetes.Interface, namespace, name string, uid types.UID, pool string,
	devs []PreparedDevice) error {
	var ours []resourceapi.AllocatedDeviceStatus
	for _, d := range devs {
		raw, err := json.Marshal(DeviceData{Pools: d.Pools, PoolType: d.PoolType, Rail: d.Rail, Gateway: d.Gateway,
			Routes: d.Routes, HostNetdev: d.HostNetdev, PCIAddress: d.PCIAddress})
		if err != nil {
			return err
		}
		ours = append(ours, resourceapi.AllocatedDeviceStatus{Driver: DriverName, Pool: pool, Device: d.Device,
			Data: &runtime.RawExtension{Raw: raw}, NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: d.InterfaceName,
				IPs: d.Addresses, HardwareAddress: d.MAC}})
	}
	claims := c.ResourceV1().ResourceClaims(namespace)
	var err error
	for range 5 {
		var claim *resourceapi.ResourceClaim
		if claim, err = claims.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading claim %s/%s for its status: %w", namespace, name, err)
		}
		if claim.UID != uid {
			return fmt.Errorf("%w: claim %s/%s has UID %s, the one prepared had %s", ErrClaimReplaced, namespace, name, claim.UID, uid)
		}
		var next, mine []resourceapi.AllocatedDeviceStatus
		for _, s := range claim.Status.Devices {
			if s.Driver == DriverName && s.Pool == pool {
				mine = append(mine, s)
			} else {
				next = append(next, s)
			}
		}
		if sameStatus(mine, ours) {
			return nil
		}
		next = append(next, ours...)
		patch, merr := json.Marshal(map[string]any{
			"metadata": map[string]any{"uid": uid, "resourceVersion": claim.ResourceVersion},
			"status":   map[string]any{"devices": next}})
		if merr != nil {
			return merr
		}
		_, err = claims.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: DriverName}, "status")
		if !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("writing the status of claim %s/%s: %w", namespace, name, err)
	}
	return nil
}

// sameStatus says whether the claim already has exactly these entries.
func sameStatus(have, want []resourceapi.AllocatedDeviceStatus) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range want {
		j := slices.IndexFunc(have, func(h resourceapi.AllocatedDeviceStatus) bool { return h.Device == want[i].Device })
		if j < 0 || !equality.Semantic.DeepEqual(have[j].NetworkData, want[i].NetworkData) ||
			have[j].Data == nil || !jsonEqual(have[j].Data.Raw, want[i].Data.Raw) {
			return false
		}
	}
	return true
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && equality.Semantic.DeepEqual(x, y)
}
