package fakesysfs

import (
	"fmt"
)

// PCI IDs the layouts use.
const (
	VendorNVIDIA    = 0x15b3
	VendorNVIDIAGPU = 0x10de
	VendorIntel     = 0x8086
	VendorBroadcom  = 0x1000
	DeviceCX3       = 0x1003
	DeviceCX6Dx     = 0x101d
	DeviceCXVF      = 0x101e
	DeviceCX7       = 0x1021
	DeviceBF3       = 0xa2dc
	DeviceBF3Bridge = 0x197b
	DeviceBF3Mgmt   = 0xc2d5
	DeviceCX7Flash  = 0x0218
	// DeviceH100SXM5 is GH100 [H100 SXM5 80GB] (pci.ids).
	DeviceH100SXM5 = 0x2330
	// DevicePEX890xx is Broadcom's PEX890xx PCIe Gen 5 switch; its upstream and
	// downstream ports report the same ID.
	DevicePEX890xx = 0xc030
	// DeviceIntelRootPort is a Sapphire Rapids PCIe root port.
	DeviceIntelRootPort = 0x352c
	ClassEthernet       = 0x020000
	ClassIB             = 0x020700
	ClassOtherNet       = 0x028000
	Class3D             = 0x030200
	ClassBridge         = 0x060400
	ClassDMA            = 0x080100
)

// DGXH100Rails are the netdevs of the DGXH100 layout's compute rails, in PCI order.
var DGXH100Rails = []string{"ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"}

// DGXH100GPUs are the PCI addresses of the DGXH100 layout's H100 GPUs, in PCI
// order: GPU i shares a PCIe switch with rail i.
var DGXH100GPUs = []string{"0000:19:00.0", "0000:41:00.0", "0000:50:00.0", "0000:5f:00.0", "0000:9b:00.0", "0000:c1:00.0",
	"0000:cf:00.0", "0000:dd:00.0"}

