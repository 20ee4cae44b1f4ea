package nicdra_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const head = `"apiVersion": "nic.hwipam.io/v1alpha1", "kind": "NicConfig"`

func class(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClass, nicdra.DriverName, `{`+head+`, `+params+`}`, requests...)
}

func claimConfig(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return opaque(resourceapi.AllocationConfigSourceClaim, nicdra.DriverName, `{`+head+`, `+params+`}`, requests...)
}

func index(i int32) *int32 { return &i }

// ConfigFor with DeviceClass and claim configurations: a field the class's
// configuration sets is the admin's, and a claim's configuration that sets it
// to another value is refused, naming the field, the class's value and the
// claim's (never silently overridden); the class may forbid claim-chosen
// addresses (allowClaimAddresses: false), a field only a class may set; what
// the class leaves open the claim's configurations set, a later one
// overriding an earlier; configurations of other drivers and other requests
// do not apply, and a subrequest takes its parent's.
func TestConfigFor(t *testing.T) {
	for _, c := range []struct {
		name    string
		request string // "nic" when empty
		configs []resourceapi.DeviceAllocationConfiguration
		want    nicdra.Config // without apiVersion and kind
		refused []string      // the error's parts, when refused
	}{
		{name: "the claim's alone", configs: []resourceapi.DeviceAllocationConfiguration{
			claimConfig(`"interfaceName": "net1", "pool": "rail0,rail0-v6", "poolType": "IPPool", "ipIndex": 3`)},
			want: nicdra.Config{InterfaceName: "net1", Pool: "rail0,rail0-v6", PoolType: "IPPool", IPIndex: index(3)}},
		{name: "the class's alone", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0", "interfaceName": "net1"`)},
			want: nicdra.Config{InterfaceName: "net1", Pool: "rail0"}},
		{name: "class and claim set different fields", configs: []resourceapi.DeviceAllocationConfiguration{
			claimConfig(`"interfaceName": "rdma0"`, "nic"), class(`"pool": "rail0"`)},
			want: nicdra.Config{InterfaceName: "rdma0", Pool: "rail0"}},
		{name: "the claim repeats the class's values", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"interfaceName": "net1", "pool": "rail0,rail0-v6", "ipIndex": 2`),
			claimConfig(`"interfaceName": "net1", "pool": "rail0, rail0-v6", "poolType": "ippool", "ipIndex": 2`)},
			want: nicdra.Config{InterfaceName: "net1", Pool: "rail0,rail0-v6", IPIndex: index(2)}},
		{name: "the claim changes the class's interfaceName", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"interfaceName": "net1"`), claimConfig(`"interfaceName": "net2"`)},
			refused: []string{`config 1 (FromClaim)`, `it sets interfaceName "net2", but the DeviceClass's configuration sets interfaceName "net1"`}},
		{name: "the claim changes the class's pool", configs: []resourceapi.DeviceAllocationConfiguration{
			claimConfig(`"pool": "spare"`), class(`"pool": "rail0"`)},
			refused: []string{`config 0 (FromClaim)`, `it sets pool "spare", but the DeviceClass's configuration sets pool "rail0"`}},
		{name: "the claim changes the type of the class's pool", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0"`), claimConfig(`"poolType": "cidrpool"`)},
			refused: []string{`it sets poolType "cidrpool", but the DeviceClass's configuration sets poolType "ippool"`}},
		{name: "the claim changes the class's poolType", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"poolType": "CIDRPool"`), claimConfig(`"pool": "x", "poolType": "ippool"`)},
			refused: []string{`it sets poolType "ippool", but the DeviceClass's configuration sets poolType "CIDRPool"`}},
		{name: "the claim names a pool of the class's poolType", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"poolType": "cidrpool"`), claimConfig(`"pool": "x"`)},
			want: nicdra.Config{Pool: "x", PoolType: "cidrpool"}},
		{name: "a static address in the class's pool", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0"`), claimConfig(`"ips": ["10.24.0.9"]`)},
			want: nicdra.Config{Pool: "rail0", IPs: []string{"10.24.0.9"}}},
		{name: "the claim changes the class's ipIndex", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"ipIndex": 4`), claimConfig(`"ips": ["10.24.0.9"]`)},
			refused: []string{`it sets ips ["10.24.0.9"], but the DeviceClass's configuration sets ipIndex 4`}},
		{name: "a class forbids a claim's ips", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0", "allowClaimAddresses": false`), claimConfig(`"ips": ["10.24.0.9"]`)},
			refused: []string{`it sets ips ["10.24.0.9"], but the DeviceClass's configuration sets allowClaimAddresses false`}},
		{name: "a class forbids a claim's ipIndex", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"allowClaimAddresses": false`), claimConfig(`"interfaceName": "net1"`), claimConfig(`"ipIndex": 0`)},
			refused: []string{`config 2 (FromClaim)`, `it sets ipIndex 0, but the DeviceClass's configuration sets allowClaimAddresses false`}},
		{name: "a class that forbids claims' addresses, a claim without one", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"allowClaimAddresses": false`), claimConfig(`"interfaceName": "net1", "pool": "spare"`)},
			want: nicdra.Config{InterfaceName: "net1", Pool: "spare", AllowClaimAddresses: new(false)}},
		{name: "a class that forbids claims' addresses and sets its own", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"allowClaimAddresses": false, "ipIndex": 1`)},
			want: nicdra.Config{IPIndex: index(1), AllowClaimAddresses: new(false)}},
		{name: "a claim sets allowClaimAddresses", configs: []resourceapi.DeviceAllocationConfiguration{
			claimConfig(`"allowClaimAddresses": true`)},
			refused: []string{`it sets allowClaimAddresses true, which only a DeviceClass's configuration may set`}},
		{name: "every override named at once", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"interfaceName": "net1", "pool": "rail0"`), claimConfig(`"interfaceName": "net2", "pool": "spare"`)},
			refused: []string{`interfaceName "net2"`, `pool "spare"`}},
		{name: "a class configuration of another request", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0", "allowClaimAddresses": false`, "other"), claimConfig(`"pool": "spare", "ipIndex": 1`)},
			want: nicdra.Config{Pool: "spare", IPIndex: index(1)}},
		{name: "a subrequest is bound by its parent's class", request: "nic/ib", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"pool": "rail0"`, "nic"), claimConfig(`"pool": "spare"`, "nic/ib")},
			refused: []string{`pool "spare"`}},
		{name: "another driver's and another request's configurations", configs: []resourceapi.DeviceAllocationConfiguration{
			opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{"whatever": 1}`),
			class(`"interfaceName": "net1"`, "other"), claimConfig(`"ips": ["10.0.0.9"]`, "other"), claimConfig(`"poolType": "CIDRPool"`)},
			want: nicdra.Config{PoolType: "CIDRPool"}},
		{name: "later claim configurations override earlier ones", request: "nic/ib", configs: []resourceapi.DeviceAllocationConfiguration{
			claimConfig(`"interfaceName": "net1", "pool": "a", "poolType": "cidrpool", "ips": ["10.0.0.9"]`),
			claimConfig(`"interfaceName": "net2", "pool": "b", "ipIndex": 1`, "nic")},
			want: nicdra.Config{InterfaceName: "net2", Pool: "b", IPIndex: index(1)}},
		{name: "later class configurations override earlier ones", configs: []resourceapi.DeviceAllocationConfiguration{
			class(`"interfaceName": "net1"`), class(`"interfaceName": "net3"`), claimConfig(`"interfaceName": "net3"`)},
			want: nicdra.Config{InterfaceName: "net3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			request := c.request
			if request == "" {
				request = "nic"
			}
			got, err := nicdra.ConfigFor(&resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: c.configs}}, request)
			if c.refused != nil {
				if !errors.Is(err, nicdra.ErrConfig) {
					t.Fatalf("%+v %v, want ErrConfig", got, err)
				}
				for _, part := range append(c.refused, "drop that from the claim's NicConfig") {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("%v, want it saying %q", err, part)
					}
				}
				return
			}
			want := c.want
			want.APIVersion, want.Kind = nicdra.ConfigAPIVersion, nicdra.ConfigKind
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%+v %v, want %+v", got, err, want)
			}
		})
	}
	if none, err := nicdra.ConfigFor(nil, "nic"); err != nil || !reflect.DeepEqual(none, nicdra.Config{}) {
		t.Errorf("no allocation: %+v %v", none, err)
	}
}

