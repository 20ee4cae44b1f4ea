package nicdra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
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
	// bytes, no '/', ':' or whitespace); default: its name on the host.
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
}

// ErrConfig is a configuration no retry can fix: the pod's event says what is
// wrong and nothing is allocated.
var ErrConfig = errors.New("invalid nic.hwipam.io configuration")

// ConfigFor returns the configuration of request's device in an allocation:
// this driver's opaque configurations that apply to the request (those naming
// no request apply to all; a subrequest "r/s" takes those of "r" too), the
// DeviceClass's before the claim's, each later one overriding the fields it
// sets. It is checked (see Config.Check).
func ConfigFor(alloc *resourceapi.AllocationResult, request string) (Config, error) {
	var out Config
	if alloc == nil {
		return out, nil
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
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
				return Config{}, fmt.Errorf("%w: config %d (%s): %w; want %s", ErrConfig, i, source, err, configShape)
			}
			if cfg.APIVersion != ConfigAPIVersion || cfg.Kind != ConfigKind {
				return Config{}, fmt.Errorf("%w: config %d (%s) is apiVersion %q kind %q; want apiVersion %s, kind %s",
					ErrConfig, i, source, cfg.APIVersion, cfg.Kind, ConfigAPIVersion, ConfigKind)
			}
			out.merge(cfg)
		}
	}
	out.APIVersion, out.Kind = ConfigAPIVersion, ConfigKind
	return out, out.Check()
}

// configShape is what a configuration looks like, for error messages.
const configShape = `{"apiVersion": "` + ConfigAPIVersion + `", "kind": "` + ConfigKind +
	`", "interfaceName": "net1", "pool": "rail0", "poolType": "ippool", "ips": ["10.0.0.5"], "ipIndex": 5}, every field but the first two optional`

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
}

// Check says what is wrong with the configuration, in one error (errors.Is
// ErrConfig), nil when nothing is.
func (c Config) Check() error {
	var problems []string
	if c.InterfaceName != "" {
		if err := (devicename.Field{Name: "interfaceName", Kinds: devicename.Netdev}).Check(c.InterfaceName); err != nil {
			problems = append(problems, err.Error())
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
