// Package privilege checks, on a real kube-apiserver, what deploy/ lets hwipam's
// service accounts do: the RBAC (every verb the binaries use, nothing more, with
// the real kubectl's `auth can-i`), the admission policies that confine ipam-node to
// its own Node and NodeFeature (with service-account tokens bound to pods, as the
// kubelet gives them, and the real ipam-node binary), and the NFD path: the real
// nfd-master turning ipam-node's NodeFeature into Node labels that a pool selects.
package privilege

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/test/harness"
)

const (
	ns         = "kube-system"
	nodeSA     = "hwipam-node"
	controlSA  = "hwipam-controller"
	fieldOwner = "hwipam-privilege-test"
)

// nodeBin is a binary of the real node's build (hack/test-assets.sh).
func nodeBin(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("HWIPAM_NODE_BIN_DIR")
	if dir == "" {
		t.Fatalf("HWIPAM_NODE_BIN_DIR is not set: run `make test`, or `eval \"$(hack/test-assets.sh env)\"` before `go test`")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not in HWIPAM_NODE_BIN_DIR (%v): run hack/test-assets.sh", name, err)
	}
	return p
}

// kubectl runs the real kubectl and returns its stdout; err carries stderr.
func kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(nodeBin(t, "kubectl"), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// render renders a kustomization of the repository with the real kubectl.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := kubectl(t, "kustomize", filepath.Join(harness.RepoRoot(), dir))
	if err != nil {
		t.Fatal(err)
	}
	return decodeYAML(t, out)
}

func decodeYAML(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	for {
		var m map[string]any
		if err := d.Decode(&m); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatalf("decoding YAML: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// apply server-side applies objects as the cluster admin.
func apply(t *testing.T, c client.Client, objs ...*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if err := c.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(fieldOwner),
			client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// accessKinds are the kinds of deploy/base that decide what the service accounts
// may do; the test applies these and leaves out the workloads and webhooks.
var accessKinds = map[string]bool{
	"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// nfdCRDFile is NFD's CRD manifest in the module that hack/node/nfd pins.
func nfdCRDFile(t *testing.T) string {
	t.Helper()
	f, err := harness.NFDCRDFile()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// env is a real control plane with deploy/base's service accounts, RBAC and
// admission policies, and NFD's CRDs.
type env struct {
	cp         *harness.ControlPlane
	c          client.Client
	cs         kubernetes.Interface
	kubeconfig string // cluster admin
}

func startEnv(t *testing.T) *env {
	t.Helper()
	return startEnvOf(t, "deploy/base", 3)
}

// startEnvOf is startEnv with the service accounts, RBAC and admission policies of
// another kustomization of the repository, which renders that many policies.
func startEnvOf(t *testing.T, kustomization string, wantPolicies int) *env {
	t.Helper()
	return startEnvWith(t, kustomization, wantPolicies, "")
}

// startEnvWith is startEnvOf with kube-apiserver's --feature-gates.
func startEnvWith(t *testing.T, kustomization string, wantPolicies int, featureGates string) *env {
	t.Helper()
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{
		CRDDirs:      []string{filepath.Join(harness.RepoRoot(), "deploy", "crds"), nfdCRDFile(t)},
		FeatureGates: featureGates,
	})
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cp: cp, c: cp.Client, cs: cp.Clientset, kubeconfig: kubeconfig}
	var access []*unstructured.Unstructured
	policies := 0
	for _, o := range render(t, kustomization) {
		if accessKinds[o.GetKind()] {
			access = append(access, o)
		}
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			policies++
		}
	}
	if policies != wantPolicies {
		t.Fatalf("%s renders %d ValidatingAdmissionPolicies, want %d", kustomization, policies, wantPolicies)
	}
	apply(t, e.c, access...)
	// The API server type-checks the policies' CEL when they are used; the warnings
	// land in their status through kube-controller-manager's status controller.
	start(t, nodeBin(t, "kube-controller-manager"), "--kubeconfig", kubeconfig,
		"--controllers", "validatingadmissionpolicy-status-controller", "--leader-elect=false", "--secure-port=0")
	e.waitPoliciesChecked(t)
	return e
}

// waitPoliciesChecked waits until the API server has type-checked every policy and
// fails on any warning (a misspelt field is a warning there, not an error).
func (e *env) waitPoliciesChecked(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, "the admission policies to be type-checked", func() error {
		list, err := e.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
				return fmt.Errorf("%s not checked yet", p.Name)
			}
		}
		for _, p := range list.Items {
			for _, w := range p.Status.TypeChecking.ExpressionWarnings {
				t.Errorf("policy %s: %s: %s", p.Name, w.FieldRef, w.Warning)
			}
		}
		return nil
	})
}

// daemonPod is a pod of the node daemon's service account bound to a node, as the
// DaemonSet makes one. Nothing runs it: its only use is to bind tokens.
func (e *env) daemonPod(t *testing.T, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hwipam-node-" + node, Namespace: ns,
		Labels: map[string]string{"app.kubernetes.io/name": nodeSA}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: nodeSA,
			Containers: []corev1.Container{{Name: "ipam-node", Image: "hwipam"}}}}
	if err := e.c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// token returns a token of the node daemon's service account, bound to pod (which
// makes the API server put the pod's node in it), or unbound when pod is nil.
func (e *env) token(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	return e.tokenFor(t, nodeSA, pod)
}

// tokenFor is token for any service account of kube-system.
func (e *env) tokenFor(t *testing.T, sa string, pod *corev1.Pod) string {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := e.cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// as is a client configuration that authenticates with token only.
func (e *env) as(token string) *rest.Config {
	return &rest.Config{Host: e.cp.Config.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.cp.Config.CAData}}
}

// tokenKubeconfig writes a kubeconfig that authenticates with token only.
func (e *env) tokenKubeconfig(t *testing.T, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: e.cp.Config.Host, CertificateAuthorityData: e.cp.Config.CAData}
	cfg.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "sa"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// createNode creates a Node with a label, an annotation and a taint that are not
// hwipam's, and returns it as the API server stored it.
func (e *env) createNode(t *testing.T, name string) corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels:      map[string]string{"team": "ml", "topology.kubernetes.io/zone": "z1"},
		Annotations: map[string]string{"ops.example.com/owner": "infra"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}}}}
	if err := e.c.Create(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	return *n
}

// mergePatchNode merge-patches a Node as cfg's user.
func mergePatchNode(ctx context.Context, cfg *rest.Config, node string, patch map[string]any, dryRun bool) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, opts)
	return err
}

// wantForbidden fails unless err is a Forbidden error whose message holds want.
func wantForbidden(t *testing.T, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Fatalf("want Forbidden (%q), got %v", want, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("Forbidden, but the message lacks %q: %v", want, err)
	}
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logBuffer collects a process's output for assertions (harness.LogBuffer),
// and echoes it with -v.
type logBuffer struct{ harness.LogBuffer }

func (b *logBuffer) Write(p []byte) (int, error) {
	if testing.Verbose() {
		_, _ = os.Stderr.Write(p)
	}
	return b.LogBuffer.Write(p)
}

// start runs a binary until the test ends, its output in the returned buffer.
func start(t *testing.T, args ...string) *logBuffer {
	t.Helper()
	return startWithEnv(t, nil, args...)
}

// startWithEnv is start with environment variables added.
func startWithEnv(t *testing.T, env []string, args ...string) *logBuffer {
	t.Helper()
	out := &logBuffer{}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() && !testing.Verbose() {
			t.Logf("output of %s:\n%s", filepath.Base(args[0]), harness.LastLines(out.String(), 40))
		}
	})
	return out
}
