// Package cniplugin is the nv-ipam CNI IPAM plugin: it turns a CNI call into one
// gRPC call to the node daemon and prints the result. It keeps its import graph
// small (no Kubernetes client libraries) because a runtime execs it for every call.
package cniplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/hwipam/hwipam/pkg/devicename"
	"github.com/hwipam/hwipam/pkg/ipamwire"
)

// Defaults, as nv-ipam's.
const (
	DefaultConfDir      = "/etc/cni/net.d/nv-ipam.d"
	DefaultDaemonSocket = "unix:///var/lib/cni/nv-ipam/daemon.sock"
	DefaultTimeout      = 5 * time.Second
	DefaultLogFile      = "/var/log/nv-ipam-cni.log"
	DefaultLogLevel     = "info"
	ConfFileName        = "nv-ipam.conf"
)

// FileConfig is the ipam section's settings that <confDir>/nv-ipam.conf may also
// hold (the daemon writes it); the network config wins where both set a value.
type FileConfig struct {
	DaemonSocket             string `json:"daemonSocket,omitempty"`
	DaemonCallTimeoutSeconds *int   `json:"daemonCallTimeoutSeconds,omitempty"`
	LogFile                  string `json:"logFile,omitempty"`
	LogLevel                 string `json:"logLevel,omitempty"`
	ConfDir                  string `json:"confDir,omitempty"`
	PoolName                 string `json:"poolName,omitempty"`
	PoolType                 string `json:"poolType,omitempty"`
	// Rail picks the pools by rail instead of by name (docs/rails.md): "auto",
	// the rail of the attachment's device, or a rail's name. Network config only.
	Rail string `json:"rail,omitempty"`
	// ForcePoolName makes poolName (or args.cni.poolNames) required instead of
	// defaulting to the network's name.
	ForcePoolName *bool `json:"forcePoolName,omitempty"`
}

type ipamSection struct {
	Type string `json:"type"`
	FileConfig
}

type cniArgs struct {
	IPs                    []string `json:"ips,omitempty"`
	PoolNames              []string `json:"poolNames,omitempty"`
	PoolType               string   `json:"poolType,omitempty"`
	AllocateDefaultGateway bool     `json:"allocateDefaultGateway,omitempty"`
	AllocateIPWithIndex    *int32   `json:"allocateIPWithIndex,omitempty"`
}

type netConf struct {
	CNIVersion    string       `json:"cniVersion"`
	Name          string       `json:"name"`
	IPAM          *ipamSection `json:"ipam"`
	DeviceID      string       `json:"deviceID,omitempty"`
	PCIBusID      string       `json:"pciBusID,omitempty"`
	Master        string       `json:"master,omitempty"`
	Device        string       `json:"device,omitempty"`
	RuntimeConfig struct {
		IPs []string `json:"ips,omitempty"`
		// DeviceID is the deviceID capability: Multus passes a network selection
		// element's deviceID this way to a plugin that declares the capability.
		DeviceID string `json:"deviceID,omitempty"`
	} `json:"runtimeConfig"`
	Args *struct {
		CNI *cniArgs `json:"cni,omitempty"`
	} `json:"args,omitempty"`
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
	PrevResult       json.RawMessage      `json:"prevResult,omitempty"`
}

// Config is a CNI call's configuration, resolved: network config, conf file and
// CNI_ARGS merged and checked.
type Config struct {
	CNIVersion   string
	Network      string
	Pools        []string
	PoolType     string // "ippool" or "cidrpool"
	DaemonSocket string
	Timeout      time.Duration
	LogFile      string
	LogLevel     string
	DeviceID     string
	// Rail is "auto" or a rail's name when the pools are picked by rail (Pools is
	// then empty); PCIBusID, Master and Device are the attachment's device besides
	// DeviceID.
	Rail, PCIBusID, Master, Device string
	RequestedIPs                   []netip.Addr
	Gateway                        bool
	Index                          *int32
	PodName                        string
	PodNamespace                   string
	PodUID                         string

	ValidAttachments []types.GCAttachment
	PrevResult       json.RawMessage
}

// errReservedName refuses the network name of the DRA driver's allocations
// (ipamwire.ReservedNetworkName).
func errReservedName() error {
	return configErr("network name %q is reserved for hwipam's DRA driver (its allocations carry it): rename the "+
		"network (the \"name\" of the NetworkAttachmentDefinition's config)", ipamwire.ReservedNetworkName)
}

// errConfig marks configuration errors (CNI code 7).
var errConfig = errors.New("invalid network configuration")

func configErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errConfig, fmt.Sprintf(format, a...))
}

// LoadConfig parses stdin and CNI_ARGS. needPod says whether K8S_POD_NAME and
// K8S_POD_NAMESPACE are required (ADD).
func LoadConfig(stdin []byte, envArgs string, needPod bool) (*Config, error) {
	var nc netConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, configErr("network configuration is not valid JSON: %v", err)
	}
	return resolveConfig(&nc, envArgs, needPod, os.ReadFile, func(data []byte, fc *FileConfig) error { return json.Unmarshal(data, fc) })
}

// resolveConfig merges a decoded network config with nv-ipam.conf (read with
// readFile, decoded with decodeFile) and CNI_ARGS, and checks the result.
func resolveConfig(nc *netConf, envArgs string, needPod bool, readFile func(string) ([]byte, error),
	decodeFile func([]byte, *FileConfig) error) (*Config, error) {
	if nc.IPAM == nil {
		return nil, configErr("no \"ipam\" section")
	}
	// A DEL goes through: an attachment made before the name was refused is
	// released by its own container ID and interface.
	if needPod && nc.Name == ipamwire.ReservedNetworkName {
		return nil, errReservedName()
	}
	ipam := nc.IPAM.FileConfig
	confDir := ipam.ConfDir
	if confDir == "" {
		confDir = DefaultConfDir
	}
	if data, err := readFile(filepath.Join(confDir, ConfFileName)); err == nil {
		var fc FileConfig
		if err := decodeFile(data, &fc); err != nil {
			return nil, configErr("%s is not valid JSON: %v", filepath.Join(confDir, ConfFileName), err)
		}
		fill(&ipam.DaemonSocket, fc.DaemonSocket)
		fill(&ipam.LogFile, fc.LogFile)
		fill(&ipam.LogLevel, fc.LogLevel)
		fill(&ipam.PoolType, fc.PoolType)
		fill(&ipam.PoolName, fc.PoolName)
		if ipam.DaemonCallTimeoutSeconds == nil {
			ipam.DaemonCallTimeoutSeconds = fc.DaemonCallTimeoutSeconds
		}
		if ipam.ForcePoolName == nil {
			ipam.ForcePoolName = fc.ForcePoolName
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, configErr("reading %s: %v", filepath.Join(confDir, ConfFileName), err)
	}
	c := &Config{CNIVersion: nc.CNIVersion, Network: nc.Name, DaemonSocket: ipam.DaemonSocket, LogFile: ipam.LogFile,
		LogLevel: ipam.LogLevel, DeviceID: nc.DeviceID, Timeout: DefaultTimeout,
		ValidAttachments: nc.ValidAttachments, PrevResult: nc.PrevResult}
	fill(&c.DaemonSocket, DefaultDaemonSocket)
	fill(&c.LogFile, DefaultLogFile)
	fill(&c.LogLevel, DefaultLogLevel)
	if t := ipam.DaemonCallTimeoutSeconds; t != nil {
		if *t <= 0 {
			return nil, configErr("ipam.daemonCallTimeoutSeconds %d must be positive", *t)
		}
		c.Timeout = time.Duration(*t) * time.Second
	}
	var args cniArgs
	if nc.Args != nil && nc.Args.CNI != nil {
		args = *nc.Args.CNI
	}
	c.PCIBusID, c.Master, c.Device = nc.PCIBusID, nc.Master, nc.Device
	if c.DeviceID == "" {
		c.DeviceID = nc.RuntimeConfig.DeviceID
	}
	// Pools: by rail (ipam.rail), else args.cni.poolNames, else ipam.poolName (one,
	// or two comma-separated), else the network's name.
	switch {
	case nc.IPAM.Rail != "":
		if nc.IPAM.PoolName != "" || len(args.PoolNames) > 0 {
			return nil, configErr("ipam.rail %q picks the pools by rail: remove ipam.poolName (and args.cni.poolNames), "+
				"or remove rail to name the pools", nc.IPAM.Rail)
		}
		if err := checkRail(nc.IPAM.Rail); err != nil {
			return nil, err
		}
		// An ADD needs the device; GC and STATUS are about the network, and a DEL
		// without it releases the interface wherever it holds addresses.
		if needPod && nc.IPAM.Rail == "auto" && c.DeviceID == "" && nc.PCIBusID == "" && nc.Master == "" && nc.Device == "" {
			return nil, configErr("ipam.rail \"auto\" takes the rail of the attachment's device, and this network config " +
				"names none: it needs deviceID (SR-IOV, as Multus passes it), pciBusID or device (host-device), or master " +
				"(macvlan, ipvlan, ipoib); or name the rail")
		}
		if needPod && nc.IPAM.Rail == "auto" {
			if err := checkDevice(nc, c.DeviceID); err != nil {
				return nil, err
			}
		}
		c.Rail = nc.IPAM.Rail
	case len(args.PoolNames) > 0:
		c.Pools = args.PoolNames
	case ipam.PoolName != "":
		c.Pools = strings.Split(ipam.PoolName, ",")
	case ipam.ForcePoolName != nil && *ipam.ForcePoolName:
		return nil, configErr("forcePoolName is set: ipam.poolName (or args.cni.poolNames) is required")
	default:
		c.Pools = []string{nc.Name}
	}
	for i, p := range c.Pools {
		c.Pools[i] = strings.TrimSpace(p)
		if c.Pools[i] == "" {
			return nil, configErr("pool name %d is empty (poolName %q)", i, ipam.PoolName)
		}
	}
	if len(c.Pools) > 2 && c.Rail == "" {
		return nil, configErr("%d pools named (%s): give one, or two for dual-stack", len(c.Pools), strings.Join(c.Pools, ","))
	}
	poolType := args.PoolType
	fill(&poolType, ipam.PoolType)
	switch strings.ToLower(poolType) {
	case "", "ippool":
		c.PoolType = "ippool"
	case "cidrpool":
		c.PoolType = "cidrpool"
	default:
		return nil, configErr("poolType %q: want ippool or cidrpool", poolType)
	}
	c.Gateway, c.Index = args.AllocateDefaultGateway, args.AllocateIPWithIndex

	env, err := parseEnvArgs(envArgs)
	if err != nil {
		return nil, err
	}
	c.PodName, c.PodNamespace, c.PodUID = env["K8S_POD_NAME"], env["K8S_POD_NAMESPACE"], env["K8S_POD_UID"]
	if needPod && (c.PodName == "" || c.PodNamespace == "") {
		return nil, configErr("CNI_ARGS must carry K8S_POD_NAME and K8S_POD_NAMESPACE")
	}
	// Static addresses by priority: runtimeConfig.ips > args.cni.ips > CNI_ARGS IP=.
	static := nc.RuntimeConfig.IPs
	if len(static) == 0 {
		static = args.IPs
	}
	if len(static) == 0 && env["IP"] != "" {
		static = strings.Split(env["IP"], ",")
	}
	for _, s := range static {
		a, err := parseIP(strings.TrimSpace(s))
		if err != nil {
			return nil, configErr("requested IP %q is not an IP address", s)
		}
		c.RequestedIPs = append(c.RequestedIPs, a)
	}
	return c, nil
}

// checkDevice refuses a device field that is not a name of what it can hold
// (the daemon, which resolves it, refuses it too): deviceID is what the call
// sends, from the top level or the deviceID capability. A DEL is not refused:
// the daemon then releases the interface wherever it holds addresses.
func checkDevice(nc *netConf, deviceID string) error {
	id := devicename.DeviceID
	if nc.DeviceID == "" {
		id = devicename.RuntimeDeviceID
	}
	for _, f := range []struct {
		field devicename.Field
		value string
	}{{id, deviceID}, {devicename.PCIBusID, nc.PCIBusID}, {devicename.Master, nc.Master}, {devicename.Device, nc.Device}} {
		if f.value == "" {
			continue
		}
		if err := f.field.Check(f.value); err != nil {
			return configErr("ipam.rail \"auto\" finds the rail by the attachment's device: %v", err)
		}
	}
	return nil
}

// checkRail refuses a rail name that no pool label could carry.
func checkRail(rail string) error {
	if rail == "auto" {
		return nil
	}
	if !isLabelValue(rail) {
		return configErr("ipam.rail %q: want \"auto\" or a rail name, which pools carry as the label value "+
			"nic.hwipam.io/rail=<name> (at most 63 characters: letters, digits, '-', '_' and '.', starting and ending "+
			"with a letter or digit)", rail)
	}
	return nil
}

// isLabelValue says whether s is a valid Kubernetes label value that is not empty
// (written out: the plugin does not link the Kubernetes libraries).
func isLabelValue(s string) bool {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if s == "" || len(s) > 63 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func fill(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

func parseIP(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Addr(), err
	}
	return netip.ParseAddr(s)
}

// parseEnvArgs splits CNI_ARGS ("K=V;K2=V2").
func parseEnvArgs(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, configErr("CNI_ARGS entry %q is not KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}
