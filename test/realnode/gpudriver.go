package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// GPUDriverName is the test-only GPU DRA driver's name, that of NVIDIA's GPU
// driver, which it stands in for (only on the test's node, where no GPU is): publishing a captured tree's GPUs with the standard
// attributes that driver publishes (pciBusID, pcieRoot), so that claims can
// align a NIC of nic.hwipam.io with a GPU as they would on a GPU node. It
// prepares nothing (no GPU is there).
const GPUDriverName = "gpu.nvidia.com"

// GPUAttrIndex is the GPU's index in PCI order, as nvidia-smi numbers them and
// as nic.hwipam.io/gpus lists them.
const GPUAttrIndex resourceapi.QualifiedName = GPUDriverName + "/index"

// GPUDeviceClass is the DeviceClass NVIDIA's driver installs, for the test GPUs.
const GPUDeviceClass = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.nvidia.com"
`

// GPUDevices are the test driver's devices for the GPUs at these PCI addresses
// of the sysfs tree at root: gpu-<index>.
func GPUDevices(root string, gpus []string) ([]resourceapi.Device, error) {
	var out []resourceapi.Device
	for i, bdf := range gpus {
		d := resourceapi.Device{Name: "gpu-" + strconv.Itoa(i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
		bus, err := deviceattribute.GetPCIBusIDAttribute(bdf)
		if err != nil {
			return nil, err
		}
		rc, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bdf, deviceattribute.WithFSFromRoot(filepath.Join(root, "sys")))
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %w", bdf, err)
		}
		idx := int64(i)
		d.Attributes[bus.Name], d.Attributes[rc.Name] = bus.Value, rc.Value
		d.Attributes[GPUAttrIndex] = resourceapi.DeviceAttribute{IntValue: &idx}
		out = append(out, d)
	}
	return out, nil
}

// gpuPlugin prepares nothing and reports no health.
type gpuPlugin struct{ node string }

func (g gpuPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver == GPUDriverName {
				r.Devices = append(r.Devices, kubeletplugin.Device{Requests: []string{res.Request}, PoolName: res.Pool, DeviceName: res.Device})
			}
		}
		out[c.UID] = r
	}
	return out, nil
}

func (gpuPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (gpuPlugin) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (gpuPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// StartGPUDriver registers the test GPU driver with this node's kubelet and
// publishes the GPUs at these PCI addresses of the sysfs tree at root. Stop
// unregisters it; its ResourceSlice stays until it is deleted.
func (c *Cluster) StartGPUDriver(ctx context.Context, root string, gpus []string, log logr.Logger) (stop func(), err error) {
	return StartGPUDriver(ctx, c.Clientset, c.NodeName, c.KubeletDir(), root, gpus, log)
}

// StartGPUDriver is Cluster.StartGPUDriver for a node known by its client,
// name and kubelet root directory (make demo runs it in a process of its own).
func StartGPUDriver(ctx context.Context, cs kubernetes.Interface, nodeName, kubeletDir, root string, gpus []string,
	log logr.Logger) (stop func(), err error) {
	devs, err := GPUDevices(root, gpus)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(kubeletDir, "plugins", GPUDriverName), 0o750); err != nil {
		return nil, err
	}
	h, err := kubeletplugin.Start(klog.NewContext(context.WithoutCancel(ctx), log), gpuPlugin{node: nodeName},
		kubeletplugin.DriverName(GPUDriverName), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(cs),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(kubeletDir, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(kubeletDir, "plugins", GPUDriverName)))
	if err != nil {
		return nil, fmt.Errorf("starting the test GPU driver: %w", err)
	}
	if err := h.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}}}}); err != nil {
		h.Stop()
		return nil, err
	}
	return h.Stop, nil
}

// KubeletDir is the kubelet's --root-dir.
func (c *Cluster) KubeletDir() string { return filepath.Join(c.Dir, "kubelet") }

// GPUAndNIC is a claim for GPU index gpu (of the test GPU driver, as NVIDIA's
// names it) and a nic.hwipam.io NIC on the same PCIe root complex; nicSelector,
// when set, is a CEL expression the NIC must also match.
func GPUAndNIC(gpu int, nicSelector string) resourceapi.ResourceClaimSpec {
	nic := &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}
	if nicSelector != "" {
		nic.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: nicSelector}}}
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: GPUDriverName,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes[%q].index == %d`, GPUDriverName, gpu)}}}}},
			{Name: "nic", Exactly: nic},
		},
		Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "nic"},
			MatchAttribute: new(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}},
	}}
}