// Bad configuration is refused with what is wrong and what to do, never
// allocated around.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct{ params, want string }{
		{`{` + head + `, "interfaceName": "../../etc"}`, `interfaceName "../../etc" is not a netdev name`},
		{`{` + head + `, "interfaceName": "averyveryverylongname"}`, `interfaceName`},
		{`{` + head + `, "interfaceName": "net%d"}`, `interfaceName "net%d" is not a netdev name (1 to 15 bytes, not "." or "..", without '/', ':', '%' or whitespace, e.g. ens1f0np0): it contains '%'`},
		{`{` + head + `, "interfaceName": "eth0"}`, `interfaceName "eth0" is the pod's primary interface, its CNI network's: choose another, e.g. net1`},
		{`{` + head + `, "interfaceName": "lo"}`, `interfaceName "lo" is the pod's loopback interface`},
		{`{` + head + `, "interfaceName": "tunl0"}`, `interfaceName "tunl0" is a tunnel device the kernel creates in every pod's network namespace`},
		{`{` + head + `, "interfaceName": "gre0"}`, `interfaceName "gre0" is a tunnel device`},
		{`{` + head + `, "interfaceName": "sit0"}`, `interfaceName "sit0" is a tunnel device`},
		{`{` + head + `, "pool": "a,b,c"}`, `names 3 pools`},
		{`{` + head + `, "pool": "Rail_0"}`, `pool "Rail_0" is not a pool's name`},
		{`{` + head + `, "poolType": "subnet"}`, `poolType "subnet": want ippool or cidrpool`},
		{`{` + head + `, "ips": ["10.0.0.300"]}`, `"10.0.0.300" is not an IP address`},
		{`{` + head + `, "ipIndex": -1}`, `ipIndex -1`},
		{`{` + head + `, "interfaceNmae": "net1"}`, `unknown field "interfaceNmae"`},
		{`{` + head + `, "allowClaimAddresses": "no"}`, `allowClaimAddresses`},
		{`{"apiVersion": "v1", "kind": "NicConfig"}`, `want apiVersion nic.hwipam.io/v1alpha1`},
		{`not json`, `want {"apiVersion"`},
	} {
		t.Run(c.params, func(t *testing.T) {
			for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
				alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{
					opaque(source, nicdra.DriverName, c.params)}}}
				_, err := nicdra.ConfigFor(alloc, "nic")
				if !errors.Is(err, nicdra.ErrConfig) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %v, want ErrConfig saying %q", source, err, c.want)
				}
			}
		})
	}
}

