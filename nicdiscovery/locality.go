package nicdiscovery

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// VendorNVIDIAGPU is the PCI vendor ID of NVIDIA GPUs (and of NVIDIA's other
// non-networking devices, such as NVSwitches).
const VendorNVIDIAGPU = 0x10de

// How a GPU is near a NIC function (NearGPU.Shares).
const (
	// GPUSharesSwitch: the nearest common ancestor of the two in the PCIe
	// hierarchy is a PCI bridge, in practice a PCIe switch, so traffic between
	// them (GPUDirect RDMA) need not cross the root complex; nvidia-smi topo
	// calls this PIX or PXB.
	GPUSharesSwitch = "switch"
	// GPUSharesRoot: they share only the root complex (nvidia-smi topo: PHB).
	GPUSharesRoot = "root"
)

// GPU is an NVIDIA GPU: a vendor 0x10de PCI function of class VGA (0x0300) or 3D
// controller (0x0302). SR-IOV VFs of a GPU (vGPU) are left out.
type GPU struct {
	// Index is the GPU's position, from 0, among the node's GPUs sorted by PCI
	// address: the order nvidia-smi numbers them in and CUDA uses with
	// CUDA_DEVICE_ORDER=PCI_BUS_ID. Every GPU counts, whatever its driver: a GPU
	// bound to vfio-pci (passed through to a VM) has an index here, but nvidia-smi
	// on the host skips it and numbers the ones after it one lower.
	Index      int    `json:"index"`
	PCIAddress string `json:"pciAddress"`
	// DeviceID is four lower-case hex digits, as in lspci -n.
	DeviceID string `json:"deviceID"`
	Model    string `json:"model"`
	// Driver is the bound driver (nvidia, vfio-pci, nouveau), "" when none is.
	Driver string `json:"driver"`
	// NUMANode is -1 when the platform does not say.
	NUMANode int `json:"numaNode"`
	// PCIeRoot is the root complex the GPU is under, as NIC.PCIeRoot.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// PCIeSwitch is the PCIe switch the GPU is behind, as NIC.PCIeSwitch.
	PCIeSwitch string `json:"pcieSwitch,omitempty"`
}

// NearGPU is a GPU that shares a PCIe switch or the root complex with a NIC
// function.
type NearGPU struct {
	// Index is GPU.Index.
	Index      int    `json:"index"`
	PCIAddress string `json:"pciAddress"`
	// Shares is GPUSharesSwitch or GPUSharesRoot.
	Shares string `json:"shares"`
}

// gpuModels names the data-centre GPUs the tests use, so that their names do not
// depend on a pci.ids file; other IDs are named from pci.ids when there is one.
var gpuModels = map[uint16]string{
	0x2322: "H800 PCIe",
	0x2330: "H100 SXM5 80GB",
	0x2331: "H100 PCIe",
	0x2901: "B200",
}

// isGPUClass tells the display controller classes a GPU reports: VGA compatible
// (0x0300, a GPU with display outputs) or 3D controller (0x0302, the data-centre
// parts).
func isGPUClass(classID uint32) bool {
	return classID>>8 == 0x0300 || classID>>8 == 0x0302
}

// rootComplexName matches a PCI root complex (host bridge) directory under
// sys/devices: pci<domain>:<bus>, "pci0000:15" (Hyper-V and VMD use longer
// domains).
var rootComplexName = regexp.MustCompile(`^pci[0-9a-f]{4,}:[0-9a-f]{2}$`)

