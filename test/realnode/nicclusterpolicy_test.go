package realnode_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math/big"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/realnode"
)

// What network-operator fixes in its nv-ipam rendering: the namespace it runs in
// (its default), the daemon's state directory on the host (store and socket) and
// the plugin's log file.
const (
	operatorNS   = "nvidia-network-operator"
	hostStateDir = "/var/lib/cni/nv-ipam"
	hostCNILog   = "/var/log/nv-ipam-cni.log"
	// claimFile, in hostStateDir, names the run directory of the real node that
	// claimed the directory, so that a later run can tell its own leftovers
	// (a run that died before cleaning up) from a real nv-ipam's state.
	claimFile = ".hwipam-realnode-claim"
)

// legacyAlloc is one allocation in the nv-ipam store the node "ran" before.
type legacyAlloc struct {
	pool, containerID, ifName, ip, pod string
}

// The spec container runs the fixture testdata/nicclusterpolicy/nv-ipam.yaml, what
// NicClusterPolicy.spec.nvIpam renders, with the hwipam image, on a node whose
// /var/lib/cni/nv-ipam holds nv-ipam's JSON store: a takeover of a node that ran
// nv-ipam under the operator.
var _ = Describe("NicClusterPolicy's nv-ipam rendering with the hwipam image", Label("nicclusterpolicy"), Ordered, func() {
	var (
		legacy   []legacyAlloc
		info     infov1.NodeInfoServiceClient
		storeOld []byte // the nv-ipam store as written
	)

	BeforeAll(func(ctx SpecContext) {
		release, err := claimHostStateDir(hostStateDir, hostCNILog, node.Dir)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(release()).To(Succeed()) })

		// hwipam's base deployment leaves the node; it comes back at the end, so
		// the other specs still find it.
		Expect(node.Undeploy(ctx)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(node.Redeploy(ctx)).To(Succeed()) }, NodeTimeout(5*time.Minute))
		// What the base's daemon published goes, so that what appears below is
		// this daemon's doing.
		stripNodeMetadata(ctx)

		rendered := renderFixture()
		DeferCleanup(func(ctx SpecContext) {
			// Pools first, while the webhook still answers; then the rest, the
			// namespace last (kubectl deletes in the file's order, waiting for each).
			_, err := node.Kubectl(ctx, "-n", operatorNS, "delete", "ippools,cidrpools", "--all", "--wait=true")
			Expect(err).NotTo(HaveOccurred())
			_, err = node.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=true", "--timeout=3m", "-f", rendered)
			Expect(err).NotTo(HaveOccurred())
			_, err = node.Kubectl(ctx, "delete", "--ignore-not-found", "clusterrole,clusterrolebinding", "nv-ipam-node-hwipam")
			Expect(err).NotTo(HaveOccurred())
		}, NodeTimeout(5*time.Minute))

		// The pools live in the operator's namespace (--ippools-namespace=$(IPPOOLS_NAMESPACE)).
		_, err = node.Kubectl(ctx, "create", "namespace", operatorNS)
		Expect(err).NotTo(HaveOccurred())
		Expect(cl.Create(ctx, &v1alpha1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: "ncp-a", Namespace: operatorNS},
			Spec:       v1alpha1.IPPoolSpec{Subnet: "10.41.0.0/24", PerNodeBlockSize: 32},
		})).To(Succeed())
		Expect(cl.Create(ctx, &v1alpha1.CIDRPool{
			ObjectMeta: metav1.ObjectMeta{Name: "ncp-c", Namespace: operatorNS},
			Spec:       v1alpha1.CIDRPoolSpec{CIDR: "10.42.0.0/20", PerNodeNetworkPrefix: 24},
		})).To(Succeed())

		// The pods nv-ipam gave addresses to; they still run when hwipam takes over
		// (so the stale-allocation cleaner keeps them too).
		uids := map[string]string{}
		for _, name := range []string{"legacy-a", "legacy-b"} {
			createPlainPod(ctx, name)
			uids[name] = string(waitReady(ctx, name).UID)
		}
		legacy = []legacyAlloc{
			{"ncp-a", "c0ffee0a", "net1", "10.41.0.1", "legacy-a"},
			{"ncp-a", "c0ffee0b", "net1", "10.41.0.2", "legacy-b"},
			{"ncp-a", "c0ffee0b", "net2", "10.41.0.3", "legacy-b"},
			{"cidrpool/ncp-c", "c0ffee0a", "net2", "10.42.0.1", "legacy-a"},
		}
		storeOld = nvIPAMStore(legacy, uids)
		Expect(os.WriteFile(filepath.Join(hostStateDir, "store"), storeOld, 0o600)).To(Succeed())

		_, err = node.Kubectl(ctx, "apply", "-f", rendered)
		Expect(err).NotTo(HaveOccurred())
		for _, obj := range []string{"daemonset/nv-ipam-node", "deployment/nv-ipam-controller"} {
			_, err := node.Kubectl(ctx, "-n", operatorNS, "rollout", "status", obj, "--timeout=3m")
			Expect(err).NotTo(HaveOccurred(), "%s:\n%s", obj, operatorPods(ctx))
		}
		conn, err := grpc.NewClient("unix://"+filepath.Join(hostStateDir, "daemon.sock"),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(conn.Close)
		info = infov1.NewNodeInfoServiceClient(conn)
	}, NodeTimeout(10*time.Minute))

	// listAllocations lists the daemon's allocations as "pool ip pod" lines.
	listAllocations := func(ctx context.Context) []string { return allocationsFrom(ctx, info) }

	It("runs the operator's rendering as it is: daemon without hostNetwork, two controllers, webhook", func(ctx SpecContext) {
		ds := daemonPod(ctx)
		Expect(ds.Spec.HostNetwork).To(BeFalse())
		Expect(ds.Spec.ServiceAccountName).To(Equal("nv-ipam-node"))
		Expect(*ds.Spec.Containers[0].SecurityContext.Privileged).To(BeTrue())
		// The plugin the daemon installed names the operator's socket for the host.
		conf, err := os.ReadFile(filepath.Join(node.CNIConfDir, "nv-ipam.d", "nv-ipam.conf"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(conf)).To(ContainSubstring("unix:///var/lib/cni/nv-ipam/daemon.sock"))
		pods, err := node.Clientset.CoreV1().Pods(operatorNS).List(ctx, metav1.ListOptions{LabelSelector: "name=nv-ipam-controller"})
		Expect(err).NotTo(HaveOccurred())
		Expect(pods.Items).To(HaveLen(2))
		// The operator's controller ClusterRole covers every call hwipam's controller makes.
		for _, p := range pods.Items {
			logs, err := node.Kubectl(ctx, "-n", operatorNS, "logs", p.Name)
			Expect(err).NotTo(HaveOccurred())
			Expect(logs).NotTo(ContainSubstring("forbidden"), p.Name)
		}
		// The webhook answers with nv-ipam's field paths. (Retried while the
		// Service's endpoints catch up with the ready pods; a pool that got in
		// fails the next try with AlreadyExists, and the spec.)
		Eventually(ctx, func() error {
			return cl.Create(ctx, &v1alpha1.IPPool{
				ObjectMeta: metav1.ObjectMeta{Name: "bad-gateway", Namespace: operatorNS},
				Spec:       v1alpha1.IPPoolSpec{Subnet: "10.43.0.0/24", PerNodeBlockSize: 16, Gateway: "10.44.0.1"},
			})
		}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(
			MatchError(And(ContainSubstring("denied the request"), ContainSubstring("spec.gateway"))))
	})

	It("keeps every allocation of nv-ipam's store, and the store as a backup", func(ctx SpecContext) {
		var want []string
		for _, a := range legacy {
			want = append(want, fmt.Sprintf("%s %s %s/%s", a.pool, a.ip, ns, a.pod))
		}
		Expect(listAllocations(ctx)).To(ContainElements(want))
		// The same, as an admin checks it (docs/migration.md): ipamctl in the daemon's pod.
		out, err := node.Kubectl(ctx, "-n", operatorNS, "exec", "daemonset/nv-ipam-node", "--",
			"/ipamctl", "allocations", "-o", "json")
		Expect(err).NotTo(HaveOccurred())
		var listed struct {
			Allocations []struct{ Pool, IP, PodNamespace, PodName string } `json:"allocations"`
		}
		Expect(json.Unmarshal([]byte(out), &listed)).To(Succeed(), out)
		var got []string
		for _, a := range listed.Allocations {
			got = append(got, fmt.Sprintf("%s %s %s/%s", a.Pool, a.IP, a.PodNamespace, a.PodName))
		}
		Expect(got).To(ContainElements(want))
		out, err = node.Kubectl(ctx, "-n", operatorNS, "exec", "daemonset/nv-ipam-node", "--", "/ipamctl", "pools")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(And(ContainSubstring("ncp-a"), ContainSubstring("cidrpool/ncp-c")))
		backup, err := os.ReadFile(filepath.Join(hostStateDir, "store.nv-ipam.json"))
		Expect(err).NotTo(HaveOccurred())
		Expect(backup).To(Equal(storeOld))
		// The store itself is hwipam's now.
		cur, err := os.ReadFile(filepath.Join(hostStateDir, "store"))
		Expect(err).NotTo(HaveOccurred())
		Expect(bytes.HasPrefix(bytes.TrimSpace(cur), []byte("{"))).To(BeFalse())
	})

	It("gives a pod an address from a pool in the operator's namespace, none nv-ipam held, and DEL releases it", func(ctx SpecContext) {
		createNAD(ctx, "ncp-a", macvlanConfig("ncp-a", "ncp-a", `"poolType": "ippool"`))
		createPod(ctx, "ncp-pod", "ncp-a")
		ip := networkIPs(waitReady(ctx, "ncp-pod"))["ncp-a"]
		start, end := operatorBlock(ctx, "ncp-a")
		Expect(ip.Compare(start) >= 0 && ip.Compare(end) <= 0).To(BeTrue(), "%s outside the node's block %s-%s", ip, start, end)
		for _, a := range legacy {
			Expect(ip.String()).NotTo(Equal(a.ip), "handed out an address nv-ipam's store held")
		}
		Expect(listAllocations(ctx)).To(ContainElement(fmt.Sprintf("ncp-a %s %s/ncp-pod", ip, ns)))
		deletePod(ctx, "ncp-pod")
		Expect(listAllocations(ctx)).NotTo(ContainElement(ContainSubstring("/ncp-pod")))
		// The plugin on the host logs where the operator's nv-ipam.conf says.
		log, err := os.ReadFile(hostCNILog)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).To(ContainSubstring("ncp-a"))
	})

	It("without write RBAC on nodes, warns once per feature and says so in its metrics", func(ctx SpecContext) {
		warnings := []string{"cannot publish the NIC labels", "cannot annotate this node"}
		Eventually(ctx, func(g Gomega) {
			logs := daemonLogs(ctx)
			for _, w := range warnings {
				g.Expect(strings.Count(logs, w)).To(Equal(1), w)
			}
		}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Succeed())
		// Several more annotation attempts (every 10 s) and NIC scans (SIGHUP asks
		// for one at once): still one warning each.
		for range 2 {
			sighupDaemon(ctx)
			time.Sleep(12 * time.Second)
		}
		logs := daemonLogs(ctx)
		for _, w := range warnings {
			Expect(strings.Count(logs, w)).To(Equal(1), "%q logged more than once:\n%s", w, logs)
		}
		Expect(logs).To(ContainSubstring("Grant get and patch on nodes"))
		// Nothing else the daemon does is refused under the operator's RBAC.
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "forbidden") {
				Expect(line).To(Or(ContainSubstring(warnings[0]), ContainSubstring(warnings[1])))
			}
		}
		metrics := scrapeDaemon(ctx)
		Expect(metrics).To(ContainSubstring(`hwipam_node_feature_forbidden{feature="nic-labels"} 1`))
		Expect(metrics).To(ContainSubstring(`hwipam_node_feature_forbidden{feature="node-annotations"} 1`))
		Expect(metrics).To(ContainSubstring(`hwipam_node_feature_forbidden{feature="stale-cleanup"} 0`))
		Expect(metrics).To(ContainSubstring(`hwipam_node_nics 10`))
		n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(n.Labels).NotTo(HaveKey(HavePrefix("nic.hwipam.io/")))
		Expect(n.Annotations).NotTo(HaveKey(v1alpha1.PoolsInUseAnnotation))
	})

	It("with the RBAC of docs/nicclusterpolicy.md, labels and annotates its node", func(ctx SpecContext) {
		docs := docYAML(filepath.Join(harness.RepoRoot(), "docs", "nicclusterpolicy.md"))
		applied, policies := 0, 0
		for i, doc := range docs {
			if checkNicClusterPolicy(doc) {
				policies++
				continue
			}
			f := filepath.Join(node.Dir, fmt.Sprintf("nicclusterpolicy-doc-%d.yaml", i))
			Expect(os.WriteFile(f, []byte(doc), 0o644)).To(Succeed())
			_, err := node.Kubectl(ctx, "apply", "-f", f)
			Expect(err).NotTo(HaveOccurred())
			applied++
		}
		Expect(applied).To(BeNumerically(">", 0), "docs/nicclusterpolicy.md has no RBAC YAML")
		Expect(policies).To(Equal(1), "docs/nicclusterpolicy.md shows the NicClusterPolicy once")
		// The labels come at the next NIC scan (--nic-rescan-interval, 1m); SIGHUP
		// asks for one at once. The annotations come within --pools-in-use-interval.
		sighupDaemon(ctx)
		Eventually(ctx, func(g Gomega) {
			n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			// Without hostNetwork: the RoCE port keeps its netdev's name (from its
			// RDMA GID table), the InfiniBand ports are keyed by RDMA device, and
			// the node says its netdevs are hidden.
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/mlx5_0", "ib"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/mlx5_0.speed", "400000"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/enp225s0f0np0", "eth"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/netdevs", "hidden"))
			g.Expect(n.Labels).NotTo(HaveKey("nic.hwipam.io/ibp24s0"))
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/present", "true"))
			g.Expect(n.Annotations).To(HaveKeyWithValue(v1alpha1.PoolsInUseAnnotation, "cidrpool/ncp-c,ncp-a"))
			g.Expect(n.Annotations).To(HaveKey(v1alpha1.HeldAnnotation))
		}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Succeed())
		Eventually(ctx, scrapeDaemon).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(And(
			ContainSubstring(`hwipam_node_feature_forbidden{feature="nic-labels"} 0`),
			ContainSubstring(`hwipam_node_feature_forbidden{feature="node-annotations"} 0`)))
		Expect(daemonLogs(ctx)).To(ContainSubstring("published the NIC labels"))
	})

	It("with deploy/policy applied as docs/nicclusterpolicy.md says, confines nv-ipam-node to its node's nic.hwipam.io/ labels and pool annotations", func(ctx SpecContext) {
		_, err := node.Kubectl(ctx, "apply", "-k", filepath.Join(harness.RepoRoot(), "deploy", "policy"))
		Expect(err).NotTo(HaveOccurred())
		// deploy/base, which comes back at the end, brings them again.
		DeferCleanup(func(ctx SpecContext) {
			_, err := node.Kubectl(ctx, "delete", "--ignore-not-found", "-k", filepath.Join(harness.RepoRoot(), "deploy", "policy"))
			Expect(err).NotTo(HaveOccurred())
		})
		// A token of the operator's service account bound to the daemon's pod, as the
		// kubelet gives the pod: it carries the pod's node.
		pod := daemonPod(ctx)
		tok, err := node.Clientset.CoreV1().ServiceAccounts(operatorNS).CreateToken(ctx, "nv-ipam-node", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{
				Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		cfg := rest.AnonymousClientConfig(node.Config)
		cfg.BearerToken = tok.Status.Token
		asDaemon, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		// Dry runs: admission runs, nothing changes on the node.
		patch := func(ctx context.Context, p string) error {
			_, err := asDaemon.CoreV1().Nodes().Patch(ctx, node.NodeName, types.MergePatchType, []byte(p),
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
		Eventually(ctx, func() error { return patch(ctx, `{"metadata":{"labels":{"team":"x"}}}`) }).
			WithTimeout(30 * time.Second).WithPolling(time.Second).
			Should(MatchError(And(ContainSubstring("hwipam-node-own-node"),
				ContainSubstring("may change only the labels under nic.hwipam.io/ on its Node, not team"))))
		Expect(patch(ctx, `{"metadata":{"annotations":{"ops.example.com/owner":"me"}}}`)).To(
			MatchError(ContainSubstring("may change only the annotations ipam.hwipam.io/pools-in-use and")))
		Expect(patch(ctx, `{"spec":{"unschedulable":true}}`)).To(MatchError(ContainSubstring("may not change a Node's spec")))
		Expect(patch(ctx, `{"metadata":{"labels":{"nic.hwipam.io/dry-run":"x"},"annotations":{"`+
			v1alpha1.PoolsInUseAnnotation+`":"ncp-a"}}}`)).To(Succeed())
		// The daemon itself, under the policy with its kubelet-issued token: with a
		// label and an annotation of its taken away, a new pod writes both back
		// (it writes only what differs), and nothing is refused.
		_, err = node.Kubectl(ctx, "label", "node", node.NodeName, "nic.hwipam.io/present-")
		Expect(err).NotTo(HaveOccurred())
		_, err = node.Kubectl(ctx, "annotate", "node", node.NodeName, v1alpha1.PoolsInUseAnnotation+"-")
		Expect(err).NotTo(HaveOccurred())
		_, err = node.Kubectl(ctx, "-n", operatorNS, "delete", "pod", pod.Name, "--wait=true")
		Expect(err).NotTo(HaveOccurred())
		_, err = node.Kubectl(ctx, "-n", operatorNS, "rollout", "status", "daemonset/nv-ipam-node", "--timeout=2m")
		Expect(err).NotTo(HaveOccurred())
		Eventually(ctx, func(g Gomega) {
			n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(n.Labels).To(HaveKeyWithValue("nic.hwipam.io/present", "true"))
			g.Expect(n.Annotations).To(HaveKeyWithValue(v1alpha1.PoolsInUseAnnotation, "cidrpool/ncp-c,ncp-a"))
		}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Succeed())
		logs := daemonLogs(ctx)
		Expect(logs).To(ContainSubstring("published the NIC labels"))
		Expect(logs).NotTo(ContainSubstring("forbidden"), harness.LastLines(logs, 20))
	})
})

// claimHostStateDir makes dir (the operator fixes /var/lib/cni/nv-ipam) this run's,
// and returns what gives it back: it removes dir, and dir's parent (when empty) and
// logFile if they did not exist before. It refuses a dir that holds anything a test run did
// not put there (a real nv-ipam's or hwipam's state), and one that another node,
// still running, has claimed.
func claimHostStateDir(dir, logFile, runDir string) (func() error, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case len(entries) > 0:
		owner, err := os.ReadFile(filepath.Join(dir, claimFile))
		if err != nil {
			return nil, fmt.Errorf("refusing to run: %s holds files this test did not create (a node's IPAM state?); "+
				"move it away to run the nicclusterpolicy specs", dir)
		}
		if st, err := realnode.LoadState(string(owner)); err == nil && st.Running() {
			return nil, fmt.Errorf("refusing to run: %s is in use by the real node in %s", dir, owner)
		}
		// Left by a run that died before cleaning up.
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
	}
	parent := filepath.Dir(dir)
	_, err = os.Stat(parent)
	hadParent := err == nil
	_, err = os.Stat(logFile)
	hadLog := err == nil
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, claimFile), []byte(runDir), 0o600); err != nil {
		return nil, err
	}
	return func() error {
		errs := []error{os.RemoveAll(dir)}
		if !hadParent {
			// The runtime's CNI cache (/var/lib/cni/results) may have moved in since.
			if err := os.Remove(parent); err != nil && !errors.Is(err, syscall.ENOTEMPTY) {
				errs = append(errs, err)
			}
		}
		if !hadLog {
			if err := os.Remove(logFile); !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}, nil
}