// docs/dra.md's pinned DeviceClass does what the page says: its claims keep
// its pool and cannot choose an address, and their other fields are theirs.
func TestConfigOfTheDocsPinnedClass(t *testing.T) {
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "dra.md"))
	if err != nil {
		t.Fatal(err)
	}
	var dc resourceapi.DeviceClass
	for block := range strings.SplitSeq(string(md), "```yaml\n") {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, "kind: DeviceClass") && strings.Contains(block, "allowClaimAddresses") {
			if err := yaml.UnmarshalStrict([]byte(block), &dc); err != nil {
				t.Fatalf("docs/dra.md's DeviceClass: %v", err)
			}
		}
	}
	if len(dc.Spec.Config) != 1 || dc.Spec.Config[0].Opaque == nil {
		t.Fatalf("docs/dra.md has no DeviceClass with a NicConfig: %+v", dc)
	}
	// The scheduler copies the class's configuration into the allocation,
	// with the request that named the class.
	fromClass := resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClass,
		Requests: []string{"nic"}, DeviceConfiguration: dc.Spec.Config[0].DeviceConfiguration}
	for _, c := range []struct {
		name, claim, refused string
	}{
		{"the interface name is the claim's", `"interfaceName": "net1"`, ""},
		{"another pool", `"pool": "spare"`, `it sets pool "spare", but the DeviceClass's configuration sets pool "rail-ibp79s0"`},
		{"a static address", `"ips": ["10.79.0.5"]`, "allowClaimAddresses false"},
		{"allowClaimAddresses", `"allowClaimAddresses": true`, "only a DeviceClass's configuration may set"},
	} {
		t.Run(c.name, func(t *testing.T) {
			alloc := &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{
				fromClass, claimConfig(c.claim, "nic")}}}
			cfg, err := nicdra.ConfigFor(alloc, "nic")
			if c.refused == "" {
				if err != nil || cfg.Pool != "rail-ibp79s0" || cfg.InterfaceName != "net1" {
					t.Errorf("%+v %v, want the class's pool and the claim's name", cfg, err)
				}
				return
			}
			if !errors.Is(err, nicdra.ErrConfig) || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%v, want ErrConfig saying %q", err, c.refused)
			}
		})
	}
}
