package realnode_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/test/harness"
)

// The names the webhook Component gives its objects, and nv-ipam's webhook paths.
const (
	webhookConfig  = "hwipam-validating-webhook"
	webhookService = "hwipam-webhook"
	webhookSecret  = "hwipam-webhook-cert"
	webhookCertDir = "/tmp/k8s-webhook-server/serving-certs"
	ippoolPath     = "/validate-nv-ipam-nvidia-com-v1alpha1-ippool"
	cidrpoolPath   = "/validate-nv-ipam-nvidia-com-v1alpha1-cidrpool"
)

// certManagerVersion is the cert-manager release whose CRDs the certmanager overlay
// is dry-run against (fetched through the Go module proxy at test time).
const certManagerVersion = "v1.16.2"

// rendering is one kustomization rendered by the node's kubectl, by kind and name.
type rendering map[string]map[string][]byte

func renderOverlay(ctx context.Context, overlay string) rendering {
	out, err := node.Kubectl(ctx, "kustomize", filepath.Join(harness.RepoRoot(), overlay))
	Expect(err).NotTo(HaveOccurred())
	return parseRendering(out)
}

func parseRendering(out string) rendering {
	r := rendering{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var u unstructured.Unstructured
		Expect(yaml.Unmarshal([]byte(doc), &u.Object)).To(Succeed())
		if u.GetKind() == "" {
			continue
		}
		if r[u.GetKind()] == nil {
			r[u.GetKind()] = map[string][]byte{}
		}
		Expect(r[u.GetKind()]).NotTo(HaveKey(u.GetName()), "%s %s rendered twice", u.GetKind(), u.GetName())
		r[u.GetKind()][u.GetName()] = []byte(doc)
	}
	return r
}

// get decodes the rendered object of a kind and name into obj.
func (r rendering) get(kind, name string, obj any) {
	doc, ok := r[kind][name]
	ExpectWithOffset(1, ok).To(BeTrue(), "the rendering has no %s %s", kind, name)
	ExpectWithOffset(1, yaml.Unmarshal(doc, obj)).To(Succeed())
}

func (r rendering) controller() (*appsv1.Deployment, *corev1.Container) {
	var d appsv1.Deployment
	r.get("Deployment", "hwipam-controller", &d)
	ExpectWithOffset(1, d.Spec.Template.Spec.Containers).To(HaveLen(1))
	return &d, &d.Spec.Template.Spec.Containers[0]
}

func (r rendering) node() (*appsv1.DaemonSet, *corev1.Container) {
	var ds appsv1.DaemonSet
	r.get("DaemonSet", "hwipam-node", &ds)
	ExpectWithOffset(1, ds.Spec.Template.Spec.Containers).To(HaveLen(1))
	return &ds, &ds.Spec.Template.Spec.Containers[0]
}

// expectWebhook checks what the webhook Component must bring to a rendering.
func expectWebhook(r rendering) {
	var vwc admissionv1.ValidatingWebhookConfiguration
	r.get("ValidatingWebhookConfiguration", webhookConfig, &vwc)
	paths := map[string]string{}
	for _, w := range vwc.Webhooks {
		Expect(w.FailurePolicy).To(HaveValue(Equal(admissionv1.Fail)), w.Name)
		Expect(w.SideEffects).To(HaveValue(Equal(admissionv1.SideEffectClassNone)), w.Name)
		Expect(w.ClientConfig.Service).NotTo(BeNil(), w.Name)
		Expect(w.ClientConfig.Service.Name).To(Equal(webhookService), w.Name)
		Expect(w.ClientConfig.Service.Namespace).To(Equal("kube-system"), w.Name)
		Expect(w.Rules).To(HaveLen(1), w.Name)
		Expect(w.Rules[0].APIGroups).To(Equal([]string{v1alpha1.GroupVersion.Group}), w.Name)
		Expect(w.Rules[0].Operations).To(ConsistOf(admissionv1.Create, admissionv1.Update), w.Name)
		Expect(w.Rules[0].Resources).To(HaveLen(1), w.Name)
		paths[w.Rules[0].Resources[0]] = *w.ClientConfig.Service.Path
	}
	Expect(paths).To(Equal(map[string]string{"ippools": ippoolPath, "cidrpools": cidrpoolPath}))

	var svc corev1.Service
	r.get("Service", webhookService, &svc)
	Expect(svc.Namespace).To(Equal("kube-system"))
	Expect(svc.Spec.Ports).To(ConsistOf(And(HaveField("Port", BeEquivalentTo(443)),
		HaveField("TargetPort.StrVal", "webhook"))))

	d, ctr := r.controller()
	Expect(svc.Spec.Selector).To(Equal(d.Spec.Template.Labels))
	Expect(ctr.Args).To(ContainElement("--webhook=true"))
	Expect(ctr.Ports).To(ContainElement(And(HaveField("Name", "webhook"), HaveField("ContainerPort", BeEquivalentTo(9443)))))
	Expect(ctr.VolumeMounts).To(ContainElement(And(HaveField("Name", "webhook-cert"),
		HaveField("MountPath", webhookCertDir), HaveField("ReadOnly", true))))
	Expect(d.Spec.Template.Spec.Volumes).To(ContainElement(And(HaveField("Name", "webhook-cert"),
		HaveField("Secret.SecretName", webhookSecret))))
}