// renderFixture renders testdata/nicclusterpolicy/nv-ipam.yaml for this node into
// the run directory and returns the file.
func renderFixture() string {
	tmpl, err := template.New("nv-ipam.yaml").Option("missingkey=error").
		ParseFiles(filepath.Join("testdata", "nicclusterpolicy", "nv-ipam.yaml"))
	Expect(err).NotTo(HaveOccurred())
	cert, key := webhookCert("nv-ipam-webhook-service." + operatorNS + ".svc")
	tree, err := fakesysfs.DGXH100(filepath.Join(node.Dir, "sysfs-nicclusterpolicy"))
	Expect(err).NotTo(HaveOccurred())
	// The daemon runs without hostNetwork: its sysfs shows none of the host's
	// netdevs, as a pod's does.
	Expect(tree.PodView()).To(Succeed())
	var out bytes.Buffer
	Expect(tmpl.Execute(&out, map[string]string{
		// The suite's image (BeforeSuite builds it as hwipam:e2e).
		"Image":     node.Registry + "/hwipam:e2e",
		"CNIBinDir": node.CNIBinDir,
		"CNINetDir": node.CNIConfDir,
		"CABundle":  base64.StdEncoding.EncodeToString(cert),
		"TLSCert":   base64.StdEncoding.EncodeToString(cert),
		"TLSKey":    base64.StdEncoding.EncodeToString(key),
		"SysfsRoot": tree.Root,
	})).To(Succeed())
	f := filepath.Join(node.Dir, "nicclusterpolicy.yaml")
	Expect(os.WriteFile(f, out.Bytes(), 0o600)).To(Succeed())
	return f
}

