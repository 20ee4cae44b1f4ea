// Package harness holds what the project's test suites share: a real Kubernetes
// control plane (kube-apiserver + etcd through controller-runtime's envtest), network
// namespaces joined by veth pairs, and a runner for CNI plugin binaries.
//
// The binaries come from `make test-assets` (hack/test-assets.sh), which builds them
// from source and caches them; `make test` exports where they are through
// KUBEBUILDER_ASSETS and HWIPAM_CNI_BIN_DIR.
package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
)

// ErrNoAssets is returned when the control-plane binaries are not where
// KUBEBUILDER_ASSETS says, or KUBEBUILDER_ASSETS is not set.
var ErrNoAssets = errors.New("test control plane binaries not found: run `make test`, " +
	"or `eval \"$(hack/test-assets.sh env)\"` before `go test`")

// ControlPlane is a running kube-apiserver + etcd pair with clients bound to it.
type ControlPlane struct {
	// Config reaches the apiserver as a cluster admin.
	Config *rest.Config
	// Client is a controller-runtime client that knows the core types and, when the
	// project's CRDs were installed, the scheme given in ControlPlaneOptions.
	Client client.Client
	// Clientset is a typed client for the core API groups.
	Clientset kubernetes.Interface
	// Webhook says where the API server expects the webhook server when
	// ControlPlaneOptions.WebhookDirs was set: LocalServingHost, LocalServingPort,
	// LocalServingCertDir.
	Webhook *envtest.WebhookInstallOptions

	env *envtest.Environment
}

// ControlPlaneOptions tunes NewControlPlane.
type ControlPlaneOptions struct {
	// CRDDirs are directories of CustomResourceDefinition manifests to install before
	// returning. Empty means the repository's deploy/crds when it exists.
	CRDDirs []string
	// Client options such as the scheme; nil means client-go's types plus the
	// IPPool and CIDRPool API (v1alpha1.NewScheme).
	ClientOptions *client.Options
	// WebhookDirs are directories of (Validating|Mutating)WebhookConfiguration
	// manifests to install, pointed at a local webhook server whose host, port and
	// certificate directory ControlPlane.Webhook then holds.
	WebhookDirs []string
	// EtcdMaxRequestBytes is etcd's --max-request-bytes, the largest object it
	// stores; 0 keeps etcd's default (1.5 MiB). A small value lets a test reach the
	// limit with a few hundred nodes instead of 20,000.
	EtcdMaxRequestBytes int
	// FeatureGates is kube-apiserver's --feature-gates ("Name=false,..."); empty keeps
	// the version's defaults. A test of behaviour a gate switches on or off uses it.
	FeatureGates string
}

// NewControlPlane starts etcd and kube-apiserver from KUBEBUILDER_ASSETS and installs
// the CRDs. Stop must be called to end both processes.
func NewControlPlane(opts ControlPlaneOptions) (*ControlPlane, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, ErrNoAssets
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("%w (KUBEBUILDER_ASSETS=%s: %w)", ErrNoAssets, assets, err)
		}
	}
	crdDirs := opts.CRDDirs
	if len(crdDirs) == 0 {
		if dir := filepath.Join(RepoRoot(), "deploy", "crds"); isDir(dir) {
			crdDirs = []string{dir}
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crdDirs,
		ErrorIfCRDPathMissing:    len(opts.CRDDirs) > 0,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
		WebhookInstallOptions:    envtest.WebhookInstallOptions{Paths: opts.WebhookDirs},
	}
	if opts.EtcdMaxRequestBytes > 0 {
		etcd := &envtest.Etcd{}
		etcd.Configure().Set("max-request-bytes", strconv.Itoa(opts.EtcdMaxRequestBytes))
		env.ControlPlane.Etcd = etcd
	}
	if opts.FeatureGates != "" {
		apiserver := &envtest.APIServer{}
		apiserver.Configure().Set("feature-gates", opts.FeatureGates)
		env.ControlPlane.APIServer = apiserver
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	cp := &ControlPlane{Config: cfg, env: env}
	if len(opts.WebhookDirs) > 0 {
		cp.Webhook = &env.WebhookInstallOptions
	}
	var clientOpts client.Options
	if opts.ClientOptions != nil {
		clientOpts = *opts.ClientOptions
	} else if clientOpts.Scheme, err = v1alpha1.NewScheme(); err != nil {
		return nil, errors.Join(err, cp.Stop())
	} else if err = nodeipamv1.AddToScheme(clientOpts.Scheme); err != nil {
		return nil, errors.Join(err, cp.Stop())
	}
	if cp.Client, err = client.New(cfg, clientOpts); err != nil {
		return nil, errors.Join(fmt.Errorf("creating client: %w", err), cp.Stop())
	}
	if cp.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, errors.Join(fmt.Errorf("creating clientset: %w", err), cp.Stop())
	}
	return cp, nil
}

// StartControlPlane starts a control plane for one test and stops it when the test
// ends. It fails the test when the binaries are missing.
func StartControlPlane(tb testing.TB, opts ControlPlaneOptions) *ControlPlane {
	tb.Helper()
	cp, err := NewControlPlane(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			tb.Errorf("stopping control plane: %v", err)
		}
	})
	return cp
}

// Stop ends the apiserver and etcd and removes their data.
func (cp *ControlPlane) Stop() error {
	if err := cp.env.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver and etcd: %w", err)
	}
	return nil
}

// AddUser returns a client configuration for a user of the given name with no
// groups: what it may do is what RBAC objects the test creates grant it.
func (cp *ControlPlane) AddUser(name string) (*rest.Config, error) {
	user, err := cp.env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding user %s: %w", name, err)
	}
	return user.Config(), nil
}

// WriteKubeconfig writes a kubeconfig for a cluster-admin user of this control plane
// into dir and returns its path, for processes the test starts.
func (cp *ControlPlane) WriteKubeconfig(dir string) (string, error) {
	user, err := cp.env.AddUser(envtest.User{Name: "hwipam-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding a kubeconfig user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("rendering kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("writing kubeconfig: %w", err)
	}
	return path, nil
}

// RepoRoot is the root of this repository's work tree, found from this source file.
func RepoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