var _ = Describe("deploy/ kustomizations rendered by kubectl", Label("overlays"), func() {
	It("renders deploy/base without webhooks, and no-webhook as the base", func(ctx SpecContext) {
		base := renderOverlay(ctx, "deploy/base")
		Expect(base).NotTo(HaveKey("ValidatingWebhookConfiguration"))
		_, ctr := base.controller()
		Expect(ctr.Args).NotTo(ContainElement(HavePrefix("--webhook")))
		_, nodeCtr := base.node()
		Expect(nodeCtr.Args).To(ContainElement("--cni-bin-dir=/opt/cni/bin"))
		Expect(renderOverlay(ctx, "deploy/overlays/no-webhook")).To(Equal(base))
	})

	It("renders the certmanager overlay: the webhooks, an Issuer and a Certificate for the Service, CA injection", func(ctx SpecContext) {
		r := renderOverlay(ctx, "deploy/overlays/certmanager")
		expectWebhook(r)
		var vwc admissionv1.ValidatingWebhookConfiguration
		r.get("ValidatingWebhookConfiguration", webhookConfig, &vwc)
		Expect(vwc.Annotations).To(HaveKeyWithValue("cert-manager.io/inject-ca-from", "kube-system/"+webhookSecret))
		var cert struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Spec     struct {
				SecretName string   `json:"secretName"`
				DNSNames   []string `json:"dnsNames"`
				IssuerRef  struct{ Kind, Name string }
			} `json:"spec"`
		}
		r.get("Certificate", webhookSecret, &cert)
		Expect(cert.Metadata.Namespace).To(Equal("kube-system"))
		Expect(cert.Spec.SecretName).To(Equal(webhookSecret))
		Expect(cert.Spec.DNSNames).To(ContainElement(webhookService + ".kube-system.svc"))
		Expect(cert.Spec.IssuerRef.Kind).To(Equal("Issuer"))
		Expect(r["Issuer"]).To(HaveKey(cert.Spec.IssuerRef.Name))
	})

	It("renders the openshift overlay: service-CA certificate, /var/lib/cni/bin, the privileged SCC for ipam-node only", func(ctx SpecContext) {
		r := renderOverlay(ctx, "deploy/overlays/openshift")
		expectWebhook(r)
		var vwc admissionv1.ValidatingWebhookConfiguration
		r.get("ValidatingWebhookConfiguration", webhookConfig, &vwc)
		Expect(vwc.Annotations).To(HaveKeyWithValue("service.beta.openshift.io/inject-cabundle", "true"))
		var svc corev1.Service
		r.get("Service", webhookService, &svc)
		Expect(svc.Annotations).To(HaveKeyWithValue("service.beta.openshift.io/serving-cert-secret-name", webhookSecret))

		ds, ctr := r.node()
		Expect(ctr.Args).To(ContainElement("--cni-bin-dir=/var/lib/cni/bin"))
		Expect(ctr.Args).NotTo(ContainElement("--cni-bin-dir=/opt/cni/bin"))
		Expect(ctr.VolumeMounts).To(ContainElement(And(HaveField("Name", "cni-bin"), HaveField("MountPath", "/var/lib/cni/bin"))))
		Expect(ds.Spec.Template.Spec.Volumes).To(ContainElement(And(HaveField("Name", "cni-bin"),
			HaveField("HostPath.Path", "/var/lib/cni/bin"))))

		var role rbacv1.Role
		r.get("Role", "hwipam-node-scc", &role)
		Expect(role.Rules).To(Equal([]rbacv1.PolicyRule{{APIGroups: []string{"security.openshift.io"},
			Resources: []string{"securitycontextconstraints"}, ResourceNames: []string{"privileged"}, Verbs: []string{"use"}}}))
		var rb rbacv1.RoleBinding
		r.get("RoleBinding", "hwipam-node-scc", &rb)
		Expect(rb.RoleRef.Name).To(Equal(role.Name))
		Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: "kube-system"}}))

		d, _ := r.controller()
		Expect(d.Spec.Template.Spec.SecurityContext.RunAsUser).To(BeNil())
		Expect(d.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
	})

	It("passes a server-side dry run of the openshift overlay", func(ctx SpecContext) {
		// Everything in it is known to a plain apiserver (the SCC is granted through a
		// Role); what only OpenShift does — the service CA writing the Secret and the
		// caBundle, SCC admission — is not exercised here.
		out, err := node.Kubectl(ctx, "apply", "--dry-run=server", "-k", filepath.Join(harness.RepoRoot(), "deploy", "overlays", "openshift"))
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainSubstring("role.rbac.authorization.k8s.io/hwipam-node-scc created (server dry run)"))
		Expect(out).To(ContainSubstring("validatingwebhookconfiguration.admissionregistration.k8s.io/" + webhookConfig + " created (server dry run)"))
	})
})

