package nicdra_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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

// A claim whose opaque parameters were sent with spaces (json.dumps in a
// Python client, or any client that does not compact) keeps them byte for
// byte, and so does the scheduler's copy in status.allocation. The status of
// its devices is written all the same (issue 45, item 6: a merge patch is
// applied by the API server to the claim encoded as JSON again, which compacts
// the allocation's parameters, and the server refused the write as a change
// of status.allocation, so the pod never started). Both a JSON client, as
// kubectl is, and a protobuf client write it.
func TestClaimStatusWithSpacedParameters(t *testing.T) {
	cfg, jsonClient := controlPlane(t)
	ctx := t.Context()
	pcfg := rest.CopyConfig(cfg)
	pcfg.ContentType = "application/vnd.kubernetes.protobuf"
	protoClient, err := kubernetes.NewForConfig(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{
		"python":  `{"apiVersion": "nic.hwipam.io/v1alpha1", "kind": "NicConfig", "interfaceName": "net1"}`,
		"indent":  "{\n  \"apiVersion\": \"nic.hwipam.io/v1alpha1\",\n  \"kind\": \"NicConfig\",\n  \"interfaceName\": \"net1\"\n}",
		"kubectl": `{"apiVersion":"nic.hwipam.io/v1alpha1","interfaceName":"net1","kind":"NicConfig"}`,
	}
	for _, name := range slices.Sorted(maps.Keys(params)) {
		for ci, writer := range []kubernetes.Interface{jsonClient, protoClient} {
			claimName := fmt.Sprintf("%s-%d", name, ci)
			// The tenant's claim, as its client sends it: the parameters as they are.
			body := `{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "` + claimName + `"},
  "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.hwipam.io"}}],
    "config": [{"requests": ["nic"], "opaque": {"driver": "nic.hwipam.io", "parameters": ` + params[name] + `}}]}}}`
			raw, err := jsonClient.ResourceV1().RESTClient().Post().Namespace("ml").Resource("resourceclaims").
				Body([]byte(body)).SetHeader("Content-Type", "application/json").DoRaw(ctx)
			if err != nil {
				t.Fatalf("%s: creating the claim: %v: %s", claimName, err, raw)
			}
			// The scheduler's allocation (a protobuf client) copies the claim's
			// configuration as it is stored.
			claim, err := protoClient.ResourceV1().ResourceClaims("ml").Get(ctx, claimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(claim.Spec.Devices.Config[0].Opaque.Parameters.Raw); got != params[name] {
				t.Fatalf("%s: the API server stored the parameters as %q, not as sent", claimName, got)
			}
			claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: nicdra.DriverName, Pool: "dgx-1", Device: "pci-0000-18-00-0"}},
				Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"nic"},
					DeviceConfiguration: claim.Spec.Devices.Config[0].DeviceConfiguration}}}}
			claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + claimName, UID: "uid-" + types.UID(claimName)}}
			if claim, err = protoClient.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			dev := nicdra.PreparedDevice{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", InterfaceName: "net1",
				Pools: []string{"rail0"}, PoolType: "ippool", Addresses: []string{"10.24.0.2/16"}, MAC: "00:00:10:29:fe:80"}
			if err := nicdra.ApplyClaimStatus(ctx, writer, "ml", claimName, claim.UID, "dgx-1", []nicdra.PreparedDevice{dev}); err != nil {
				t.Errorf("%s: %v", claimName, err)
				continue
			}
			got, err := protoClient.ResourceV1().ResourceClaims("ml").Get(ctx, claimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Status.Devices) != 1 || got.Status.Devices[0].NetworkData == nil ||
				!slices.Equal(got.Status.Devices[0].NetworkData.IPs, dev.Addresses) {
				t.Errorf("%s: status devices %+v", claimName, got.Status.Devices)
			}
			if p := string(got.Status.Allocation.Devices.Config[0].Opaque.Parameters.Raw); p != params[name] {
				t.Errorf("%s: the allocation's parameters became %q", claimName, p)
			}
		}
	}
}
