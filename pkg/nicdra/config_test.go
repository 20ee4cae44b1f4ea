package nicdra_test

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const head = `"apiVersion": "nic.hwipam.io/v1alpha1", "kind": "NicConfig"`

// The DeviceClass's configuration first, then the claim's, each overriding the
// fields it sets; configurations of other drivers and other requests do not
// apply; a subrequest takes its parent's.
func TestConfigFor(t *testing.T) {
	alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "interfaceName": "rdma0"}`, "nic"),
		opaque(resourceapi.AllocationConfigSourceClass, nicdra.DriverName, `{`+head+`, "interfaceName": "net1", "pool": "rail0,rail0-v6", "ipIndex": 3}`),
		opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{"whatever": 1}`),
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "ips": ["10.0.0.9"]}`, "other"),
		opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, "poolType": "CIDRPool"}`),
	}}}
	for _, request := range []string{"nic", "nic/ib"} {
		cfg, err := nicdra.ConfigFor(alloc, request)
		if err != nil {
			t.Fatalf("%s: %v", request, err)
		}
		if cfg.InterfaceName != "rdma0" || cfg.Pool != "rail0,rail0-v6" || cfg.PoolType != "CIDRPool" || cfg.IPIndex == nil ||
			*cfg.IPIndex != 3 || cfg.IPs != nil {
			t.Errorf("%s: %+v", request, cfg)
		}
	}
	other, err := nicdra.ConfigFor(alloc, "other")
	if err != nil || other.InterfaceName != "net1" || len(other.IPs) != 1 || other.IPIndex != nil {
		t.Errorf("other: %+v %v (its ips replace the class's ipIndex)", other, err)
	}
	if none, err := nicdra.ConfigFor(nil, "nic"); err != nil || none.Pool != "" {
		t.Errorf("no allocation: %+v %v", none, err)
	}
}

// Bad configuration is refused with what is wrong and what to do, never
// allocated around.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct{ params, want string }{
		{`{` + head + `, "interfaceName": "../../etc"}`, `interfaceName "../../etc" is not a netdev name`},
		{`{` + head + `, "interfaceName": "averyveryverylongname"}`, `interfaceName`},
		{`{` + head + `, "pool": "a,b,c"}`, `names 3 pools`},
		{`{` + head + `, "pool": "Rail_0"}`, `pool "Rail_0" is not a pool's name`},
		{`{` + head + `, "poolType": "subnet"}`, `poolType "subnet": want ippool or cidrpool`},
		{`{` + head + `, "ips": ["10.0.0.300"]}`, `"10.0.0.300" is not an IP address`},
		{`{` + head + `, "ipIndex": -1}`, `ipIndex -1`},
		{`{` + head + `, "interfaceNmae": "net1"}`, `unknown field "interfaceNmae"`},
		{`{"apiVersion": "v1", "kind": "NicConfig"}`, `want apiVersion nic.hwipam.io/v1alpha1`},
		{`not json`, `want {"apiVersion"`},
	} {
		alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{
			opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, c.params)}}}
		_, err := nicdra.ConfigFor(alloc, "nic")
		if !errors.Is(err, nicdra.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrConfig saying %q", c.params, err, c.want)
		}
	}
}