// swapDeployment takes deploy/base off the node, deploys overlay the same way (image,
// flags, host paths) and brings deploy/base back when the container's specs are done.
func swapDeployment(ctx context.Context, overlay string) {
	opts, err := node.BaseOptions()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) {
		Expect(node.Undeploy(ctx)).To(Succeed())
		Expect(node.Redeploy(ctx)).To(Succeed())
	}, NodeTimeout(8*time.Minute))
	Expect(node.Undeploy(ctx)).To(Succeed())
	opts.Overlay = overlay
	Expect(node.Deploy(ctx, harness.RepoRoot(), opts)).To(Succeed())
}

var _ = Describe("the no-webhook overlay on the node", Label("overlays"), Ordered, func() {
	var before []string
	BeforeAll(func(ctx SpecContext) {
		// A pod from the base deployment: its address must survive the swap (the store
		// is on the host), as in an upgrade.
		createPod(ctx, "nw-before", "e2e-a")
		waitReady(ctx, "nw-before")
		before = allocations(ctx)
		Expect(before).To(ContainElement(ContainSubstring("/nw-before")))
		swapDeployment(ctx, "deploy/overlays/no-webhook")
	}, NodeTimeout(8*time.Minute))

	It("runs without a webhook configuration", func(ctx SpecContext) {
		_, err := node.Clientset.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookConfig, metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
	})

	It("keeps the allocations the base deployment made", func(ctx SpecContext) {
		Expect(allocations(ctx)).To(Equal(before))
	})

	It("gives pods with a Multus network an address from the node's block", func(ctx SpecContext) {
		createPod(ctx, "nw-after", "e2e-a", "e2e-b")
		ips := networkIPs(waitReady(ctx, "nw-after"))
		Expect(ips).To(HaveLen(2))
		for _, pool := range []string{"e2e-a", "e2e-b"} {
			start, end := block(ctx, pool)
			Expect(ips[pool].Compare(start) >= 0 && ips[pool].Compare(end) <= 0).To(BeTrue(),
				"%s's address %s is outside the node's block %s-%s", pool, ips[pool], start, end)
		}
		Expect(allocations(ctx)).To(ContainElements(
			fmt.Sprintf("e2e-a %s %s/nw-after", ips["e2e-a"], ns), fmt.Sprintf("e2e-b %s %s/nw-after", ips["e2e-b"], ns)))
	})
})

// servingCert makes a CA and a serving certificate for the webhook Service's DNS
// names, as cert-manager or OpenShift's service CA would: the CA's PEM, and the
// kubernetes.io/tls Secret the controller mounts.
func servingCert() ([]byte, *corev1.Secret) {
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		Expect(err).NotTo(HaveOccurred())
		return k
	}
	now := time.Now()
	caKey := key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hwipam-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	Expect(err).NotTo(HaveOccurred())
	ca, err = x509.ParseCertificate(caDER)
	Expect(err).NotTo(HaveOccurred())
	leafKey := key()
	svc := webhookService + ".kube-system.svc"
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: svc},
		DNSNames: []string{svc, svc + ".cluster.local"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	Expect(err).NotTo(HaveOccurred())
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: webhookSecret, Namespace: "kube-system"},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
			"ca.crt":                caPEM,
		},
	}
}