// pciAddressName matches a PCI function's directory name: 0000:18:00.0.
var pciAddressName = regexp.MustCompile(`^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// pciPlace is where a function sits in the PCIe hierarchy.
type pciPlace struct {
	// root is the root complex, "pci0000:15"; "" when the path does not show one.
	root string
	// chain is the functions from the root port down to the function itself.
	chain []string
}

// placeOf resolves the function's /sys/bus/pci/devices link to its directory
// under sys/devices and reads its place from the path:
// .../pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0. The first
// root complex on the path is taken: a VMD domain's (pci10000:e0) sits below a
// host bridge's.
func placeOf(root, addr string) pciPlace {
	dir, err := filepath.EvalSymlinks(filepath.Join(root, "sys", "bus", "pci", "devices", addr))
	if err != nil {
		return pciPlace{}
	}
	var p pciPlace
	for _, c := range strings.Split(filepath.ToSlash(dir), "/") {
		switch {
		case p.root == "" && rootComplexName.MatchString(c):
			p.root = c
		case p.root != "" && pciAddressName.MatchString(c):
			p.chain = append(p.chain, c)
		}
	}
	if p.root == "" || len(p.chain) == 0 || p.chain[len(p.chain)-1] != addr {
		return pciPlace{}
	}
	return p
}

// bridge is the root port the function hangs from (see NIC.PCIeSwitch): what
// functions behind one PCIe switch share; "" for one integrated in the root
// complex.
func (a pciPlace) bridge() string {
	if len(a.chain) < 2 {
		return ""
	}
	return a.chain[0]
}

// shares says what a and b share in the PCIe hierarchy: GPUSharesSwitch when a
// bridge is above both, GPUSharesRoot when only the root complex is, else "".
func (a pciPlace) shares(b pciPlace) string {
	if a.root == "" || a.root != b.root {
		return ""
	}
	if len(a.chain) > 1 && len(b.chain) > 1 && a.chain[0] == b.chain[0] {
		return GPUSharesSwitch
	}
	return GPUSharesRoot
}

// addLocality fills inv.GPUs, and each NIC function's PCIeRoot and GPUs. A VF's
// directory sits beside its PF's, behind the same bridge, so it gets its PF's
// locality.
func addLocality(root string, funcs []pciFunction, inv *Inventory, names func() *pciNames) {
	var places []pciPlace
	for _, f := range funcs {
		if f.vendorID != VendorNVIDIAGPU || !isGPUClass(f.classID) {
			continue
		}
		dir := filepath.Join(root, "sys", "bus", "pci", "devices", f.address)
		if _, err := os.Lstat(filepath.Join(dir, "physfn")); err == nil {
			continue
		}
		g := GPU{PCIAddress: f.address, DeviceID: fmt.Sprintf("%04x", f.deviceID), Driver: readDriver(dir),
			NUMANode: readInt(filepath.Join(dir, "numa_node"), -1)}
		if m, ok := gpuModels[f.deviceID]; ok {
			g.Model = m
		} else {
			g.Model = names().lookup(f.vendorID, f.deviceID)
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	slices.SortFunc(inv.GPUs, func(a, b GPU) int { return cmp.Compare(a.PCIAddress, b.PCIAddress) })
	for i := range inv.GPUs {
		inv.GPUs[i].Index = i
		p := placeOf(root, inv.GPUs[i].PCIAddress)
		inv.GPUs[i].PCIeRoot, inv.GPUs[i].PCIeSwitch = p.root, p.bridge()
		places = append(places, p)
	}
	for i := range inv.NICs {
		n := &inv.NICs[i]
		p := placeOf(root, n.PCIAddress)
		n.PCIeRoot, n.PCIeSwitch = p.root, p.bridge()
		for j, g := range inv.GPUs {
			if s := p.shares(places[j]); s != "" {
				n.GPUs = append(n.GPUs, NearGPU{Index: g.Index, PCIAddress: g.PCIAddress, Shares: s})
			}
		}
		// Those behind the same switch first.
		slices.SortStableFunc(n.GPUs, func(a, b NearGPU) int {
			return cmp.Compare(shareRank(a.Shares), shareRank(b.Shares))
		})
	}
}

func shareRank(s string) int {
	if s == GPUSharesSwitch {
		return 0
	}
	return 1
}

// SwitchGPUs are the indexes of the GPUs behind the same PCIe switch as n.
func (n NIC) SwitchGPUs() []int {
	var out []int
	for _, g := range n.GPUs {
		if g.Shares == GPUSharesSwitch {
			out = append(out, g.Index)
		}
	}
	return out
}
