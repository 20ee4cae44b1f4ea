package nicdra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hwipam/hwipam/pkg/devicename"
)

// The opaque configuration a claim or a DeviceClass may give nic.hwipam.io
// devices (docs/dra.md): its apiVersion and kind.
const (
	ConfigAPIVersion = DriverName + "/v1alpha1"
	ConfigKind       = "NicConfig"
)

// Config is a device's configuration: where its address comes from and what the
// pod sees. Every field is optional; a device without one gets an address from
// the pool labelled for its rail, and keeps its host name in the pod.
type Config struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// InterfaceName is the netdev's name in the pod (a netdev name: at most 15
	// bytes, no '/', ':', '%' or whitespace; not eth0 or lo, which the pod
	// has); default: its name on the host.
	InterfaceName string `json:"interfaceName,omitempty"`
	// Pool overrides the rail's pool: one pool, or two comma-separated for
	// dual-stack, of PoolType (ippool, the default, or cidrpool).
	Pool     string `json:"pool,omitempty"`
	PoolType string `json:"poolType,omitempty"`
	// IPs are static addresses, one per pool, as CNI's "ips" capability.
	IPs []string `json:"ips,omitempty"`
	// IPIndex asks for the address at this index of the node's block, as the
	// CNI path's allocateIPWithIndex.
	IPIndex *int32 `json:"ipIndex,omitempty"`
	// AllowClaimAddresses, in a DeviceClass's configuration only, says whether
	// the claims of the class may choose their addresses (ips, ipIndex):
	// false refuses a claim that does, so that the class's devices take the
	// pool's next free address. Unset means true. A claim's configuration
	// that sets it is refused.
	AllowClaimAddresses *bool `json:"allowClaimAddresses,omitempty"`
}

// ErrConfig is a configuration no retry can fix: the pod's event says what is
// wrong and nothing is allocated.
var ErrConfig = errors.New("invalid nic.hwipam.io configuration")

// ConfigFor returns the configuration of request's device in an allocation:
// this driver's opaque configurations that apply to the request (those naming
// no request apply to all; a subrequest "r/s" takes those of "r" too). The
// DeviceClass's configurations are the admin's: a field one of them sets is
// fixed, and a claim's configuration that sets it to another value is refused
// (errors.Is ErrConfig, naming the field, the class's value and the claim's),
// never silently overridden; a class that sets allowClaimAddresses: false
// refuses a claim's ips and ipIndex, and only a class may set that field. The
// fields neither fixes nor refuses come from the claim's configurations, each
// later one overriding the fields it sets. The result is checked (see
// Config.Check).
func ConfigFor(alloc *resourceapi.AllocationResult, request string) (Config, error) {
	if alloc == nil {
		return Config{}, nil
	}
	classes, err := configsOf(alloc, request, resourceapi.AllocationConfigSourceClass)
	if err != nil {
		return Config{}, err
	}
	claims, err := configsOf(alloc, request, resourceapi.AllocationConfigSourceClaim)
	if err != nil {
		return Config{}, err
	}
	var class Config
	for _, c := range classes {
		class.merge(c.Config)
	}
	out := class
	for _, c := range claims {
		if problems := c.overrides(class); len(problems) > 0 {
			return Config{}, fmt.Errorf("%w: config %d (%s): %s; a DeviceClass's configuration is the cluster admin's and "+
				"the claim's may not change it: drop that from the claim's %s, or use a DeviceClass that leaves it to the claim",
				ErrConfig, c.index, c.source, strings.Join(problems, "; "), ConfigKind)
		}
		out.merge(c.Config)
	}
	out.merge(class) // a field the class sets has the class's value (a claim's equal one is no change)
	out.APIVersion, out.Kind = ConfigAPIVersion, ConfigKind
	return out, out.Check()
}

// sourcedConfig is one opaque configuration of an allocation, decoded, with
// where it came from: its index in the allocation's configurations and its
// source (class or claim).
type sourcedConfig struct {
	Config
	index  int
	source resourceapi.AllocationConfigSource
}

