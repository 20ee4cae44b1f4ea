package ipamnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/hwipam/hwipam/pkg/daemon"
)

// Options are the ipam-node settings; AddFlags binds them to nv-ipam's flag names
// plus hwipam's own.
type Options struct {
	NodeName           string
	Kubeconfig         string
	PoolsNamespace     string
	BindAddress        string
	FastEndpoint       bool
	StoreFile          string
	MetricsBindAddress string
	// MetricsSecure serves the metrics over HTTPS (a self-signed certificate)
	// to clients whose token may get the non-resource URL /metrics.
	MetricsSecure          bool
	HealthProbeBindAddress string
	CleanupInterval        time.Duration
	CleanupMisses          int
	AnnotationInterval     time.Duration
	CNI                    CNIOptions

	// NIC discovery and labels.
	NICLabels            string
	NICRescanInterval    time.Duration
	RailConfig           string
	SysfsRoot            string
	NodeFeatureNamespace string

	// The DRA driver nic.hwipam.io (docs/dra.md): off by default.
	DRA           bool
	DRAKubeletDir string
	DRANRISocket  string
	DRAHostNetNS  string
	// DRACDIDir is where the runtime reads CDI specs: the claims' RDMA
	// character devices are given through it; "" gives them through NRI to
	// every container of the pod.
	DRACDIDir string
	// DRAExcludeDevices are NIC ports (netdev names or PCI addresses) the DRA
	// driver never publishes nor prepares.
	DRAExcludeDevices []string

	// RestConfig, when set, is used instead of Kubeconfig (tests).
	RestConfig *rest.Config
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		NodeName:               os.Getenv("NODE_NAME"),
		PoolsNamespace:         "kube-system",
		BindAddress:            "unix:///var/lib/cni/nv-ipam/daemon.sock",
		FastEndpoint:           true,
		StoreFile:              "/var/lib/cni/nv-ipam/store",
		MetricsBindAddress:     ":8080",
		HealthProbeBindAddress: ":8081",
		CleanupInterval:        time.Minute,
		CleanupMisses:          3,
		AnnotationInterval:     10 * time.Second,
		NICLabels:              NICLabelsNode,
		NICRescanInterval:      time.Minute,
		SysfsRoot:              "/",
		NodeFeatureNamespace:   os.Getenv("POD_NAMESPACE"),
		DRAKubeletDir:          "/var/lib/kubelet",
		DRANRISocket:           "/var/run/nri/nri.sock",
		DRACDIDir:              "/var/run/cdi",
		CNI: CNIOptions{
			BinDir: "/opt/cni/bin", ConfDir: "/etc/cni/net.d/nv-ipam.d",
			DaemonSocket: "unix:///var/lib/cni/nv-ipam/daemon.sock", DaemonCallTimeout: 5,
			LogFile: "/var/log/nv-ipam-cni.log", LogLevel: "info", BinFile: "/nv-ipam",
		},
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Name of this node (default $NODE_NAME).")
	daemon.AddAPIFlags(fs, &o.Kubeconfig, &o.PoolsNamespace)
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress,
		"Where the gRPC API listens: unix:///path (socket created with mode 0600) or tcp://host:port.")
	fs.BoolVar(&o.FastEndpoint, "fast-endpoint", o.FastEndpoint,
		"Also serve the CNI plugin's compact endpoint, a socket beside a unix --bind-address (daemon.sock: daemon-fast.sock, mode 0600); "+
			"the plugin uses the gRPC socket when it is absent.")
	fs.StringVar(&o.StoreFile, "store-file", o.StoreFile, "The allocation store; an nv-ipam JSON store found here is imported.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "Serve the metrics over HTTPS (a self-signed certificate) "+
		"only to clients whose bearer token the API server authenticates and lets get the non-resource URL /metrics "+
		"(TokenReview and SubjectAccessReview: deploy/monitoring grants them).")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress,
		"Address of /healthz and /readyz (ready once the store is open and the socket serves); 0 disables them.")
	fs.DurationVar(&o.CleanupInterval, "cleanup-interval", o.CleanupInterval,
		"How often allocations are checked against their pods; 0 disables the stale-allocation cleaner.")
	fs.IntVar(&o.CleanupMisses, "cleanup-misses", o.CleanupMisses,
		"Consecutive checks that must find an allocation's pod gone (or with another UID) before it is released.")
	fs.DurationVar(&o.AnnotationInterval, "pools-in-use-interval", o.AnnotationInterval,
		"How often the node's ipam.hwipam.io/pools-in-use annotation is brought up to date; 0 disables it.")
	fs.StringVar(&o.NICLabels, "nic-labels", o.NICLabels,
		"Where the nic.hwipam.io labels of this node's NVIDIA NICs go: node (the Node's labels, by server-side apply), "+
			"nodefeature (an NFD NodeFeature object) or off.")
	fs.DurationVar(&o.NICRescanInterval, "nic-rescan-interval", o.NICRescanInterval,
		"How often the NICs are rescanned (also on SIGHUP and when a netdev appears or goes away).")
	fs.StringVar(&o.RailConfig, "rail-config", o.RailConfig,
		"Rail map, YAML: rail name to a list of netdev names and/or PCI addresses; adds nic.hwipam.io/rail.<name>=<netdev>.")
	fs.StringVar(&o.SysfsRoot, "sysfs-root", o.SysfsRoot, "Directory that contains the sys/ tree the NICs are read from.")
	fs.StringVar(&o.NodeFeatureNamespace, "nodefeature-namespace", o.NodeFeatureNamespace,
		"Namespace of the NodeFeature object with --nic-labels=nodefeature (default $POD_NAMESPACE).")
	fs.BoolVar(&o.DRA, "dra", o.DRA, "Run the DRA driver nic.hwipam.io: publish the NIC ports as ResourceSlices, give "+
		"claims their rail's addresses, attach the netdevs to pods (docs/dra.md). One DRA NIC driver per node.")
	fs.StringVar(&o.DRAKubeletDir, "dra-kubelet-dir", o.DRAKubeletDir,
		"With --dra: the kubelet's root directory (its plugins_registry and plugins/nic.hwipam.io directories).")
	fs.StringSliceVar(&o.DRAExcludeDevices, "dra-exclude-devices", o.DRAExcludeDevices,
		"NIC ports the DRA driver never hands to claims, comma-separated netdev names or PCI addresses (besides the ports "+
			"that carry the host's addresses or routes, which it never hands out either).")
	fs.StringVar(&o.DRANRISocket, "dra-nri-socket", o.DRANRISocket,
		"With --dra: the container runtime's NRI socket, through which netdevs move into pod sandboxes; \"\" disables the attach.")
	fs.StringVar(&o.DRACDIDir, "dra-cdi-dir", o.DRACDIDir,
		"With --dra: the directory the container runtime reads CDI specs from (containerd's and CRI-O's default): each "+
			"prepared claim's spec there gives its ports' RDMA character devices to the containers that reference the "+
			"claim; \"\" gives them through NRI to every container of the pod (a runtime without CDI).")
	fs.StringVar(&o.DRAHostNetNS, "dra-host-netns", o.DRAHostNetNS,
		"With --dra: the path of the host's network namespace, where the ports are while no pod holds them, for a daemon "+
			"that does not run in it (e.g. /proc/1/ns/net with hostPID); \"\" is the daemon's own (hostNetwork).")
	c := &o.CNI
	fs.StringVar(&c.BinDir, "cni-bin-dir", c.BinDir, "CNI binary directory the nv-ipam plugin is copied into.")
	fs.StringVar(&c.ConfDir, "cni-conf-dir", c.ConfDir, "Directory nv-ipam.conf is written into (the plugin's confDir).")
	fs.StringVar(&c.DaemonSocket, "cni-daemon-socket", c.DaemonSocket, "nv-ipam.conf: the daemon socket the plugin calls.")
	fs.IntVar(&c.DaemonCallTimeout, "cni-daemon-call-timeout", c.DaemonCallTimeout, "nv-ipam.conf: seconds the plugin waits for the daemon.")
	fs.StringVar(&c.LogFile, "cni-log-file", c.LogFile, "nv-ipam.conf: the plugin's log file.")
	fs.StringVar(&c.LogLevel, "cni-log-level", c.LogLevel, "nv-ipam.conf: the plugin's log level.")
	fs.StringVar(&c.BinFile, "cni-nv-ipam-bin-file", c.BinFile, "The nv-ipam plugin binary to install.")
	fs.BoolVar(&c.SkipBinaryCopy, "cni-skip-nv-ipam-binary-copy", c.SkipBinaryCopy, "Do not copy the plugin binary.")
	fs.BoolVar(&c.SkipConfig, "cni-skip-nv-ipam-config-creation", c.SkipConfig, "Do not write nv-ipam.conf.")
	fs.BoolVar(&c.ForcePoolName, "cni-force-pool-name", c.ForcePoolName,
		"nv-ipam.conf: require poolName in network configs instead of defaulting to the network's name.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name is required (or set $NODE_NAME)"))
	}
	if o.PoolsNamespace == "" {
		errs = append(errs, errors.New("--ippools-namespace must not be empty"))
	}
	if o.StoreFile == "" {
		errs = append(errs, errors.New("--store-file must not be empty"))
	}
	if _, _, err := parseBindAddress(o.BindAddress); err != nil {
		errs = append(errs, err)
	}
	if o.CNI.DaemonCallTimeout < 1 {
		errs = append(errs, fmt.Errorf("--cni-daemon-call-timeout %d must be at least 1", o.CNI.DaemonCallTimeout))
	}
	if o.AnnotationInterval < 0 {
		errs = append(errs, fmt.Errorf("--pools-in-use-interval %s must not be negative", o.AnnotationInterval))
	}
	if o.CleanupInterval < 0 || o.CleanupMisses < 1 {
		errs = append(errs, fmt.Errorf("--cleanup-interval %s must not be negative and --cleanup-misses %d must be at least 1",
			o.CleanupInterval, o.CleanupMisses))
	}
	switch o.NICLabels {
	case NICLabelsNode, NICLabelsOff:
	case NICLabelsNodeFeature:
		if o.NodeFeatureNamespace == "" {
			errs = append(errs, errors.New("--nic-labels=nodefeature needs --nodefeature-namespace (or $POD_NAMESPACE)"))
		}
	default:
		errs = append(errs, fmt.Errorf("--nic-labels %q: want node, nodefeature or off", o.NICLabels))
	}
	if o.NICLabels != NICLabelsOff && o.NICRescanInterval <= 0 {
		errs = append(errs, fmt.Errorf("--nic-rescan-interval %s must be positive", o.NICRescanInterval))
	}
	if o.DRA && !filepath.IsAbs(o.DRAKubeletDir) {
		errs = append(errs, fmt.Errorf("--dra-kubelet-dir %q must be an absolute path", o.DRAKubeletDir))
	}
	if o.DRACDIDir != "" && !filepath.IsAbs(o.DRACDIDir) {
		errs = append(errs, fmt.Errorf("--dra-cdi-dir %q must be an absolute path (the runtime's CDI spec directory, "+
			"e.g. /var/run/cdi), or empty to give RDMA devices through NRI", o.DRACDIDir))
	}
	if o.DRAHostNetNS != "" && !filepath.IsAbs(o.DRAHostNetNS) {
		errs = append(errs, fmt.Errorf("--dra-host-netns %q must be an absolute path (e.g. /proc/1/ns/net), or empty for the daemon's own", o.DRAHostNetNS))
	}
	return errors.Join(errs...)
}

// parseBindAddress splits unix:///path or tcp://host:port into network and address.
func parseBindAddress(s string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		p := strings.TrimPrefix(s, "unix://")
		if !strings.HasPrefix(p, "/") {
			return "", "", fmt.Errorf("--bind-address %q: a unix socket needs an absolute path (unix:///run/x.sock)", s)
		}
		return "unix", p, nil
	case strings.HasPrefix(s, "tcp://"):
		return "tcp", strings.TrimPrefix(s, "tcp://"), nil
	}
	return "", "", fmt.Errorf("--bind-address %q: want unix:///path or tcp://host:port", s)
}
