package nicdiscovery

// Function kinds.
const (
	FunctionPF = "PF"
	FunctionVF = "VF"
)

// Link layers.
const (
	LinkLayerEthernet   = "Ethernet"
	LinkLayerInfiniBand = "InfiniBand"
)

// Inventory is what a scan found.
type Inventory struct {
	// Root is the directory holding sys/ that was scanned.
	Root string `json:"root"`
	// NICs are the NVIDIA NIC functions, PFs and VFs, by PCI address.
	NICs []NIC `json:"nics"`
	// GPUs are the NVIDIA GPUs, by PCI address (and so by index).
	GPUs []GPU `json:"gpus,omitempty"`
	// NetdevsHidden is true when the scan sees no netdev of the node's NICs, nor
	// any other physical netdev: it runs in a network namespace other than the
	// host's (a pod without hostNetwork), whose sysfs lists only that namespace's
	// netdevs. Ethernet (RoCE) ports are then named from their RDMA GID table
	// (Port.NetdevFrom); InfiniBand ports, whose IPoIB netdev no GID names, have
	// no netdev.
	NetdevsHidden bool `json:"netdevsHidden,omitempty"`
}

// NetdevFromRDMAGID is Port.NetdevFrom for a netdev named by the RDMA port's GID
// table (gid_attrs/ndevs) because the function's net/ directory does not show it.
const NetdevFromRDMAGID = "rdma-gid"

// NIC is one NVIDIA NIC PCI function.
type NIC struct {
	PCIAddress string `json:"pciAddress"`
	// VendorID and DeviceID are four lower-case hex digits, as in lspci -n.
	VendorID string `json:"vendorID"`
	DeviceID string `json:"deviceID"`
	Model    string `json:"model"`
	// Function is PF or VF; PhysFn is the PF of a VF.
	Function string `json:"function"`
	PhysFn   string `json:"physfn,omitempty"`
	// Driver is the bound driver, "" when none is bound.
	Driver string `json:"driver"`
	// NUMANode is -1 when the platform does not say.
	NUMANode int `json:"numaNode"`
	// PCIeRoot is the PCI root complex (host bridge) the function is under, as
	// its sysfs directory's path names it: "pci0000:15" for
	// /sys/devices/pci0000:15/0000:15:01.0/.../0000:18:00.0 (the value of DRA's
	// resource.kubernetes.io/pcieRoot). "" when the path shows none.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// PCIeSwitch names the PCIe switch the function is behind by the root port
	// it hangs from ("0000:15:01.0"): functions with the same PCIeSwitch share a
	// switch, or the root port's link (GPUSharesSwitch in GPUs). "" for a function
	// integrated in the root complex, or when the path shows no root complex.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
	// GPUs are the NVIDIA GPUs that share a PCIe switch (first) or only the root
	// complex with the function, by index within each.
	GPUs []NearGPU `json:"gpus,omitempty"`
	// Netdevs are the function's own network interfaces, without switchdev
	// representors (those are listed in Representors).
	Netdevs []string `json:"netdevs"`
	// LinkLayer, SpeedMbps, PortState and PortGUID describe the first port; Ports
	// has every port.
	LinkLayer string `json:"linkLayer,omitempty"`
	// SpeedMbps is 0 when unknown: no link (a down Ethernet port, an RDMA port
	// that is not ACTIVE), no driver.
	SpeedMbps     int      `json:"speedMbps"`
	RDMADevices   []string `json:"rdmaDevices"`
	SRIOVTotalVFs int      `json:"sriovTotalVFs"`
	SRIOVNumVFs   int      `json:"sriovNumVFs"`
	PortState     string   `json:"portState,omitempty"`
	PortGUID      string   `json:"portGUID,omitempty"`
	// EswitchMode is legacy or switchdev where devlink (or the driver's compat
	// sysfs file) answers.
	EswitchMode  string   `json:"eswitchMode,omitempty"`
	Representors []string `json:"representors,omitempty"`
	Ports        []Port   `json:"ports,omitempty"`
	// VFStates are the PF's VFs as its netdev reports them over netlink (live
	// scans only): what the PF enforces on each VF.
	VFStates []VFState `json:"vfStates,omitempty"`
}

// VFState is one VF as its PF's netlink link reports it.
type VFState struct {
	Index int    `json:"index"`
	MAC   string `json:"mac,omitempty"`
	VLAN  int    `json:"vlan,omitempty"`
	QoS   int    `json:"qos,omitempty"`
	// SpoofCheck and Trust are the PF's settings for the VF.
	SpoofCheck bool `json:"spoofCheck"`
	Trust      bool `json:"trust"`
	// LinkState is auto (follows the PF's uplink), enable or disable.
	LinkState string `json:"linkState"`
}

// Port is one network port of a function: a netdev, its RDMA port, or both.
type Port struct {
	// Netdev is "" for an RDMA port without a network interface (an IB port
	// without IPoIB).
	Netdev string `json:"netdev,omitempty"`
	// Number is the port number on the function, from 1.
	Number    int    `json:"number"`
	LinkLayer string `json:"linkLayer,omitempty"`
	SpeedMbps int    `json:"speedMbps"`
	// NetdevType is the ARPHRD type: 1 Ethernet, 32 InfiniBand (IPoIB).
	NetdevType int    `json:"netdevType,omitempty"`
	RDMADevice string `json:"rdmaDevice,omitempty"`
	RDMAPort   int    `json:"rdmaPort,omitempty"`
	PortState  string `json:"portState,omitempty"`
	PortGUID   string `json:"portGUID,omitempty"`
	// NetdevFrom says where Netdev comes from when not from the function's net/
	// directory: NetdevFromRDMAGID.
	NetdevFrom string `json:"netdevFrom,omitempty"`
	// Master is the bond or bridge the netdev is enslaved to (RoCE LAG: bond0).
	Master    string `json:"master,omitempty"`
	OperState string `json:"operState,omitempty"`
	// AdminUp and Carrier come from netlink (live scans only): the link is set up
	// (IFF_UP), and it has a carrier (IFF_LOWER_UP).
	AdminUp   *bool    `json:"adminUp,omitempty"`
	Carrier   *bool    `json:"carrier,omitempty"`
	MTU       int      `json:"mtu,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
}
