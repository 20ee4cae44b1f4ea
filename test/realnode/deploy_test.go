package realnode

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/hwipam/hwipam/test/harness"
)

// TestDeployMovesDRAMounts: the kustomization Deploy generates for
// deploy/overlays/dra has the kubelet plugin's and the network namespaces' mounts at
// this node's paths, inside and out, and --dra-kubelet-dir naming its kubelet's
// directory; the one for deploy/base gets no such patch.
func TestDeployMovesDRAMounts(t *testing.T) {
	c := offlineCluster(t)
	dir, ctx := c.Dir, t.Context()
	image := "127.0.0.1:5000/hwipam:t"
	gen, ds := c.renderGenerated(t, DeployOptions{Image: image, Overlay: "deploy/overlays/dra"})
	kubelet := filepath.Join(dir, "kubelet")
	want := map[string]string{
		"kubelet-plugins-registry": filepath.Join(kubelet, "plugins_registry"),
		"kubelet-plugin-dir":       filepath.Join(kubelet, "plugins", "nic.hwipam.io"),
		"netns":                    filepath.Join(dir, "containerd", "state", "io.containerd.grpc.v1.cri", "netns"),
		"nri":                      "/var/run/nri",
		"cdi":                      c.CDIDir(),
		"state":                    c.StateDir,
	}
	found := map[string]bool{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if p, ok := want[v.Name]; ok {
			found[v.Name] = true
			if v.HostPath == nil || v.HostPath.Path != p {
				t.Errorf("volume %s: %+v, want host path %s", v.Name, v.HostPath, p)
			} else if v.Name == "kubelet-plugins-registry" && (v.HostPath.Type == nil || *v.HostPath.Type != "Directory") {
				t.Errorf("volume %s lost its type: %+v", v.Name, v.HostPath)
			}
		}
	}
	ctr := ds.Spec.Template.Spec.Containers[0]
	for _, m := range ctr.VolumeMounts {
		if p, ok := want[m.Name]; ok && m.Name != "state" && m.MountPath != p {
			t.Errorf("mount %s at %s, want %s (the host's path)", m.Name, m.MountPath, p)
		}
		if m.Name == "netns" && (m.MountPropagation == nil || *m.MountPropagation != "HostToContainer") {
			t.Errorf("netns mount lost its propagation: %+v", m)
		}
	}
	if len(found) != len(want) {
		t.Errorf("volumes %v of %v found", found, want)
	}
	var kubeletFlags []string
	for _, a := range ctr.Args {
		if strings.HasPrefix(a, "--dra-kubelet-dir=") || strings.HasPrefix(a, "--dra-cdi-dir=") {
			kubeletFlags = append(kubeletFlags, a)
		}
	}
	if !slices.Equal(kubeletFlags, []string{"--dra-kubelet-dir=" + kubelet, "--dra-cdi-dir=" + c.CDIDir()}) ||
		!slices.Contains(ctr.Args, "--dra=true") {
		t.Errorf("args %q: want --dra=true, --dra-kubelet-dir=%s and --dra-cdi-dir=%s once each", ctr.Args, kubelet, c.CDIDir())
	}

	gen, err := c.generate(ctx, harness.RepoRoot(), DeployOptions{Image: image})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(gen, "dra-patch.yaml")); !os.IsNotExist(err) {
		t.Errorf("deploy/base got a DRA patch: %v", err)
	}
	if k, err := os.ReadFile(filepath.Join(gen, "kustomization.yaml")); err != nil || strings.Contains(string(k), "dra-patch") {
		t.Errorf("deploy/base's kustomization: %v\n%s", err, k)
	}
}

// deploy/overlays/monitoring names ipam-node's metrics port for its PodMonitor: on
// this node the port is the one the daemon serves on (--metrics-bind-address), once.
func TestDeployMovesTheMetricsPort(t *testing.T) {
	c := offlineCluster(t)
	_, ds := c.renderGenerated(t, DeployOptions{Image: "registry.test/hwipam:t", Overlay: "deploy/overlays/monitoring"})
	ctr := ds.Spec.Template.Spec.Containers[0]
	bind := ""
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-bind-address=:"); ok {
			bind = v
		}
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].Name != "metrics" || fmt.Sprint(ctr.Ports[0].ContainerPort) != bind {
		t.Errorf("ports %+v, metrics served on :%s: want one port named metrics, the one served on", ctr.Ports, bind)
	}
}

// offlineCluster is a Cluster that runs nothing: enough to generate and render
// kustomizations with the node's kubectl.
func offlineCluster(t *testing.T) *Cluster {
	t.Helper()
	bin := os.Getenv("HWIPAM_NODE_BIN_DIR")
	if bin == "" {
		t.Fatal("HWIPAM_NODE_BIN_DIR is not set: run `make test`, or `eval \"$(hack/test-assets.sh env)\"` before `go test`")
	}
	dir := t.TempDir()
	return &Cluster{Dir: dir, Bin: bin, Kubeconfig: filepath.Join(dir, "no-kubeconfig"), NodeIP: netip.MustParseAddr("127.0.0.1"),
		StateDir: filepath.Join(dir, "nv-ipam"), CNIBinDir: filepath.Join(dir, "cni", "bin"), CNIConfDir: filepath.Join(dir, "cni", "net.d")}
}

// renderGenerated generates the kustomization Deploy would apply for o and
// renders it: the generated directory and its DaemonSet.
func (c *Cluster) renderGenerated(t *testing.T, o DeployOptions) (string, *appsv1.DaemonSet) {
	t.Helper()
	gen, err := c.generate(t.Context(), harness.RepoRoot(), o)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Kubectl(t.Context(), "kustomize", gen)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := renderedDaemonSet(out)
	if err != nil {
		t.Fatal(err)
	}
	return gen, ds
}
