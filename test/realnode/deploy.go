package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/test/harness"
)

// BuildImage builds the hwipam image from the work tree at repo with `make image`
// (the target users run) into the run directory, pushes it to the node's registry
// as hwipam:<tag> and returns the reference pods use.
func (c *Cluster) BuildImage(ctx context.Context, repo, tag string) (string, error) {
	bin := filepath.Join(c.Dir, "image")
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "-C", repo, "image",
		"BIN_DIR="+bin, "IMAGE_TAG="+tag)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make image: %w\n%s", err, out)
	}
	if err := c.PushImage(ctx, filepath.Join(bin, "hwipam-image.tar"), "hwipam:"+tag); err != nil {
		return "", err
	}
	harness.StatSources() // the image and deploy/'s manifests are part of this test's inputs
	return c.Registry + "/hwipam:" + tag, nil
}

// DeployOptions tune Deploy.
type DeployOptions struct {
	// Image is the hwipam image reference (from BuildImage).
	Image string
	// Overlay is the kustomization to deploy, relative to the repository:
	// "deploy/base" when empty, or one of deploy/overlays/*.
	Overlay string
	// NodeArgs override or add ipam-node flags ("--flag=value"), after the
	// run-directory paths Deploy sets itself.
	NodeArgs []string
	// HostPaths mounts host directories into the ipam-node container at the same path
	// (for a captured sysfs tree, say).
	HostPaths []string
}

// The files Deploy keeps in the run directory: under deploy/<overlay>/ the generated
// kustomization, its node patch and the options it was made with; deploy/current
// names the generated directory that is applied now.
const (
	deployOptionsFile = "options.json"
	currentFile       = "current"
	baseOverlay       = "deploy/base"
)

// Deploy applies one of the repository's kustomizations (o.Overlay, deploy/base by
// default) through a kustomization generated in the run directory that changes only
// what differs on this node: the image, the host paths of the CNI bin and conf
// directories and of the daemon's state (this node's are under the run directory, not
// /opt/cni/bin, /etc/cni/net.d and /var/lib/cni), and the host-network ports of
// ipam-node's probes and metrics (free ones, so that two nodes on one machine do not
// collide). The patch is computed from the overlay's own rendering, so flags and
// mounts an overlay changes (the openshift CNI bin dir, say) are kept; only the host
// side of the three directories is this node's. The DRA overlay's kubelet and netns
// mounts move to this node's directories (draPatch). It waits for both rollouts.
func (c *Cluster) Deploy(ctx context.Context, repo string, o DeployOptions) error {
	dir, err := c.generate(ctx, repo, o)
	if err != nil {
		return err
	}
	return c.apply(ctx, dir)
}