// configsOf decodes this driver's configurations from source that apply to
// request, in the allocation's order.
func configsOf(alloc *resourceapi.AllocationResult, request string, source resourceapi.AllocationConfigSource) ([]sourcedConfig, error) {
	parent, _, _ := strings.Cut(request, "/")
	var out []sourcedConfig
	for i, c := range alloc.Devices.Config {
		if c.Source != source || c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		applies := len(c.Requests) == 0
		for _, r := range c.Requests {
			applies = applies || r == request || r == parent
		}
		if !applies {
			continue
		}
		var cfg Config
		dec := json.NewDecoder(bytes.NewReader(c.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return nil, fmt.Errorf("%w: config %d (%s): %w; want %s", ErrConfig, i, source, err, configShape)
		}
		if cfg.APIVersion != ConfigAPIVersion || cfg.Kind != ConfigKind {
			return nil, fmt.Errorf("%w: config %d (%s) is apiVersion %q kind %q; want apiVersion %s, kind %s",
				ErrConfig, i, source, cfg.APIVersion, cfg.Kind, ConfigAPIVersion, ConfigKind)
		}
		out = append(out, sourcedConfig{Config: cfg, index: i, source: source})
	}
	return out, nil
}

// overrides says what a claim's configuration c would change of class, the
// merged configuration of the DeviceClass: each field class sets that c sets
// to another value, a claim-chosen address where class forbids one, and the
// class-only allowClaimAddresses; nothing when c changes nothing.
func (c Config) overrides(class Config) []string {
	var out []string
	differs := func(field, classValue, claimValue string) {
		out = append(out, fmt.Sprintf("it sets %s %s, but the DeviceClass's configuration sets %s %s", field, claimValue,
			field, classValue))
	}
	if c.AllowClaimAddresses != nil {
		out = append(out, fmt.Sprintf("it sets allowClaimAddresses %t, which only a DeviceClass's configuration may set",
			*c.AllowClaimAddresses))
	}
	if class.InterfaceName != "" && c.InterfaceName != "" && c.InterfaceName != class.InterfaceName {
		differs("interfaceName", strconv.Quote(class.InterfaceName), strconv.Quote(c.InterfaceName))
	}
	if class.Pool != "" && c.Pool != "" && !slices.Equal(class.Pools(), c.Pools()) {
		differs("pool", strconv.Quote(class.Pool), strconv.Quote(c.Pool))
	}
	// A class's pool is of its poolType, ippool when it sets none.
	if t := class.fixedPoolType(); t != "" && c.PoolType != "" && !strings.EqualFold(c.PoolType, t) {
		differs("poolType", strconv.Quote(t), strconv.Quote(c.PoolType))
	}
	switch {
	case !c.setsAddress():
	case class.AllowClaimAddresses != nil && !*class.AllowClaimAddresses:
		out = append(out, fmt.Sprintf("it sets %s, but the DeviceClass's configuration sets allowClaimAddresses false: "+
			"the class's devices take their addresses from their pool, in its order", c.address()))
	case class.setsAddress() && c.address() != class.address():
		out = append(out, fmt.Sprintf("it sets %s, but the DeviceClass's configuration sets %s", c.address(), class.address()))
	}
	return out
}

// fixedPoolType is the pool type a class's configuration fixes: its poolType,
// or ippool when it names a pool but no type; "" when it fixes none.
func (c Config) fixedPoolType() string {
	switch {
	case c.PoolType != "":
		return c.PoolType
	case c.Pool != "":
		return "ippool"
	}
	return ""
}

// setsAddress says whether the configuration chooses the address (ips or
// ipIndex).
func (c Config) setsAddress() bool { return c.IPs != nil || c.IPIndex != nil }

// address describes the address the configuration chooses, for messages and
// comparison.
func (c Config) address() string {
	switch {
	case c.IPs != nil:
		return fmt.Sprintf("ips %q", c.IPs)
	case c.IPIndex != nil:
		return fmt.Sprintf("ipIndex %d", *c.IPIndex)
	}
	return "no address"
}

// configShape is what a configuration looks like, for error messages.
const configShape = `{"apiVersion": "` + ConfigAPIVersion + `", "kind": "` + ConfigKind +
	`", "interfaceName": "net1", "pool": "rail0", "poolType": "ippool", "ips": ["10.0.0.5"], "ipIndex": 5}, every field but the first two optional` +
	` (and, in a DeviceClass's configuration only, "allowClaimAddresses": false)`

// merge sets the fields that o sets.
func (c *Config) merge(o Config) {
	if o.InterfaceName != "" {
		c.InterfaceName = o.InterfaceName
	}
	if o.Pool != "" {
		c.Pool, c.PoolType = o.Pool, o.PoolType
	}
	if o.PoolType != "" {
		c.PoolType = o.PoolType
	}
	if o.IPs != nil {
		c.IPs, c.IPIndex = o.IPs, nil
	}
	if o.IPIndex != nil {
		c.IPIndex, c.IPs = o.IPIndex, nil
	}
	if o.AllowClaimAddresses != nil {
		c.AllowClaimAddresses = o.AllowClaimAddresses
	}
}

// Check says what is wrong with the configuration, in one error (errors.Is
// ErrConfig), nil when nothing is.
func (c Config) Check() error {
	var problems []string
	if c.InterfaceName != "" {
		if err := (devicename.Field{Name: "interfaceName", Kinds: devicename.Netdev}).Check(c.InterfaceName); err != nil {
			problems = append(problems, err.Error())
		} else if why := podOwnName(c.InterfaceName); why != "" {
			problems = append(problems, fmt.Sprintf("interfaceName %q is %s: choose another, e.g. net1", c.InterfaceName, why))
		}
	}
	pools := c.Pools()
	if len(pools) > 2 {
		problems = append(problems, fmt.Sprintf("pool %q names %d pools; one, or two for dual-stack", c.Pool, len(pools)))
	}
	for _, p := range pools {
		if errs := validation.IsDNS1123Subdomain(p); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("pool %q is not a pool's name: %s", p, strings.Join(errs, "; ")))
		}
	}
	switch strings.ToLower(c.PoolType) {
	case "", "ippool", "cidrpool":
	default:
		problems = append(problems, fmt.Sprintf("poolType %q: want ippool or cidrpool", c.PoolType))
	}
	if len(c.IPs) > 2 {
		problems = append(problems, fmt.Sprintf("ips lists %d addresses; one per pool, two at most", len(c.IPs)))
	}
	for _, s := range c.IPs {
		if _, err := netip.ParseAddr(s); err != nil {
			problems = append(problems, fmt.Sprintf("ips: %q is not an IP address", s))
		}
	}
	if c.IPIndex != nil && *c.IPIndex < 0 {
		problems = append(problems, fmt.Sprintf("ipIndex %d: want 0 or more", *c.IPIndex))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrConfig, strings.Join(problems, "; "))
}

