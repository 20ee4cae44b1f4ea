package nicdra_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// The claim's status gets networkData and data for this driver's device, on a
// real API server, beside another driver's entry, which stays as that driver
// wrote it; applying again changes nothing.
func TestApplyClaimStatus(t *testing.T) {
	_, cs := controlPlane(t)
	ctx := t.Context()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "pair", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}},
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.hwipam.io"}},
		}}}}
	claim, err := cs.ResourceV1().ResourceClaims("ml").Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The scheduler's allocation, and the GPU driver's status entry.
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "dgx-1", Device: "gpu-0"},
		{Request: "nic", Driver: nicdra.DriverName, Pool: "dgx-1", Device: "pci-0000-18-00-0"},
	}, Config: []resourceapi.DeviceAllocationConfiguration{
		// Opaque parameters: the API server of 1.37 refuses a server-side
		// apply to such a claim's status ("status.allocation: field cannot be
		// modified once set"), and any status write when they were written
		// with spaces by a protobuf client; kubectl and the scheduler send
		// compact JSON.
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{"apiVersion":"nic.hwipam.io/v1alpha1","kind":"NicConfig","interfaceName":"net1"}`, "nic")}}}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.nvidia.com", Pool: "dgx-1", Device: "gpu-0",
		Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-1"}`)}}}
	if _, err := cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dev := nicdra.PreparedDevice{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", HostNetdev: "ibp24s0",
		InterfaceName: "net1", Pools: []string{"rail0", "rail0-v6"}, PoolType: "ippool", Rail: "ibp24s0",
		Addresses: []string{"10.24.0.2/16", "fd00:24::2/64"}, Gateway: "10.24.0.1", Routes: []string{"10.0.0.0/8"}, MAC: "00:00:10:29:fe:80"}
	var rv string
	for i := range 2 {
		if err := nicdra.ApplyClaimStatus(ctx, cs, "ml", "pair", claim.UID, "dgx-1", []nicdra.PreparedDevice{dev}); err != nil {
			t.Fatal(err)
		}
		got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "pair", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 && got.ResourceVersion != rv {
			t.Errorf("applying the same status again wrote the claim")
		}
		rv = got.ResourceVersion
		if len(got.Status.Devices) != 2 {
			t.Fatalf("status devices %+v, want the GPU driver's and ours", got.Status.Devices)
		}
		for _, d := range got.Status.Devices {
			switch d.Driver {
			case "gpu.nvidia.com":
				if d.Data == nil || string(d.Data.Raw) != `{"uuid":"GPU-1"}` {
					t.Errorf("the GPU driver's entry changed: %+v", d)
				}
			case nicdra.DriverName:
				nd := d.NetworkData
				if nd == nil || nd.InterfaceName != "net1" || !slices.Equal(nd.IPs, dev.Addresses) || nd.HardwareAddress != dev.MAC {
					t.Errorf("networkData %+v", nd)
				}
				var data nicdra.DeviceData
				if d.Data == nil || json.Unmarshal(d.Data.Raw, &data) != nil || data.Gateway != "10.24.0.1" || data.Rail != "ibp24s0" ||
					!slices.Equal(data.Pools, dev.Pools) || !slices.Equal(data.Routes, dev.Routes) {
					t.Errorf("data %+v", d.Data)
				}
			}
		}
	}
	// A device the claim was not allocated is refused by the API server.
	other := dev
	other.Device = "pci-0000-40-00-0"
	if err := nicdra.ApplyClaimStatus(ctx, cs, "ml", "pair", claim.UID, "dgx-1", []nicdra.PreparedDevice{dev, other}); err == nil {
		t.Errorf("the status of a device the claim was not allocated was accepted")
	}
}

// A claim deleted and re-created under its name (a new UID) is not the claim
// prepared: its status is not written (ErrClaimReplaced), and stays as it is.
func TestApplyClaimStatusOnlyToItsUID(t *testing.T) {
	_, cs := controlPlane(t)
	ctx := t.Context()
	old := allocated(t, cs, "re", "pci-0000-18-00-0")
	if err := cs.ResourceV1().ResourceClaims("ml").Delete(ctx, "re", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := allocated(t, cs, "re", "pci-0000-18-00-0")
	dev := nicdra.PreparedDevice{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", InterfaceName: "net1",
		Pools: []string{"rail0"}, PoolType: "ippool", Addresses: []string{"10.24.0.2/16"}}
	err := nicdra.ApplyClaimStatus(ctx, cs, "ml", "re", old.UID, "dgx-1", []nicdra.PreparedDevice{dev})
	if !errors.Is(err, nicdra.ErrClaimReplaced) || !strings.Contains(err.Error(), string(old.UID)) {
		t.Errorf("the status of the re-created claim with the old UID: %v", err)
	}
	got, err := cs.ResourceV1().ResourceClaims("ml").Get(ctx, "re", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != again.UID || len(got.Status.Devices) != 0 {
		t.Errorf("the re-created claim's status was written: %+v", got.Status.Devices)
	}
	// Its own UID: written.
	if err := nicdra.ApplyClaimStatus(ctx, cs, "ml", "re", again.UID, "dgx-1", []nicdra.PreparedDevice{dev}); err != nil {
		t.Fatal(err)
	}
}