// moduleDir downloads a module (path@version) through the Go module proxy and
// returns its directory in the module cache.
func moduleDir(ctx context.Context, module string) string {
	GinkgoHelper()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Dir = harness.RepoRoot()
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "go mod download %s: %s", module, out)
	var mod struct{ Dir, Error string }
	Expect(json.Unmarshal(out, &mod)).To(Succeed())
	Expect(mod.Error).To(BeEmpty())
	return mod.Dir
}

// certManagerCRDs writes cert-manager's CRDs (from its module at certManagerVersion)
// into dir, rendered from their Helm templates: the only template parts are labels and
// conditionals in comments.
func certManagerCRDs(ctx context.Context, dir string) []string {
	modDir := moduleDir(ctx, "github.com/cert-manager/cert-manager@"+certManagerVersion)
	values := strings.NewReplacer(`{{ template "cert-manager.name" . }}`, "cert-manager", `{{ .Release.Name }}`, "cert-manager")
	comment := regexp.MustCompile(`(?m)^\s*#.*$`)
	var files []string
	for _, kind := range []string{"certificaterequests", "certificates", "challenges", "clusterissuers", "issuers", "orders"} {
		data, err := os.ReadFile(filepath.Join(modDir, "deploy", "crds", "crd-"+kind+".yaml"))
		Expect(err).NotTo(HaveOccurred())
		rendered := comment.ReplaceAllString(values.Replace(string(data)), "")
		Expect(rendered).NotTo(ContainSubstring("{{"), "crd-%s.yaml has template parts this test does not render", kind)
		file := filepath.Join(dir, kind+".yaml")
		Expect(os.WriteFile(file, []byte(rendered), 0o644)).To(Succeed())
		files = append(files, file)
	}
	return files
}

