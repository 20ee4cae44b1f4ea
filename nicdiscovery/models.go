package nicdiscovery

import (
	"fmt"
	"slices"
)

// VendorNVIDIA is the PCI vendor ID of NVIDIA networking (formerly Mellanox).
const VendorNVIDIA = 0x15b3

// model is one entry of the built-in device table.
type model struct {
	name string
	vf   bool
}

// models names the NIC functions by PCI device ID, so that names do not depend on a
// pci.ids file being present. IDs are those of the mlx4_core and mlx5_core drivers'
// device tables.
var models = map[uint16]model{
	0x1003: {name: "ConnectX-3"},
	0x1004: {name: "ConnectX-3 VF", vf: true},
	0x1007: {name: "ConnectX-3 Pro"},
	0x1011: {name: "Connect-IB"},
	0x1012: {name: "Connect-IB VF", vf: true},
	0x1013: {name: "ConnectX-4"},
	0x1014: {name: "ConnectX-4 VF", vf: true},
	0x1015: {name: "ConnectX-4 Lx"},
	0x1016: {name: "ConnectX-4 Lx VF", vf: true},
	0x1017: {name: "ConnectX-5"},
	0x1018: {name: "ConnectX-5 VF", vf: true},
	0x1019: {name: "ConnectX-5 Ex"},
	0x101a: {name: "ConnectX-5 Ex VF", vf: true},
	0x101b: {name: "ConnectX-6"},
	0x101c: {name: "ConnectX-6 VF", vf: true},
	0x101d: {name: "ConnectX-6 Dx"},
	// 0x101e is the VF of every mlx5 generation from ConnectX-6 Dx on; Scan names
	// it after its PF when the PF is known.
	0x101e: {name: "ConnectX VF", vf: true},
	0x101f: {name: "ConnectX-6 Lx"},
	0x1021: {name: "ConnectX-7"},
	0x1023: {name: "ConnectX-8"},
	0x1025: {name: "ConnectX-9"},
	0x1027: {name: "ConnectX-10"},
	0xa2d2: {name: "BlueField"},
	0xa2d3: {name: "BlueField VF", vf: true},
	0xa2d6: {name: "BlueField-2"},
	0xa2dc: {name: "BlueField-3"},
	0xa2df: {name: "BlueField-4"},
}

// notNIC reports why a vendor 0x15b3 function is not a NIC, or "".
// PCI bridges (the switches inside BlueField and multi-host ConnectX cards), the
// BlueField SoC management and DMA functions, flash-recovery functions (a card
// whose firmware is not running) and Spectrum switch ASICs are not NICs.
func notNIC(deviceID uint16, classID uint32) string {
	switch {
	case classID>>16 == 0x06:
		return "PCI bridge"
	case deviceID >= 0x1974 && deviceID <= 0x197f:
		return "PCIe switch bridge"
	case deviceID >= 0x0209 && deviceID <= 0x021f:
		return "flash recovery (firmware not running)"
	case deviceID >= 0xc2d1 && deviceID <= 0xc2df:
		return "BlueField SoC management function"
	case deviceID == 0xcb84 || deviceID >= 0xcf6c && deviceID <= 0xcf8f:
		return "Spectrum switch ASIC"
	}
	return ""
}

// knownModel returns the built-in name of a device ID.
func knownModel(deviceID uint16) (model, bool) {
	m, ok := models[deviceID]
	return m, ok
}

// pciIDsFile renders the built-in table in pci.ids format. ghw needs a PCI ID
// database to enumerate devices at all; this one is used when the host has none.
func pciIDsFile() []byte {
	b := []byte("# hwipam built-in NVIDIA NIC table\n15b3  Mellanox Technologies\n")
	ids := make([]uint16, 0, len(models))
	for id := range models {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		b = fmt.Appendf(b, "\t%04x  %s\n", id, models[id].name)
	}
	return b
}