// generate writes the kustomization Deploy applies into the run directory and
// returns its directory.
func (c *Cluster) generate(ctx context.Context, repo string, o DeployOptions) (string, error) {
	if o.Overlay == "" {
		o.Overlay = baseOverlay
	}
	src := filepath.Join(repo, filepath.FromSlash(o.Overlay))
	rendered, err := c.Kubectl(ctx, "kustomize", src)
	if err != nil {
		return "", fmt.Errorf("rendering %s: %w", o.Overlay, err)
	}
	ds, err := renderedDaemonSet(rendered)
	if err != nil {
		return "", fmt.Errorf("%s: %w", o.Overlay, err)
	}
	ctr := ds.Spec.Template.Spec.Containers[0]
	health, err := freePort(c.NodeIP.String())
	if err != nil {
		return "", err
	}
	metrics, err := freePort(c.NodeIP.String())
	if err != nil {
		return "", err
	}
	draOps, draArgs := c.draPatch(ds)
	args := overrideArgs(ctr.Args, append([]string{
		// The socket's path inside the container is /var/lib/cni/nv-ipam (the base's
		// mount); on the host, where the plugin runs, it is the state dir.
		"--cni-daemon-socket=unix://" + filepath.Join(c.StateDir, "daemon.sock"),
		"--cni-log-file=" + filepath.Join(c.Dir, "logs", "nv-ipam-cni.log"),
		fmt.Sprintf("--health-probe-bind-address=:%d", health),
		fmt.Sprintf("--metrics-bind-address=:%d", metrics),
	}, append(draArgs, o.NodeArgs...)...))
	hostPaths := map[string]string{
		"state":    c.StateDir,
		"cni-bin":  c.CNIBinDir,
		"cni-conf": filepath.Join(c.CNIConfDir, "nv-ipam.d"),
	}
	var volumes, mounts strings.Builder
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if p, ok := hostPaths[v.Name]; ok {
			fmt.Fprintf(&volumes, "      - name: %s\n        hostPath: {path: %q}\n", v.Name, p)
			delete(hostPaths, v.Name)
		}
	}
	if len(hostPaths) > 0 {
		return "", fmt.Errorf("%s: the DaemonSet %s has no volumes %v: it must mount the CNI bin and conf dirs and the state dir",
			o.Overlay, ds.Name, keys(hostPaths))
	}
	for i, p := range o.HostPaths {
		fmt.Fprintf(&volumes, "      - name: extra%d\n        hostPath: {path: %q}\n", i, p)
		fmt.Fprintf(&mounts, "        - {name: extra%d, mountPath: %q, readOnly: true}\n", i, p)
	}
	var argList strings.Builder
	for _, a := range args {
		fmt.Fprintf(&argList, "        - %q\n", a)
	}
	patch := fmt.Sprintf(`apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: %s
  namespace: %s
spec:
  template:
    spec:
      containers:
      - name: %s
        args:
%s        livenessProbe: {httpGet: {port: %d}}
        readinessProbe: {httpGet: {port: %d}}
`, ds.Name, ds.Namespace, ctr.Name, argList.String(), health, health)
	// The port a PodMonitor scrapes (deploy/monitoring) is where the daemon serves
	// here: a JSON patch, since a strategic merge matches ports by number.
	var portOps []string
	if i := slices.IndexFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }); i >= 0 {
		portOps = append(portOps, fmt.Sprintf("- {op: replace, path: /spec/template/spec/containers/0/ports/%d/containerPort, value: %d}", i, metrics))
	}
	if mounts.Len() > 0 {
		patch += "        volumeMounts:\n" + mounts.String()
	}
	patch += "      volumes:\n" + volumes.String()

	dir := filepath.Join(c.Dir, "deploy", strings.ReplaceAll(path.Clean(o.Overlay), "/", "-"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, src)
	if err != nil {
		return "", err
	}
	_, tag, ok := strings.Cut(o.Image[strings.LastIndexByte(o.Image, '/')+1:], ":")
	if !ok {
		return "", fmt.Errorf("image %q has no tag", o.Image)
	}
	kustomization := fmt.Sprintf(`# Generated by test/realnode: %s with this node's image and paths.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: ghcr.io/hwipam/hwipam
  newName: %s
  newTag: %s
patches:
`, o.Overlay, filepath.ToSlash(rel), strings.TrimSuffix(o.Image, ":"+tag), tag)
	files := map[string]string{}
	if len(draOps) > 0 {
		// First: its operations address the overlay's lists by index.
		kustomization += fmt.Sprintf("- path: dra-patch.yaml\n  target: {group: apps, kind: DaemonSet, name: %s}\n", ds.Name)
		files["dra-patch.yaml"] = strings.Join(draOps, "\n") + "\n"
	}
	if len(portOps) > 0 {
		kustomization += fmt.Sprintf("- path: ports-patch.yaml\n  target: {group: apps, kind: DaemonSet, name: %s}\n", ds.Name)
		files["ports-patch.yaml"] = strings.Join(portOps, "\n") + "\n"
	}
	kustomization += "- path: node-patch.yaml\n"
	opts, err := json.Marshal(o)
	if err != nil {
		return "", err
	}
	files["kustomization.yaml"], files["node-patch.yaml"], files[deployOptionsFile] = kustomization, patch, string(opts)
	// A file of an earlier generation that this one does not write would not be
	// used, but would mislead whoever reads the run directory.
	_ = os.Remove(filepath.Join(dir, "dra-patch.yaml"))
	_ = os.Remove(filepath.Join(dir, "ports-patch.yaml"))
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// draPatch moves the DRA overlay's (deploy/dra) kubelet plugin and network
// namespace mounts to where this node has them: its kubelet's --root-dir and its
// containerd's network namespaces (netns_mounts_under_state_dir) are under the run
// directory, not /var/lib/kubelet and /var/run/netns. The path changes inside the
// container too (the kubelet and containerd hand the plugin host paths), so these
// are JSON patch operations on the volumes' host paths and the mounts' paths, and
// the flag that names the kubelet's directory. NRI's socket is containerd's default,
// /var/run/nri, as the overlay has it. A DaemonSet without these volumes (any other
// overlay) gets nothing.
func (c *Cluster) draPatch(ds *appsv1.DaemonSet) (ops, args []string) {
	kubelet := filepath.Join(c.Dir, "kubelet") // startKubelet's --root-dir
	paths := map[string]string{
		"kubelet-plugins-registry": filepath.Join(kubelet, "plugins_registry"),
		"kubelet-plugin-dir":       filepath.Join(kubelet, "plugins", "nic.hwipam.io"),
		"netns":                    filepath.Join(c.Dir, "containerd", "state", "io.containerd.grpc.v1.cri", "netns"),
		"cdi":                      c.CDIDir(),
	}
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if p, ok := paths[v.Name]; ok && v.HostPath != nil {
			ops = append(ops, fmt.Sprintf("- {op: replace, path: /spec/template/spec/volumes/%d/hostPath/path, value: %q}", i, p))
		}
	}
	for i, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if p, ok := paths[m.Name]; ok {
			ops = append(ops, fmt.Sprintf("- {op: replace, path: /spec/template/spec/containers/0/volumeMounts/%d/mountPath, value: %q}", i, p))
		}
	}
	if len(ops) > 0 {
		args = []string{"--dra-kubelet-dir=" + kubelet, "--dra-cdi-dir=" + c.CDIDir()}
	}
	return ops, args
}

