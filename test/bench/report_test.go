package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// BenchmarkReportChange measures what one change of a daemon's held report
// costs the API server's other clients, for the two places the report can live
// (issue 44):
//
//   - on the Node, as today (annotations ipam.hwipam.io/held and pools-in-use):
//     every watcher of Nodes receives the whole Node again. Measured for a
//     protobuf watcher (the scheduler, kube-controller-manager and other
//     client-go components ask for protobuf) and a JSON one (most agents and
//     operators: CNI agents, NFD, GPU and network operators, custom
//     controllers), on a Node shaped like a GPU node's (labels of NFD, the GPU
//     operator and hwipam's 8 ports, kubelet conditions, 40 images);
//   - on the node's NodeIPAM (its 8 blocks): only watchers of NodeIPAMs receive
//     it, the controller (JSON, a CRD has no protobuf) and the node's own daemon
//     (a watch by name).
//
// It reports the bytes each watcher reads per change (node-proto-B/change,
// node-json-B/change, nodeipam-json-B/change) and the objects' sizes.
func BenchmarkReportChange(b *testing.B) {
	cp := harness.StartControlPlane(b, harness.ControlPlaneOptions{})
	ctx := b.Context()
	c := cp.Client
	const ns = "default"
	node := gpuNode("gpu-node-0042")
	status := node.Status
	if err := c.Create(ctx, node); err != nil {
		b.Fatal(err)
	}
	node.Status = status
	if err := c.Status().Update(ctx, node); err != nil {
		b.Fatal(err)
	}
	record := &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.Name}}
	for i := range 8 {
		record.Spec.Blocks = append(record.Spec.Blocks, nodeipamv1.NodeBlock{Kind: v1alpha1.KindIPPool,
			Pool: fmt.Sprintf("rail-%d", i), PoolUID: types.UID(fmt.Sprintf("0b8d3c1e-58f2-4c4e-9d6a-3f1e2b7c9a%02d", i)),
			StartIP: fmt.Sprintf("10.%d.1.65", i), EndIP: fmt.Sprintf("10.%d.1.72", i), PoolGeneration: 3})
	}
	if err := c.Create(ctx, record, client.FieldOwner(nodeipamv1.FieldManager)); err != nil {
		b.Fatal(err)
	}
	var stored corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: node.Name}, &stored); err != nil {
		b.Fatal(err)
	}
	nodeJSON, _ := json.Marshal(&stored)

	protoNodes := startWatch(b, cp.Config, "/api/v1/nodes", stored.ResourceVersion, "application/vnd.kubernetes.protobuf;stream=watch")
	jsonNodes := startWatch(b, cp.Config, "/api/v1/nodes", stored.ResourceVersion, "application/json")
	var rec nodeipamv1.NodeIPAM
	if err := c.Get(ctx, client.ObjectKeyFromObject(record), &rec); err != nil {
		b.Fatal(err)
	}
	recJSON, _ := json.Marshal(&rec)
	records := startWatch(b, cp.Config, "/apis/ipam.hwipam.io/v1alpha1/namespaces/"+ns+"/nodeipams", rec.ResourceVersion, "application/json")

	const changes = 20
	for i := range changes {
		report := heldReport(i)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			v1alpha1.HeldAnnotation: report}}})
		if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
			b.Fatal(err)
		}
		// The same report on the record (an annotation stands for a status
		// the daemon would write there: the same bytes).
		if err := c.Patch(ctx, &nodeipamv1.NodeIPAM{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.Name}},
			client.RawPatch(types.MergePatchType, patch)); err != nil {
			b.Fatal(err)
		}
	}
	for _, w := range []*countingWatch{protoNodes, jsonNodes, records} {
		w.waitEvents(b, changes, 30*time.Second)
	}
	b.ReportMetric(float64(protoNodes.bytes.Load())/changes, "node-proto-B/change")
	b.ReportMetric(float64(jsonNodes.bytes.Load())/changes, "node-json-B/change")
	b.ReportMetric(float64(records.bytes.Load())/changes, "nodeipam-json-B/change")
	b.ReportMetric(float64(len(nodeJSON)), "node-json-B")
	b.ReportMetric(float64(len(recJSON)), "nodeipam-json-B")
	b.ReportMetric(float64(len(heldReport(0))), "report-B")
	b.Logf("one report change: %d bytes to each protobuf watcher of Nodes, %d to each JSON one; %d to each watcher of NodeIPAMs "+
		"(the Node %d bytes of JSON, its NodeIPAM %d, the report %d)", protoNodes.bytes.Load()/changes,
		jsonNodes.bytes.Load()/changes, records.bytes.Load()/changes, len(nodeJSON), len(recJSON), len(heldReport(0)))
}

