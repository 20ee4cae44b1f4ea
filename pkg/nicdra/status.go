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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
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
// It reads the claim and writes its status back whole (an update of
// resourceclaims/status) with the claim's resourceVersion as precondition,
// trying again on a conflict, and writes nothing when the entries are already
// there. Both the read and the write are protobuf, whatever the client's
// content type: the API server keeps a configuration's opaque parameters byte
// for byte as the tenant sent them (with spaces, from json.dumps or an
// indenting client), and the scheduler copies them into status.allocation so.
// A patch of any kind, or a JSON round trip, is applied to the claim encoded
// as compact JSON, which changes those bytes, and the API server refuses the
// write as a change of status.allocation ("field cannot be modified once
// set"); server-side apply is refused the same way for any opaque
// configuration. Protobuf carries the bytes through unchanged, so the write
// changes status.devices and nothing else (TestClaimStatusWithSpacedParameters).
//
// It needs no more than get on resourceclaims and update on
// resourceclaims/status, which the API server lets a node's service account
// use only for claims allocated on its node (resourceclaims/driver,
// associated-node:update, docs/rbac.md).
//
// It writes only to the claim with the given UID, the one prepared: a claim
// of the same name with another UID (deleted and re-created, for instance
// while ipam-node was down) is left alone, and the error is ErrClaimReplaced.
// The update carries the UID read with the claim, and its resourceVersion.
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
	rc := c.ResourceV1().RESTClient()
	var err error
	for range 5 {
		claim := &resourceapi.ResourceClaim{}
		err = rc.Get().SetHeader("Accept", protobufType).Namespace(namespace).Resource("resourceclaims").Name(name).
			Do(ctx).Into(claim)
		if err != nil {
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
		claim.Status.Devices = append(next, ours...)
		body, eerr := encodeClaim(claim)
		if eerr != nil {
			return fmt.Errorf("encoding the status of claim %s/%s: %w", namespace, name, eerr)
		}
		err = rc.Put().SetHeader("Content-Type", protobufType).SetHeader("Accept", protobufType).
			Namespace(namespace).Resource("resourceclaims").Name(name).SubResource("status").
			Param("fieldManager", DriverName).Body(body).Do(ctx).Error()
		if !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("writing the status of claim %s/%s: %w", namespace, name, err)
	}
	return nil
}

// protobufType is the API server's protobuf media type.
const protobufType = "application/vnd.kubernetes.protobuf"

// encodeClaim is the claim as resource.k8s.io/v1 in protobuf.
func encodeClaim(claim *resourceapi.ResourceClaim) ([]byte, error) {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), protobufType)
	if !ok {
		return nil, errors.New("client-go's scheme has no protobuf serializer")
	}
	return runtime.Encode(scheme.Codecs.EncoderForVersion(info.Serializer, resourceapi.SchemeGroupVersion), claim)
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