// apply applies a generated kustomization, records it as the current one and waits
// for both rollouts.
func (c *Cluster) apply(ctx context.Context, dir string) error {
	if err := os.WriteFile(filepath.Join(c.Dir, "deploy", currentFile), []byte(dir), 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-k", dir); err != nil {
		return err
	}
	return c.WaitRollout(ctx, 3*time.Minute)
}

// BaseOptions returns the options of the last Deploy of deploy/base, so that a spec
// can deploy another overlay the way the suite deployed the base (same image, same
// extra flags and host paths).
func (c *Cluster) BaseOptions() (DeployOptions, error) {
	var o DeployOptions
	data, err := os.ReadFile(filepath.Join(c.baseDir(), deployOptionsFile))
	if err != nil {
		return o, fmt.Errorf("deploy/base was not deployed on this node: %w", err)
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("%s: %w", deployOptionsFile, err)
	}
	return o, nil
}

func (c *Cluster) baseDir() string {
	return filepath.Join(c.Dir, "deploy", strings.ReplaceAll(baseOverlay, "/", "-"))
}

// renderedDaemonSet finds the ipam-node DaemonSet in a kustomize rendering.
func renderedDaemonSet(rendered string) (*appsv1.DaemonSet, error) {
	var found []*appsv1.DaemonSet
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("rendering: %w", err)
		}
		if meta.Kind != "DaemonSet" {
			continue
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			return nil, fmt.Errorf("rendered DaemonSet: %w", err)
		}
		found = append(found, &ds)
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("want one DaemonSet (ipam-node) in the rendering, found %d", len(found))
	}
	if n := len(found[0].Spec.Template.Spec.Containers); n != 1 {
		return nil, fmt.Errorf("DaemonSet %s: want one container, found %d", found[0].Name, n)
	}
	return found[0], nil
}