// podOwnName says why a netdev name cannot be a device's name in a pod, ""
// when it can: eth0 is the pod's primary (CNI) interface and lo its loopback,
// which every pod has before its sandbox starts, as it has the tunnel drivers'
// fallback devices (tunl0, sit0, gre0, ...) on a node that loaded them. (Multus names a NAD's
// interfaces net1, net2, ...; those are free in a pod without NADs, so a clash
// with one is found when the sandbox starts, docs/dra.md.)
func podOwnName(name string) string {
	switch name {
	case "eth0":
		return "the pod's primary interface, its CNI network's"
	case "lo":
		return "the pod's loopback interface"
	case "tunl0", "sit0", "ip6tnl0", "gre0", "gretap0", "erspan0", "ip6gre0", "ip_vti0", "ip6_vti0":
		// The tunnel drivers' fallback devices, which the kernel creates in
		// every network namespace once their module is loaded
		// (net.core.fb_tunnels_only_for_init_net=0, the default).
		return "a tunnel device the kernel creates in every pod's network namespace once its module is loaded"
	}
	return ""
}

// Pools are the pools Pool names, none when it names none.
func (c Config) Pools() []string {
	if c.Pool == "" {
		return nil
	}
	var out []string
	for p := range strings.SplitSeq(c.Pool, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}

// CheckConfigTargets refuses a configuration of this driver that names a
// request whose device is another driver's (a NicConfig on a GPU's request,
// say): it would configure nothing, and the claim's author meant it for a
// NIC.
func CheckConfigTargets(alloc *resourceapi.AllocationResult) error {
	if alloc == nil {
		return nil
	}
	drivers := map[string][]string{} // request (and its parent) → drivers of its devices
	for _, r := range alloc.Devices.Results {
		parent, _, _ := strings.Cut(r.Request, "/")
		drivers[r.Request] = append(drivers[r.Request], r.Driver)
		drivers[parent] = append(drivers[parent], r.Driver)
	}
	for i, c := range alloc.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		for _, req := range c.Requests {
			if ds := drivers[req]; len(ds) > 0 && !slices.Contains(ds, DriverName) {
				return fmt.Errorf("%w: config %d (%s) is a %s configuration for request %q, whose device is of driver %s, "+
					"not %s: name the NIC's request in its requests", ErrConfig, i, c.Source, ConfigKind, req,
					strings.Join(slices.Compact(slices.Sorted(slices.Values(ds))), ", "), DriverName)
			}
		}
	}
	return nil
}