// webhookCert makes a self-signed serving certificate for host (what cert-manager's
// self-signed Issuer gives the operator's Certificate), PEM.
func webhookCert(host string) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host, host + ".cluster.local"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// nvIPAMStore writes allocs as nv-ipam v0.4's node daemon keeps them in its store
// file: JSON, pools by store key, entries by "<containerID>_<ifName>", and a
// checksum, FNV-32a of the encoding with the checksum 0.
func nvIPAMStore(allocs []legacyAlloc, uids map[string]string) []byte {
	type metadata struct {
		CreateTime         string `json:"create_time"`
		PodUUID            string `json:"pod_uuid"`
		PodName            string `json:"pod_name"`
		PodNamespace       string `json:"pod_namespace"`
		DeviceID           string `json:"device_id"`
		PoolConfigSnapshot string `json:"pool_config_snapshot"`
	}
	type entry struct {
		ContainerID   string   `json:"container_id"`
		InterfaceName string   `json:"interface_name"`
		IPAddress     string   `json:"ip_address"`
		Metadata      metadata `json:"metadata"`
	}
	type pool struct {
		Name           string            `json:"name"`
		Entries        map[string]*entry `json:"entries"`
		LastPoolConfig string            `json:"last_pool_config"`
		LastReservedIP string            `json:"last_reserved_ip"`
	}
	root := struct {
		Version  int              `json:"version"`
		Checksum uint32           `json:"checksum"`
		Pools    map[string]*pool `json:"pools"`
	}{Version: 1, Pools: map[string]*pool{}}
	for _, a := range allocs {
		p := root.Pools[a.pool]
		if p == nil {
			p = &pool{Name: strings.TrimPrefix(a.pool, "cidrpool/"), Entries: map[string]*entry{}}
			root.Pools[a.pool] = p
		}
		p.Entries[a.containerID+"_"+a.ifName] = &entry{ContainerID: a.containerID, InterfaceName: a.ifName, IPAddress: a.ip,
			Metadata: metadata{CreateTime: "2026-01-05T10:00:00Z", PodUUID: uids[a.pod], PodName: a.pod, PodNamespace: ns}}
		p.LastReservedIP = a.ip
	}
	data, err := json.Marshal(root)
	Expect(err).NotTo(HaveOccurred())
	h := fnv.New32a()
	h.Write(data)
	root.Checksum = h.Sum32()
	data, err = json.Marshal(root)
	Expect(err).NotTo(HaveOccurred())
	return data
}