// heldReport is a daemon's held report of 8 pools, its i-th version: each pool's
// block, and in some an orphaned range.
func heldReport(i int) string {
	holds := map[string]v1alpha1.PoolHold{}
	for p := range 8 {
		h := v1alpha1.PoolHold{Block: fmt.Sprintf("10.%d.1.65-10.%d.1.72", p, p)}
		if (p+i)%3 == 0 {
			h.Held = []string{fmt.Sprintf("10.%d.0.%d-10.%d.0.%d", p, 9+i%8, p, 12+i%8)}
		}
		holds[fmt.Sprintf("rail-%d", p)] = h
	}
	b, _ := json.Marshal(holds)
	return string(b)
}

// gpuNode is a Node shaped like a GPU node's in a cluster that runs NFD, the GPU
// operator and hwipam with 8 ports: its labels, annotations and the status a
// kubelet writes.
func gpuNode(name string) *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
		"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
		"topology.kubernetes.io/zone": "dc1-row4", "topology.kubernetes.io/region": "dc1",
		"node.kubernetes.io/instance-type": "dgx-h100",
	}
	for _, f := range []string{"cpu-cpuid.AVX512F", "cpu-cpuid.AVX512BW", "cpu-cpuid.AMXTILE", "cpu-hardware_multithreading",
		"cpu-model.family", "cpu-model.id", "cpu-model.vendor_id", "kernel-version.full", "kernel-version.major",
		"memory-numa", "pci-10de.present", "pci-15b3.present", "pci-15b3.sriov.capable", "rdma.available", "rdma.capable",
		"storage-nonrotationaldisk", "system-os_release.ID", "system-os_release.VERSION_ID", "network-sriov.capable",
		"cpu-pstate.status", "cpu-rdt.RDTMON", "iommu-enabled", "kernel-config.NO_HZ", "usb-ef_0b95_1790.present"} {
		labels["feature.node.kubernetes.io/"+f] = "true"
	}
	for g, v := range map[string]string{"count": "8", "product": "NVIDIA-H100-80GB-HBM3", "memory": "81559", "family": "hopper",
		"compute.major": "9", "compute.minor": "0", "driver.major": "570", "driver.minor": "124", "driver.rev": "06",
		"cuda.driver.major": "12", "cuda.runtime.major": "12", "machine": "DGXH100", "replicas": "1", "sharing-strategy": "none",
		"mig.capable": "true", "present": "true", "deploy.driver": "true", "deploy.device-plugin": "true", "deploy.dcgm-exporter": "true"} {
		labels["nvidia.com/gpu."+g] = v
	}
	labels["nic.hwipam.io/present"], labels["nic.hwipam.io/count"], labels["nic.hwipam.io/rdma"] = "true", "8", "true"
	for p := range 8 {
		port := fmt.Sprintf("ibp%ds0", 24+p*16)
		labels["nic.hwipam.io/"+port] = "ib"
		labels["nic.hwipam.io/"+port+".model"] = "ConnectX-7"
		labels["nic.hwipam.io/"+port+".speed"] = "400000"
		labels["nic.hwipam.io/"+port+".numa"] = fmt.Sprint(p / 4)
		labels["nic.hwipam.io/"+port+".pcieroot"] = fmt.Sprintf("pci0000_%02x", 0x15+p*0x10)
		labels["nic.hwipam.io/"+port+".gpus"] = fmt.Sprint(p)
		labels["nic.hwipam.io/rail.rail-"+fmt.Sprint(p)] = port
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{
		"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"csi.volume.kubernetes.io/nodeid":       `{"csi.tigera.io":"` + name + `","nfs.csi.k8s.io":"` + name + `"}`,
		"nfd.node.kubernetes.io/feature-labels": "cpu-cpuid.AVX512F,cpu-cpuid.AVX512BW,pci-10de.present,pci-15b3.present,rdma.available",
		v1alpha1.PoolsInUseAnnotation:           "rail-0,rail-1,rail-2,rail-3,rail-4,rail-5,rail-6,rail-7",
		v1alpha1.HeldAnnotation:                 heldReport(99),
	}}}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("224"), corev1.ResourceMemory: resource.MustParse("2113661592Ki"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("1844203404Ki"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
		"nvidia.com/gpu": resource.MustParse("8"), "rdma/rdma_shared_device_a": resource.MustParse("63"),
		"nvidia.com/mlnxnics": resource.MustParse("8"),
	}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{Capacity: res, Allocatable: res,
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.16.4.42"}, {Type: corev1.NodeHostName, Address: name}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{MachineID: strings.Repeat("4f", 16), SystemUUID: "4c4c4544-0042-3510-8057-b4c04f4d3433",
			BootID: "8f2d1c7e-2b5a-4c1e-9e0f-7a6b5c4d3e2f", KernelVersion: "6.8.0-45-generic", OSImage: "Ubuntu 24.04.1 LTS",
			ContainerRuntimeVersion: "containerd://2.1.4", KubeletVersion: "v1.37.1", OperatingSystem: "linux", Architecture: "amd64"}}
	for _, cond := range []struct {
		t      corev1.NodeConditionType
		s      corev1.ConditionStatus
		reason string
		msg    string
	}{
		{corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"},
		{corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"},
		{corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"},
		{corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"},
	} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: cond.t, Status: cond.s, Reason: cond.reason,
			Message: cond.msg, LastHeartbeatTime: now, LastTransitionTime: now})
	}
	for i := range 40 {
		repo := fmt.Sprintf("nvcr.io/nvidia/cloud-native/component-%02d", i)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{
			repo + "@sha256:" + strings.Repeat(fmt.Sprintf("%02x", i), 32), repo + ":v24.9." + fmt.Sprint(i%7)}, SizeBytes: int64(100_000_000 + i*7_345_981)})
	}
	return n
}

// countingWatch is a watch request whose answer's bytes and events are counted.
type countingWatch struct {
	bytes  atomic.Int64
	events atomic.Int64
}

// startWatch watches path from resourceVersion rv, asking for accept, and counts
// what it reads until the benchmark ends.
func startWatch(b *testing.B, cfg *rest.Config, path, rv, accept string) *countingWatch {
	b.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path+"?watch=1&resourceVersion="+rv, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("watch %s: %s", path, resp.Status)
	}
	w := &countingWatch{}
	go func() {
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		for {
			if strings.Contains(accept, "protobuf") {
				var size uint32
				if err := binary.Read(r, binary.BigEndian, &size); err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, r, int64(size)); err != nil {
					return
				}
				w.bytes.Add(int64(size) + 4)
			} else {
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				w.bytes.Add(int64(len(line)))
			}
			w.events.Add(1)
		}
	}()
	return w
}

func (w *countingWatch) waitEvents(b *testing.B, n int, within time.Duration) {
	b.Helper()
	deadline := time.Now().Add(within)
	for w.events.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d watch events within %s", w.events.Load(), n, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