// WaitRollout waits for the ipam-node DaemonSet and the controller Deployment to be
// rolled out and ready.
func (c *Cluster) WaitRollout(ctx context.Context, timeout time.Duration) error {
	for _, obj := range []string{"daemonset/hwipam-node", "deployment/hwipam-controller"} {
		if _, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", obj,
			fmt.Sprintf("--timeout=%s", timeout)); err != nil {
			return fmt.Errorf("%w\n%s", err, c.rolloutDiagnostics(obj))
		}
	}
	return nil
}

// rolloutDiagnostics says why a rollout did not finish: the pods, the recent
// events, and for each pod of the workload its description's tail and its
// container's log (the previous run's too, when it restarted).
func (c *Cluster) rolloutDiagnostics(obj string) string {
	// A fresh context: the caller's may be what ran out.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	pods, _ := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-o", "wide")
	events, _ := c.Kubectl(ctx, "-n", "kube-system", "get", "events", "--sort-by=.lastTimestamp")
	fmt.Fprintf(&b, "pods:\n%s\nevents:\n%s\n", pods, harness.LastLines(events, 25))
	app := "app.kubernetes.io/name=" + obj[strings.IndexByte(obj, '/')+1:]
	names, _ := c.Kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", app, "-o", "jsonpath={.items[*].metadata.name}")
	for _, pod := range strings.Fields(names) {
		desc, _ := c.Kubectl(ctx, "-n", "kube-system", "describe", "pod", pod)
		logs, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", pod, "--tail=30")
		prev, _ := c.Kubectl(ctx, "-n", "kube-system", "logs", pod, "--previous", "--tail=30")
		fmt.Fprintf(&b, "pod %s:\n%s\nlog:\n%s\nprevious log:\n%s\n", pod, harness.LastLines(desc, 40), logs, prev)
	}
	return b.String()
}

// overrideArgs returns args with each "--flag=value" of over replacing the same flag
// in args, or appended when args lacks it.
func overrideArgs(args, over []string) []string {
	out := append([]string(nil), args...)
	for _, o := range over {
		flag, _, _ := strings.Cut(o, "=")
		replaced := false
		for i, a := range out {
			if f, _, _ := strings.Cut(a, "="); f == flag {
				out[i], replaced = o, true
			}
		}
		if !replaced {
			out = append(out, o)
		}
	}
	return out
}

func keys(m map[string]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// Undeploy deletes what the current deployment (the last Deploy or Redeploy) created
// except the CRDs — the Deployment, the DaemonSet, their RBAC and whatever the overlay
// adds (a webhook configuration and Service, say) — and waits until the pods are gone,
// so another rendering of hwipam can take the node over. Pools and the daemon's state
// on the host stay; Redeploy brings deploy/base back.
func (c *Cluster) Undeploy(ctx context.Context) error {
	current, err := os.ReadFile(filepath.Join(c.Dir, "deploy", currentFile))
	if err != nil {
		return fmt.Errorf("nothing deployed on this node: %w", err)
	}
	rendered, err := c.Kubectl(ctx, "kustomize", string(current))
	if err != nil {
		return err
	}
	var keep []string
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("rendering %s: %w", current, err)
		}
		if meta.Kind != "CustomResourceDefinition" && meta.Kind != "Namespace" {
			keep = append(keep, doc)
		}
	}
	file := filepath.Join(c.Dir, "deploy", "undeploy.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(keep, "\n---\n")), 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=true", "--timeout=2m", "-f", file); err != nil {
		return err
	}
	for _, app := range []string{"hwipam-node", "hwipam-controller"} {
		if _, err := c.Kubectl(ctx, "-n", "kube-system", "wait", "--for=delete", "pod",
			"-l", "app.kubernetes.io/name="+app, "--timeout=2m"); err != nil {
			return err
		}
	}
	return nil
}

// Redeploy applies again the kustomization the last Deploy of deploy/base generated
// (the suite's deployment) and waits for both rollouts.
func (c *Cluster) Redeploy(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(c.baseDir(), "kustomization.yaml")); err != nil {
		return fmt.Errorf("deploy/base was not deployed on this node: %w", err)
	}
	return c.apply(ctx, c.baseDir())
}