// stripNodeMetadata removes the nic.hwipam.io/ labels and the pool annotations
// from the node.
func stripNodeMetadata(ctx context.Context) {
	n, err := node.Clientset.CoreV1().Nodes().Get(ctx, node.NodeName, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	var labels []string
	for k := range n.Labels {
		if strings.HasPrefix(k, "nic.hwipam.io/") {
			labels = append(labels, k+"-")
		}
	}
	if len(labels) > 0 {
		_, err = node.Kubectl(ctx, append([]string{"label", "node", node.NodeName}, labels...)...)
		Expect(err).NotTo(HaveOccurred())
	}
	_, err = node.Kubectl(ctx, "annotate", "node", node.NodeName, v1alpha1.PoolsInUseAnnotation+"-", v1alpha1.HeldAnnotation+"-")
	Expect(err).NotTo(HaveOccurred())
}

// createPlainPod starts a busybox pod on the pod network only and removes it when
// the enclosing node ends.
func createPlainPod(ctx context.Context, name string) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "app", Image: node.BusyboxImage(), Command: []string{"sleep", "1000000"}}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	_, err := node.Clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) { deletePod(ctx, name) })
}

func operatorPods(ctx context.Context) string {
	out, _ := node.Kubectl(ctx, "-n", operatorNS, "get", "pods", "-o", "wide")
	events, _ := node.Kubectl(ctx, "-n", operatorNS, "get", "events", "--sort-by=.lastTimestamp")
	return out + "\n" + harness.LastLines(events, 20)
}