// DGXH100 lays out a DGX-H100-like node: eight single-port ConnectX-7 InfiniBand
// PFs at 400 Gb/s (NDR), four on each NUMA node, each sharing a PCIe switch with
// one H100 SXM5 GPU; a dual-port BlueField-3 in Ethernet mode (100 Gb/s and a
// port without link) with its internal PCIe switch and SoC management function;
// a ConnectX-7 stuck in flash recovery and an Intel management port. None of the
// bridges, the SoC function, the flash-recovery function or the Intel port is a
// NIC port of ours.
//
// The PCIe hierarchy, as sys/devices holds it (RC = root complex, RP = root
// port, US/DS = a PEX890xx switch's upstream/downstream ports):
//
//	RC pci0000:15  NUMA 0  RP 15:01.0 ─ US 16:00.0 ┬ DS 17:00.0 ─ 18:00.0 ConnectX-7 ibp24s0   (rail 0)
//	                                               └ DS 17:01.0 ─ 19:00.0 H100 (GPU 0)
//	                       RP 15:02.0 ─ US 3e:00.0 ┬ DS 3f:00.0 ─ 40:00.0 ConnectX-7 ibp64s0   (rail 1)
//	                                               └ DS 3f:01.0 ─ 41:00.0 H100 (GPU 1)
//	RC pci0000:4c  NUMA 0  rails 2 (4f:00.0) and 3 (5e:00.0), GPUs 2 (50:00.0) and 3 (5f:00.0), the same way
//	RC pci0000:97  NUMA 1  rails 4 (9a:00.0) and 5 (c0:00.0), GPUs 4 (9b:00.0) and 5 (c1:00.0);
//	                       RP 97:03.0 ─ b0:00.0 ConnectX-7 in flash recovery
//	RC pci0000:cb  NUMA 1  rails 6 (ce:00.0) and 7 (dc:00.0), GPUs 6 (cf:00.0) and 7 (dd:00.0)
//	RC pci0000:de  NUMA 1  RP de:01.0 ─ BlueField-3 switch US df:00.0 ─ DS e0:00.0 ─ e1:00.0, e1:00.1 (ports), e1:00.2 (SoC)
//	RC pci0000:00  NUMA 0  RP 00:1c.0 ─ 06:00.0 Intel I210 eno1
//
// So each rail's GPU shares its switch, and the other rail of the same root
// complex's GPU only the root complex. A real DGX H100 has the same NIC bus
// numbers and a switch per GPU/NIC pair (nvidia-smi topo: PIX), but its GPUs sit
// three buses behind their NIC (1b:00.0 for 18:00.0) and each switch has a root
// complex of its own; here the GPUs sit one bus behind, and two switches share
// a root complex so that a root-only pairing is there to find.
func DGXH100(root string) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	buses := []int{0x18, 0x40, 0x4f, 0x5e, 0x9a, 0xc0, 0xce, 0xdc}
	roots := []int{0x15, 0x4c, 0x97, 0xcb}
	for i, bus := range buses {
		numa := i / 4
		rootPort := fmt.Sprintf("0000:%02x:%02x.0", roots[i/2], 1+i%2)
		up, down := fmt.Sprintf("0000:%02x:00.0", bus-2), fmt.Sprintf("0000:%02x:00.0", bus-1)
		gpuPort := fmt.Sprintf("0000:%02x:01.0", bus-1)
		for _, b := range [][2]string{{rootPort, ""}, {up, rootPort}, {down, up}, {gpuPort, up}} {
			vendor, device := uint16(VendorBroadcom), uint16(DevicePEX890xx)
			if b[1] == "" {
				vendor, device = VendorIntel, DeviceIntelRootPort
			}
			if err := t.AddBridge(b[0], b[1], vendor, device, numa); err != nil {
				return nil, err
			}
		}
		if err := t.Add(H100(DGXH100GPUs[i], gpuPort, numa)); err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("0000:%02x:00.0", bus)
		name := DGXH100Rails[i]
		guid := 0xa088c20300a1b200 + uint64(i)
		err := t.Add(Function{Address: addr, Parent: down, Vendor: VendorNVIDIA, Device: DeviceCX7, Class: ClassIB,
			Driver: "mlx5_core", NUMA: numa, TotalVFs: 16,
			Netdevs: []Netdev{{Name: name, Type: 32, Speed: 400000, OperState: "up", MTU: 4092, MAC: ipoibAddr(guid)}},
			RDMA: &RDMA{Name: fmt.Sprintf("mlx5_%d", i), NodeGUID: GUID(guid), Ports: []RDMAPort{{
				Num: 1, LinkLayer: "InfiniBand", Rate: "400 Gb/sec (4X NDR)", State: "4: ACTIVE",
				GID0: "fe80:0000:0000:0000:" + GUID(guid)}}},
		})
		if err != nil {
			return nil, err
		}
	}
	// A pod's IPoIB child interface (ipoib-cni) on the first rail, still on the host.
	if err := t.addNetdev(t.devDir("0000:18:00.0"), Netdev{Name: "ibp24s0.8001", Type: 32, Speed: 400000, OperState: "up",
		MTU: 4092, MAC: ipoibAddr(0xa088c20300a1b200), Parent: "ibp24s0"}); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		addr, parent   string
		vendor, device uint16
		numa           int
	}{
		{"0000:de:01.0", "", VendorIntel, DeviceIntelRootPort, 1},
		{"0000:df:00.0", "0000:de:01.0", VendorNVIDIA, DeviceBF3Bridge, 1},
		{"0000:e0:00.0", "0000:df:00.0", VendorNVIDIA, DeviceBF3Bridge, 1},
		{"0000:97:03.0", "", VendorIntel, DeviceIntelRootPort, 1},
		{"0000:00:1c.0", "", VendorIntel, DeviceIntelRootPort, 0},
	} {
		if err := t.AddBridge(b.addr, b.parent, b.vendor, b.device, b.numa); err != nil {
			return nil, err
		}
	}
	for port := range 2 {
		addr := fmt.Sprintf("0000:e1:00.%d", port)
		speed, state, rstate := 100000, "up", "4: ACTIVE"
		if port == 1 {
			speed, state, rstate = 0, "down", "1: DOWN"
		}
		err := t.Add(Function{Address: addr, Parent: "0000:e0:00.0", Vendor: VendorNVIDIA, Device: DeviceBF3, Class: ClassEthernet,
			Driver: "mlx5_core", NUMA: 1, TotalVFs: 16,
			Netdevs: []Netdev{{Name: fmt.Sprintf("enp225s0f%dnp%d", port, port), Type: 1, Speed: speed, OperState: state,
				MTU: 9000, MAC: fmt.Sprintf("b8:3f:d2:e1:00:%02x", port), PhysPortName: fmt.Sprintf("p%d", port),
				EswitchMode: "switchdev"}},
			RDMA: &RDMA{Name: fmt.Sprintf("mlx5_%d", 8+port), NodeGUID: GUID(0xb83fd20300e10000 + uint64(port)),
				Ports: []RDMAPort{{Num: 1, LinkLayer: "Ethernet", Rate: "100 Gb/sec (2X HDR)", State: rstate,
					GID0: "fe80:0000:0000:0000:ba3f:d2ff:fee1:000" + fmt.Sprint(port)}}},
		})
		if err != nil {
			return nil, err
		}
	}
	for _, f := range []Function{
		{Address: "0000:e1:00.2", Parent: "0000:e0:00.0", Vendor: VendorNVIDIA, Device: DeviceBF3Mgmt, Class: ClassDMA, NUMA: 1},
		{Address: "0000:b0:00.0", Parent: "0000:97:03.0", Vendor: VendorNVIDIA, Device: DeviceCX7Flash, Class: ClassIB, NUMA: 1},
		{Address: "0000:06:00.0", Parent: "0000:00:1c.0", Vendor: VendorIntel, Device: 0x1533, Class: ClassEthernet,
			Driver: "igb", NUMA: 0,
			Netdevs: []Netdev{{Name: "eno1", Type: 1, Speed: 1000, OperState: "up", MTU: 1500, MAC: "3c:ec:ef:00:00:01"}}},
	} {
		if err := t.Add(f); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// H100 is an H100 SXM5 GPU function behind parent, bound to the nvidia driver.
// It reports class 0x0302 (3D controller), as data-centre GPUs without a display
// output do.
func H100(addr, parent string, numa int) Function {
	return Function{Address: addr, Parent: parent, Vendor: VendorNVIDIAGPU, Device: DeviceH100SXM5, Class: Class3D,
		Driver: "nvidia", NUMA: numa}
}

// ipoibAddr is an IPoIB hardware address (QPN, flags and the port GID).
func ipoibAddr(guid uint64) string {
	s := "00:00:10:87:fe:80:00:00:00:00:00:00"
	for i := 7; i >= 0; i-- {
		s += fmt.Sprintf(":%02x", byte(guid>>(8*i)))
	}
	return s
}

// SRIOV lays out pfs ConnectX-6 Dx Ethernet PFs (100 Gb/s, NUMA -1: a platform
// without NUMA information) with vfs VFs each, in legacy SR-IOV mode: every VF has
// its own netdev and RDMA device.
func SRIOV(root string, pfs, vfs int) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	for p := range pfs {
		pf := fmt.Sprintf("0000:3b:00.%d", p)
		err := t.Add(Function{Address: pf, Vendor: VendorNVIDIA, Device: DeviceCX6Dx, Class: ClassEthernet, Driver: "mlx5_core",
			NUMA: -1, TotalVFs: 127, NumVFs: vfs,
			Netdevs: []Netdev{{Name: fmt.Sprintf("ens1f%dnp%d", p, p), Type: 1, Speed: 100000, OperState: "up", MTU: 1500,
				MAC: fmt.Sprintf("0c:42:a1:3b:00:%02x", p), PhysPortName: fmt.Sprintf("p%d", p), EswitchMode: "legacy"}},
			RDMA: &RDMA{Name: fmt.Sprintf("mlx5_%d", p), NodeGUID: GUID(0x0c42a103003b0000 + uint64(p)), Ports: []RDMAPort{{
				Num: 1, LinkLayer: "Ethernet", Rate: "100 Gb/sec (4X EDR)", State: "4: ACTIVE",
				GID0: "fe80:0000:0000:0000:0e42:a1ff:fe3b:00" + fmt.Sprintf("%02x", p)}}},
		})
		if err != nil {
			return nil, err
		}
		for v := range vfs {
			// VFs follow the PFs' functions: PF p's VF v at bus 0x3c+p, device v/8, function v%8.
			addr := fmt.Sprintf("0000:%02x:%02x.%d", 0x3c+p, v/8, v%8)
			err := t.AddVF(pf, v, Function{Address: addr, Vendor: VendorNVIDIA, Device: DeviceCXVF, Class: ClassEthernet,
				Driver: "mlx5_core", NUMA: -1,
				Netdevs: []Netdev{{Name: fmt.Sprintf("ens1f%dv%d", p, v), Type: 1, Speed: 100000, OperState: "up", MTU: 1500,
					MAC: fmt.Sprintf("02:00:%02x:00:%02x:%02x", p, v>>8, v&0xff)}},
				RDMA: &RDMA{Name: fmt.Sprintf("mlx5_%d", pfs+p*vfs+v), Ports: []RDMAPort{{Num: 1, LinkLayer: "Ethernet",
					Rate: "100 Gb/sec (4X EDR)", State: "4: ACTIVE"}}},
			})
			if err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// RoCELAG lays out a dual-port ConnectX-6 Dx whose ports are bonded (RoCE LAG):
// both netdevs are slaves of bond0, and the one RDMA device, mlx5_bond_0, hangs
// off the first PF; the second PF has none of its own.
func RoCELAG(root string) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	for p := range 2 {
		f := Function{Address: fmt.Sprintf("0000:86:00.%d", p), Vendor: VendorNVIDIA, Device: DeviceCX6Dx, Class: ClassEthernet,
			Driver: "mlx5_core", NUMA: 1, TotalVFs: 8,
			Netdevs: []Netdev{{Name: fmt.Sprintf("enp134s0f%dnp%d", p, p), Type: 1, Speed: 25000, OperState: "up", MTU: 9000,
				MAC: "0c:42:a1:86:00:00", PhysPortName: fmt.Sprintf("p%d", p), Master: "bond0"}}}
		if p == 0 {
			f.RDMA = &RDMA{Name: "mlx5_bond_0", NodeGUID: GUID(0x0c42a10300860000), Ports: []RDMAPort{{
				Num: 1, LinkLayer: "Ethernet", Rate: "50 Gb/sec (2X EDR)", State: "4: ACTIVE",
				GID0: "fe80:0000:0000:0000:0e42:a1ff:fe86:0000"}}}
		}
		if err := t.Add(f); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// VPI lays out a ConnectX-3 Pro VPI card (mlx4: both ports on one function)
// with port 1 in InfiniBand mode (ib0, FDR) and port 2 in Ethernet mode (40 Gb/s).
func VPI(root string) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	guid := uint64(0x0002c90300f9c0a0)
	err = t.Add(Function{Address: "0000:04:00.0", Vendor: VendorNVIDIA, Device: 0x1007, Class: ClassOtherNet,
		Driver: "mlx4_core", NUMA: 0,
		Netdevs: []Netdev{
			{Name: "ib0", Type: 32, OperState: "up", MTU: 2044, MAC: ipoibAddr(guid + 1)},
			{Name: "ens1d1", Type: 1, Speed: 40000, OperState: "up", MTU: 1500, MAC: "00:02:c9:f9:c0:a2", DevPort: 1, DevID: 1},
		},
		RDMA: &RDMA{Name: "mlx4_0", NodeGUID: GUID(guid), Ports: []RDMAPort{
			{Num: 1, LinkLayer: "InfiniBand", Rate: "56 Gb/sec (4X FDR)", State: "4: ACTIVE",
				GID0: "fe80:0000:0000:0000:" + GUID(guid+1)},
			{Num: 2, LinkLayer: "Ethernet", Rate: "40 Gb/sec (4X QDR)", State: "4: ACTIVE",
				GID0: "fe80:0000:0000:0000:0202:c9ff:fef9:c0a2"},
		}},
	})
	return t, err
}

// Switchdev lays out a ConnectX-6 Dx PF in switchdev mode with vfs VFs: the PF's
// net/ holds the uplink (phys_port_name p0) and one representor per VF (pf0vfN), its
// RDMA device has a port for the uplink and one per representor, and each VF has
// its own netdev and RDMA device.
func Switchdev(root string, vfs int) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	pf := "0000:3b:00.0"
	nds := []Netdev{{Name: "enp59s0f0np0", Type: 1, Speed: 100000, OperState: "up", MTU: 9000, MAC: "0c:42:a1:3b:00:00",
		PhysPortName: "p0", EswitchMode: "switchdev"}}
	ports := []RDMAPort{{Num: 1, LinkLayer: "Ethernet", Rate: "100 Gb/sec (4X EDR)", State: "4: ACTIVE"}}
	for v := range vfs {
		nds = append(nds, Netdev{Name: fmt.Sprintf("enp59s0f0r%d", v), Type: 1, OperState: "up", MTU: 1500,
			MAC: fmt.Sprintf("ce:00:00:3b:00:%02x", v), PhysPortName: fmt.Sprintf("pf0vf%d", v), DevPort: 0})
		ports = append(ports, RDMAPort{Num: 2 + v, LinkLayer: "Ethernet", Rate: "100 Gb/sec (4X EDR)", State: "4: ACTIVE",
			NDev: fmt.Sprintf("enp59s0f0r%d", v)})
	}
	if err := t.Add(Function{Address: pf, Vendor: VendorNVIDIA, Device: DeviceCX6Dx, Class: ClassEthernet, Driver: "mlx5_core",
		NUMA: 0, TotalVFs: 8, NumVFs: vfs, Netdevs: nds, RDMA: &RDMA{Name: "mlx5_0", Ports: ports}}); err != nil {
		return nil, err
	}
	for v := range vfs {
		if err := t.AddVF(pf, v, Function{Address: fmt.Sprintf("0000:3b:00.%d", 2+v), Vendor: VendorNVIDIA, Device: DeviceCXVF,
			Class: ClassEthernet, Driver: "mlx5_core", NUMA: 0,
			Netdevs: []Netdev{{Name: fmt.Sprintf("enp59s0f0v%d", v), Type: 1, Speed: 100000, OperState: "up", MTU: 1500,
				MAC: fmt.Sprintf("02:00:00:3b:00:%02x", v)}},
			RDMA: &RDMA{Name: fmt.Sprintf("mlx5_%d", 1+v), Ports: []RDMAPort{{Num: 1, LinkLayer: "Ethernet",
				Rate: "100 Gb/sec (4X EDR)", State: "4: ACTIVE"}}}}); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// PassthroughVF lays out a VM's view of a ConnectX-7 VF passed through to it: a VF
// device ID with no PF on the machine.
func PassthroughVF(root string) (*Tree, error) {
	t, err := New(root)
	if err != nil {
		return nil, err
	}
	err = t.Add(Function{Address: "0000:00:05.0", Vendor: VendorNVIDIA, Device: DeviceCXVF, Class: ClassEthernet,
		Driver: "mlx5_core", NUMA: -1,
		Netdevs: []Netdev{{Name: "ens5", Type: 1, Speed: 200000, OperState: "up", MTU: 9000, MAC: "02:00:00:00:05:00"}},
		RDMA: &RDMA{Name: "mlx5_0", Ports: []RDMAPort{{Num: 1, LinkLayer: "Ethernet", Rate: "200 Gb/sec (4X HDR)",
			State: "4: ACTIVE"}}}})
	return t, err
}