// webhookSpecs deploys a webhook overlay with a certificate the test makes, in the
// Secret and caBundle that cert-manager or OpenShift's service CA would fill in, and
// checks that the running controller refuses invalid pools with nv-ipam's field paths.
// It returns the time the deployment began.
func webhookSpecs(overlay string) *time.Time {
	var deployed time.Time
	var caPEM []byte
	BeforeAll(func(ctx SpecContext) {
		deployed = time.Now()
		var secret *corev1.Secret
		caPEM, secret = servingCert()
		secrets := node.Clientset.CoreV1().Secrets("kube-system")
		_, err := secrets.Create(ctx, secret, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			Expect(secrets.Delete(ctx, webhookSecret, metav1.DeleteOptions{})).To(Succeed())
		})
		swapDeployment(ctx, overlay)
		// The caBundle, set with the command docs/install.md gives.
		ca := base64.StdEncoding.EncodeToString(caPEM)
		_, err = node.Kubectl(ctx, "patch", "validatingwebhookconfiguration", webhookConfig, "--type=json", "-p", fmt.Sprintf(`[
  {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": %q},
  {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": %q}]`, ca, ca))
		Expect(err).NotTo(HaveOccurred())
	}, NodeTimeout(8*time.Minute))

	refused := func(ctx context.Context, obj *unstructuredPool, webhook string, paths ...string) {
		GinkgoHelper()
		Eventually(ctx, func(g Gomega) {
			err := cl.Create(ctx, obj.object())
			g.Expect(err).To(HaveOccurred())
			// The API server's words for a webhook's refusal; anything else (a TLS
			// error, a refused connection) means the webhook was not reached.
			g.Expect(err.Error()).To(ContainSubstring(fmt.Sprintf("admission webhook %q denied the request", webhook)))
			for _, p := range paths {
				g.Expect(err.Error()).To(ContainSubstring(p + ": "))
			}
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Succeed())
	}

	It("serves the webhooks from the controller with the mounted certificate", func(ctx SpecContext) {
		pods, err := node.Clientset.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=hwipam-controller"})
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).NotTo(BeEmpty())
		for _, p := range pods.Items {
			Expect(p.Spec.Containers[0].Args).To(ContainElement("--webhook=true"))
		}
		eps, err := node.Kubectl(ctx, "-n", "kube-system", "get", "endpointslices", "-l", "kubernetes.io/service-name="+webhookService,
			"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(eps)).To(ContainElement(pods.Items[0].Status.PodIP))
		// The controller presents the certificate of the Secret, for the Service's name.
		roots := x509.NewCertPool()
		Expect(roots.AppendCertsFromPEM(caPEM)).To(BeTrue())
		dialer := &tls.Dialer{Config: &tls.Config{RootCAs: roots, ServerName: webhookService + ".kube-system.svc", MinVersion: tls.VersionTLS12}}
		conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(pods.Items[0].Status.PodIP, "9443"))
		Expect(err).NotTo(HaveOccurred())
		Expect(conn.Close()).To(Succeed())
	})

	It("refuses invalid IPPools with nv-ipam's field paths", func(ctx SpecContext) {
		refused(ctx, ippool("wh-bad-subnet", map[string]any{"subnet": "10.78.0.0/33", "perNodeBlockSize": 4}),
			"validate-ippool.nv-ipam.nvidia.com", "spec.subnet")
		refused(ctx, ippool("wh-bad-block", map[string]any{"subnet": "10.78.0.0/28", "perNodeBlockSize": 64, "gateway": "10.99.0.1"}),
			"validate-ippool.nv-ipam.nvidia.com", "spec.perNodeBlockSize", "spec.gateway")
	})

	It("refuses invalid CIDRPools with nv-ipam's field paths", func(ctx SpecContext) {
		refused(ctx, cidrpool("wh-bad-cidr", map[string]any{"cidr": "10.79.0.0/40", "perNodeNetworkPrefix": 24}),
			"validate-cidrpool.nv-ipam.nvidia.com", "spec.cidr")
		refused(ctx, cidrpool("wh-bad-prefix", map[string]any{"cidr": "10.79.0.0/16", "perNodeNetworkPrefix": 8}),
			"validate-cidrpool.nv-ipam.nvidia.com", "spec.perNodeNetworkPrefix")
		refused(ctx, cidrpool("wh-bad-gw", map[string]any{"cidr": "10.79.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 300}),
			"validate-cidrpool.nv-ipam.nvidia.com", "spec.gatewayIndex")
	})

	It("accepts valid pools, and refuses one overlapping a pool of its namespace", func(ctx SpecContext) {
		for _, p := range []*unstructuredPool{
			ippool("wh-good", map[string]any{"subnet": "10.251.0.0/24", "perNodeBlockSize": 16}),
			cidrpool("wh-good", map[string]any{"cidr": "10.252.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 1}),
		} {
			Expect(cl.Create(ctx, p.object())).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(cl.Delete(ctx, p.object())).To(Succeed()) })
		}
		refused(ctx, ippool("wh-overlap", map[string]any{"subnet": "10.251.0.128/25", "perNodeBlockSize": 16}),
			"validate-ippool.nv-ipam.nvidia.com", "spec.subnet")
	})
	return &deployed
}

// unstructuredPool is a pool as a user writes it (so that values the typed client
// would refuse to encode still reach the API server).
type unstructuredPool struct {
	kind, name string
	spec       map[string]any
}

func ippool(name string, spec map[string]any) *unstructuredPool {
	return &unstructuredPool{kind: "IPPool", name: name, spec: spec}
}

func cidrpool(name string, spec map[string]any) *unstructuredPool {
	return &unstructuredPool{kind: "CIDRPool", name: name, spec: spec}
}

func (p *unstructuredPool) object() *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": p.spec}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(p.kind)
	u.SetNamespace("kube-system")
	u.SetName(p.name)
	return u
}