func daemonPod(ctx context.Context) *corev1.Pod { return livePod(ctx, operatorNS, "name=nv-ipam-node") }

func daemonLogs(ctx context.Context) string {
	logs, err := node.Kubectl(ctx, "-n", operatorNS, "logs", "daemonset/nv-ipam-node")
	Expect(err).NotTo(HaveOccurred())
	return logs
}

// sighupDaemon asks the daemon for a NIC rescan.
func sighupDaemon(ctx context.Context) {
	id := strings.TrimPrefix(daemonPod(ctx).Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := execCtr(ctx, "-n", "k8s.io", "tasks", "kill", "-s", "SIGHUP", id)
	Expect(err).NotTo(HaveOccurred(), out)
}

// scrapeDaemon reads the daemon's metrics, on its pod's address (no hostNetwork)
// and the default --metrics-bind-address.
func scrapeDaemon(ctx context.Context) string {
	return httpGet(ctx, "http://"+daemonPod(ctx).Status.PodIP+":8080/metrics")
}

// httpGet returns the body of a GET.
func httpGet(ctx context.Context, url string) string {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	Expect(err).NotTo(HaveOccurred())
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return string(body)
}

// operatorBlock returns the node's block of an IPPool in the operator's namespace.
func operatorBlock(ctx context.Context, pool string) (netip.Addr, netip.Addr) {
	var start, end netip.Addr
	Eventually(ctx, func(g Gomega) {
		var p v1alpha1.IPPool
		g.Expect(cl.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: pool}, &p)).To(Succeed())
		g.Expect(p.Status.Allocations).To(ContainElement(HaveField("NodeName", node.NodeName)))
		for _, a := range p.Status.Allocations {
			if a.NodeName == node.NodeName {
				start, end = netip.MustParseAddr(a.StartIP), netip.MustParseAddr(a.EndIP)
			}
		}
	}).WithTimeout(30 * time.Second).Should(Succeed())
	return start, end
}

