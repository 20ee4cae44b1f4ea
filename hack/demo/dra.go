package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/test/realnode"
)

// draRails are the rails of GPU 2's root complex (pci0000:4c) in the DGX-H100
// tree: the demo gives them host links and pools, and its GPU pod gets one of
// them by DRA (docs/dra.md).
var draRails = fakesysfs.DGXH100Rails[2:4]

// draGPU is the GPU the demo's DRA pod claims.
const draGPU = 2

// gpuDriver runs the stand-in GPU driver (test/realnode's, NVIDIA's driver
// name) until SIGTERM: `demo gpu-driver <kubeconfig> <node> <kubelet dir> <sysfs root>`,
// started by `demo up` as a process of the node.
func gpuDriver(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("usage: demo gpu-driver <kubeconfig> <node> <kubelet dir> <sysfs root>")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", args[0])
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopDriver, err := realnode.StartGPUDriver(ctx, cs, args[1], args[2], args[3], fakesysfs.DGXH100GPUs, logr.Discard())
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "GPU driver %s serving %d GPUs of %s\n", realnode.GPUDriverName, len(fakesysfs.DGXH100GPUs), args[3])
	<-ctx.Done()
	stopDriver()
	return nil
}

// startGPUDriver copies this program beside the node (go run's binary goes
// away when the demo returns) and starts its gpu-driver command as a process
// of the node, stopped by make demo-down.
func startGPUDriver(c *realnode.Cluster, sysfsRoot string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin := filepath.Join(dir, "demo-gpu-driver")
	if err := copyFile(self, bin); err != nil {
		return err
	}
	_, err = c.StartHostProcess("gpu-driver", bin, []string{"gpu-driver", c.Kubeconfig, c.NodeName, c.KubeletDir(), sysfsRoot})
	return err
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// startDRAPod waits for both drivers' slices, then starts demo-gpu: a claim
// for GPU draGPU and a NIC of the same PCIe root complex.
func startDRAPod(ctx context.Context, c *realnode.Cluster) error {
	if _, err := c.Clientset.ResourceV1().DeviceClasses().Get(ctx, realnode.GPUDriverName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		f := filepath.Join(dir, "gpu-deviceclass.yaml")
		if err := os.WriteFile(f, []byte(realnode.GPUDeviceClass), 0o644); err != nil {
			return err
		}
		if out, err := c.Kubectl(ctx, "apply", "-f", f); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pools := 0
		for _, driver := range []string{nicdra.DriverName, realnode.GPUDriverName} {
			l, err := c.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driver})
			if err != nil || len(l.Items) == 0 {
				return false, nil // retried until the timeout
			}
			for _, s := range l.Items {
				for _, d := range s.Spec.Devices {
					rail := d.Attributes[nicdra.AttrRail].StringValue
					if d.Attributes[nicdra.AttrPool].StringValue != nil && rail != nil && slices.Contains(draRails, *rail) {
						pools++
					}
				}
			}
		}
		// The driver reads the pools again every 10 s: the DRA rails' pools
		// are on their devices then. (The NAD rails' ports are not published
		// while the demo's pods use them as macvlan masters.)
		return pools >= len(draRails), nil
	}); err != nil {
		return fmt.Errorf("the ResourceSlices of %s and %s: %w", nicdra.DriverName, realnode.GPUDriverName, err)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "demo-gpu", Namespace: "default"},
		Spec: realnode.GPUAndNIC(draGPU, "")}
	if _, err := c.Clientset.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("claim demo-gpu: %w", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "demo-gpu", Namespace: "default"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu-and-nic", ResourceClaimName: new("demo-gpu")}},
			Containers: []corev1.Container{{Name: "app", Image: c.BusyboxImage(), Command: []string{"sleep", "1000000"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu-and-nic"}}}}},
			TerminationGracePeriodSeconds: new(int64(1)),
		}}
	if _, err := c.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("pod demo-gpu: %w", err)
	}
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "pod/demo-gpu", "--timeout=120s"); err != nil {
		events, _ := c.Kubectl(ctx, "get", "events", "--field-selector", "involvedObject.name=demo-gpu")
		return fmt.Errorf("%w\n%s", err, events)
	}
	// The claim's status gets the MAC once the netdev is in the pod (the
	// driver's next refresh).
	return wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := c.Clientset.ResourceV1().ResourceClaims("default").Get(ctx, "demo-gpu", metav1.GetOptions{})
		if err != nil {
			return false, nil // retried until the timeout
		}
		for _, st := range c.Status.Devices {
			if st.Driver == nicdra.DriverName && st.NetworkData != nil && st.NetworkData.HardwareAddress != "" {
				return true, nil
			}
		}
		return false, nil
	})
}

// showDRA prints what demo-gpu got: its GPU, its NIC (rail, root complex,
// switch) and the NIC's address from the rail's pool.
func showDRA(ctx context.Context, c *realnode.Cluster) error {
	claim, err := c.Clientset.ResourceV1().ResourceClaims("default").Get(ctx, "demo-gpu", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if claim.Status.Allocation == nil {
		return fmt.Errorf("claim demo-gpu is not allocated")
	}
	devices := map[string]resourceapi.Device{}
	l, err := c.Clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			devices[s.Spec.Driver+"/"+d.Name] = d
		}
	}
	attr := func(d resourceapi.Device, name resourceapi.QualifiedName) string {
		a := d.Attributes[name]
		switch {
		case a.StringValue != nil:
			return *a.StringValue
		case a.IntValue != nil:
			return fmt.Sprint(*a.IntValue)
		}
		return "-"
	}
	fmt.Fprintf(os.Stdout, "\n== pod demo-gpu: a DRA claim for GPU %d and a NIC on the same PCIe root complex (docs/dra.md)\n", draGPU)
	for _, r := range claim.Status.Allocation.Devices.Results {
		d := devices[r.Driver+"/"+r.Device]
		fmt.Fprintf(os.Stdout, "  %-15s %-18s pcieRoot %s", r.Driver, r.Device, attr(d, "resource.kubernetes.io/pcieRoot"))
		if r.Driver == nicdra.DriverName {
			fmt.Fprintf(os.Stdout, ", rail %s, pool %s, switch %s (GPUs %s)", attr(d, nicdra.AttrRail), attr(d, nicdra.AttrPool),
				attr(d, nicdra.AttrSwitch), attr(d, nicdra.AttrGPUs))
		}
		fmt.Fprintln(os.Stdout)
	}
	for _, st := range claim.Status.Devices {
		if st.Driver == nicdra.DriverName && st.NetworkData != nil {
			fmt.Fprintf(os.Stdout, "  the NIC in the pod: %s %v (MAC %s)\n", st.NetworkData.InterfaceName, st.NetworkData.IPs,
				st.NetworkData.HardwareAddress)
		}
	}
	out, err := c.Kubectl(ctx, "exec", "demo-gpu", "--", "ip", "-4", "-o", "addr", "show")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "  kubectl exec demo-gpu -- ip -4 -o addr show:\n%s", indent(out))
	return nil
}