var _ = Describe("the certmanager overlay", Label("overlays"), Ordered, func() {
	BeforeAll(func(ctx SpecContext) {
		// cert-manager's CRDs stay installed: they cost nothing, and the deployment of
		// this overlay below creates its Issuer and Certificate (nothing acts on them).
		for _, f := range certManagerCRDs(ctx, GinkgoT().TempDir()) {
			_, err := node.Kubectl(ctx, "apply", "--server-side", "-f", f)
			Expect(err).NotTo(HaveOccurred())
		}
		_, err := node.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
			"crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
		Expect(err).NotTo(HaveOccurred())
	}, NodeTimeout(5*time.Minute))

	It("passes a server-side dry run against cert-manager's CRDs "+certManagerVersion, func(ctx SpecContext) {
		out, err := node.Kubectl(ctx, "apply", "--dry-run=server", "-k", filepath.Join(harness.RepoRoot(), "deploy", "overlays", "certmanager"))
		Expect(err).NotTo(HaveOccurred())
		for _, obj := range []string{"certificate.cert-manager.io/" + webhookSecret, "issuer.cert-manager.io/hwipam-selfsigned",
			"validatingwebhookconfiguration.admissionregistration.k8s.io/" + webhookConfig, "service/" + webhookService} {
			Expect(out).To(MatchRegexp(`(?m)^%s (created|configured|unchanged) \(server dry run\)$`, regexp.QuoteMeta(obj)))
		}
	})

	It("is refused by the server when a Certificate field is wrong (the dry run validates against the CRDs)", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(dir, "cert.yaml"), []byte(`apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: hwipam-bad, namespace: kube-system}
spec: {secretName: 7, issuerRef: {name: x}}
`), 0o644)).To(Succeed())
		_, err := node.Kubectl(ctx, "apply", "--dry-run=server", "-f", filepath.Join(dir, "cert.yaml"))
		Expect(err).To(MatchError(ContainSubstring("spec.secretName")))
	})

	Context("deployed, with the Secret and caBundle cert-manager would write", Ordered, func() {
		webhookSpecs("deploy/overlays/certmanager")
	})
})

var _ = Describe("the openshift overlay deployed on a plain node", Label("overlays"), Ordered, func() {
	// The Secret and caBundle are the test's, standing in for the service CA; the
	// node's CNI bin dir (mounted where OpenShift's is) stands in for /var/lib/cni/bin.
	deployed := webhookSpecs("deploy/overlays/openshift")

	It("installs the plugin through the /var/lib/cni/bin mount", func(ctx SpecContext) {
		Expect(ipamNodePod(ctx).Spec.Containers[0].Args).To(ContainElement("--cni-bin-dir=/var/lib/cni/bin"))
		// ipam-node writes a new file at start: the one this deployment's daemon wrote
		// through its /var/lib/cni/bin mount.
		st, err := os.Stat(filepath.Join(node.CNIBinDir, "nv-ipam"))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.ModTime()).To(BeTemporally(">", *deployed))
		createPod(ctx, "os-pod", "e2e-a")
		Expect(networkIPs(waitReady(ctx, "os-pod"))).To(HaveKey("e2e-a"))
	})
})

// yamlBlocks returns the fenced yaml blocks of a Markdown file.
func yamlBlocks(path string) []string {
	data, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(data), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

var _ = Describe("docs/install.md", Label("overlays"), func() {
	It("has kustomizations that render and pass a server-side dry run beside a checkout of hwipam", func(ctx SpecContext) {
		blocks := yamlBlocks(filepath.Join(harness.RepoRoot(), "docs", "install.md"))
		Expect(blocks).To(HaveLen(2))
		dir := GinkgoT().TempDir()
		// The examples name the checkout ../hwipam.
		Expect(os.Symlink(harness.RepoRoot(), filepath.Join(dir, "hwipam"))).To(Succeed())
		var renderings []rendering
		for i, b := range blocks {
			site := filepath.Join(dir, fmt.Sprintf("site%d", i))
			Expect(os.Mkdir(site, 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(site, "kustomization.yaml"), []byte(b), 0o644)).To(Succeed())
			out, err := node.Kubectl(ctx, "kustomize", site)
			Expect(err).NotTo(HaveOccurred(), "block %d:\n%s", i, b)
			renderings = append(renderings, parseRendering(out))
			out, err = node.Kubectl(ctx, "apply", "--dry-run=server", "-k", site)
			Expect(err).NotTo(HaveOccurred(), "block %d:\n%s", i, b)
			Expect(out).To(ContainSubstring("daemonset.apps/hwipam-node"))
		}
		// Your own certificate: the base with the webhook component.
		expectWebhook(renderings[0])
		// Your own image: in both workloads.
		_, ctr := renderings[1].controller()
		Expect(ctr.Image).To(Equal("registry.example.com/hwipam/hwipam:v0.1.0"))
		_, ctr = renderings[1].node()
		Expect(ctr.Image).To(Equal("registry.example.com/hwipam/hwipam:v0.1.0"))
	})
})