// docYAML returns the YAML documents of every ```yaml block of a Markdown file.
func docYAML(path string) []string {
	md, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	var docs []string
	var block []string
	in := false
	for _, line := range strings.Split(string(md), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```yaml":
			in, block = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			for _, d := range strings.Split(strings.Join(block, "\n"), "\n---\n") {
				if strings.TrimSpace(d) != "" {
					docs = append(docs, d)
				}
			}
		case in:
			block = append(block, line)
		}
	}
	Expect(in).To(BeFalse(), "%s: a ```yaml block is not closed", path)
	return docs
}

// checkNicClusterPolicy reports whether doc is a NicClusterPolicy, and if so checks
// that its nvIpam section names the hwipam image the way the operator composes it
// (<repository>/<image>:<version>, as make image-push names it) and enables the webhook, as the fixture renders.
// The cluster has no NicClusterPolicy CRD (no network-operator runs here), so it is
// read, not applied.
func checkNicClusterPolicy(doc string) bool {
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			NvIpam *struct {
				Repository    string `json:"repository"`
				Image         string `json:"image"`
				Version       string `json:"version"`
				EnableWebhook bool   `json:"enableWebhook"`
			} `json:"nvIpam"`
		} `json:"spec"`
	}
	Expect(yaml.Unmarshal([]byte(doc), &obj)).To(Succeed())
	if obj.Kind != "NicClusterPolicy" {
		return false
	}
	Expect(obj.APIVersion).To(Equal("mellanox.com/v1alpha1"))
	Expect(obj.Spec.NvIpam).NotTo(BeNil())
	// make image-push pushes <REGISTRY>/hwipam:<IMAGE_TAG>.
	Expect(obj.Spec.NvIpam.Image).To(Equal("hwipam"))
	Expect(obj.Spec.NvIpam.Repository).NotTo(BeEmpty())
	Expect(obj.Spec.NvIpam.Version).NotTo(BeEmpty())
	Expect(obj.Spec.NvIpam.EnableWebhook).To(BeTrue())
	return true
}
