package privilege

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

const (
	draOverlay = "deploy/overlays/dra"
	// draPolicies is how many admission policies the overlay renders: the base's
	// two, and its own for ResourceSlices, for claim status and against shared claims.
	draPolicies = 6
)

// What deploy/dra/policy.yaml says when it refuses a ResourceSlice.
const (
	msgSliceNoNode = "may write a ResourceSlice only with a service-account token bound to a pod on that node"
	msgSliceNode   = "may write only ResourceSlices with spec.nodeName "
	msgSliceDriver = "may write only ResourceSlices of driver nic.hwipam.io, not "
	msgSlicePool   = "may write only ResourceSlices of pool "
)

// TestDRAOverlayRenders renders deploy/overlays/dra with the real kubectl: the base
// plus the DeviceClass, the DRA RBAC and policy, and a DaemonSet that differs from the
// base's only by the driver's flags, mounts, capabilities and update strategy.
func TestDRAOverlayRenders(t *testing.T) {
	base, dra := render(t, "deploy/base"), render(t, draOverlay)
	key := func(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }
	baseObjs := map[string]*unstructured.Unstructured{}
	for _, o := range base {
		if strings.Contains(o.GetAPIVersion(), "resource.k8s.io") {
			t.Errorf("deploy/base renders %s", key(o))
		}
		baseObjs[key(o)] = o
	}
	var added []string
	var ds *unstructured.Unstructured
	for _, o := range dra {
		b, ok := baseObjs[key(o)]
		switch {
		case !ok:
			added = append(added, key(o))
		case o.GetKind() == "DaemonSet":
			ds = o
		case !equalObjects(b, o):
			t.Errorf("%s differs from the base's", key(o))
		}
		delete(baseObjs, key(o))
	}
	if len(baseObjs) != 0 {
		t.Errorf("the overlay lacks %v of the base", baseObjs)
	}
	slices.Sort(added)
	if want := []string{"ClusterRole/hwipam-node-dra", "ClusterRoleBinding/hwipam-node-dra", "DeviceClass/nic.hwipam.io",
		"ValidatingAdmissionPolicy/hwipam-nic-claims-not-shared",
		"ValidatingAdmissionPolicy/hwipam-node-own-claim-status", "ValidatingAdmissionPolicy/hwipam-node-own-resourceslices",
		"ValidatingAdmissionPolicyBinding/hwipam-nic-claims-not-shared",
		"ValidatingAdmissionPolicyBinding/hwipam-node-own-claim-status",
		"ValidatingAdmissionPolicyBinding/hwipam-node-own-resourceslices"}; !slices.Equal(added, want) {
		t.Errorf("the overlay adds %v, want %v", added, want)
	}
	for _, o := range dra {
		if o.GetKind() != "DeviceClass" {
			continue
		}
		var dc resourceapi.DeviceClass
		fromUnstructured(t, o, &dc)
		if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil ||
			dc.Spec.Selectors[0].CEL.Expression != `device.driver == "nic.hwipam.io"` {
			t.Errorf("DeviceClass selectors %+v", dc.Spec.Selectors)
		}
	}
	if ds == nil {
		t.Fatal("the overlay renders no DaemonSet")
	}

	// The DaemonSet: the base's, with additions only.
	var got, was appsv1.DaemonSet
	fromUnstructured(t, ds, &got)
	fromUnstructured(t, findObject(t, base, "DaemonSet", ds.GetName()), &was)
	ctr, baseCtr := got.Spec.Template.Spec.Containers[0], was.Spec.Template.Spec.Containers[0]
	if want := append(slices.Clone(baseCtr.Args), "--dra=true", "--dra-kubelet-dir=/var/lib/kubelet",
		"--dra-nri-socket=/var/run/nri/nri.sock", "--dra-cdi-dir=/var/run/cdi"); !slices.Equal(ctr.Args, want) {
		t.Errorf("args %q, want the base's and the four DRA flags", ctr.Args)
	}
	if caps := ctr.SecurityContext.Capabilities; !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(caps.Add, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}) {
		t.Errorf("capabilities %+v, want drop ALL, add NET_ADMIN and SYS_ADMIN", caps)
	}
	hostToContainer := corev1.MountPropagationHostToContainer
	wantMounts := map[string]corev1.VolumeMount{
		"kubelet-plugins-registry": {Name: "kubelet-plugins-registry", MountPath: "/var/lib/kubelet/plugins_registry"},
		"kubelet-plugin-dir":       {Name: "kubelet-plugin-dir", MountPath: "/var/lib/kubelet/plugins/nic.hwipam.io"},
		"nri":                      {Name: "nri", MountPath: "/var/run/nri"},
		"cdi":                      {Name: "cdi", MountPath: "/var/run/cdi"},
		"netns":                    {Name: "netns", MountPath: "/var/run/netns", MountPropagation: &hostToContainer, ReadOnly: true},
	}
	if mustJSON(t, ctr.VolumeMounts[:len(baseCtr.VolumeMounts)]) != mustJSON(t, baseCtr.VolumeMounts) {
		t.Errorf("the base's mounts changed: %+v", ctr.VolumeMounts)
	}
	for _, m := range ctr.VolumeMounts[len(baseCtr.VolumeMounts):] {
		w, ok := wantMounts[m.Name]
		if !ok || m.MountPath != w.MountPath || m.ReadOnly != w.ReadOnly ||
			(m.MountPropagation == nil) != (w.MountPropagation == nil) ||
			(m.MountPropagation != nil && *m.MountPropagation != *w.MountPropagation) {
			t.Errorf("mount %+v, want %+v", m, w)
		}
		delete(wantMounts, m.Name)
		// The kubelet and containerd open these paths on the host: same path inside.
		for _, v := range got.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && (v.HostPath == nil || v.HostPath.Path != m.MountPath) {
				t.Errorf("volume %s is not the host's %s", v.Name, m.MountPath)
			}
		}
	}
	if len(wantMounts) != 0 {
		t.Errorf("mounts missing: %v", wantMounts)
	}
	if b1, b2 := mustJSON(t, got.Spec.Template.Spec.Volumes[:len(was.Spec.Template.Spec.Volumes)]),
		mustJSON(t, was.Spec.Template.Spec.Volumes); b1 != b2 {
		t.Errorf("the base's volumes changed:\n%s\n%s", b1, b2)
	}
	if ru := got.Spec.UpdateStrategy.RollingUpdate; got.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 {
		t.Errorf("update strategy %+v: the kubelet plugin without RollingUpdate(podUID) needs maxSurge 0", got.Spec.UpdateStrategy)
	}
	// Nothing else: the rest of the pod template is the base's.
	got.Spec.Template.Spec.Containers[0].Args, got.Spec.Template.Spec.Containers[0].VolumeMounts = baseCtr.Args, baseCtr.VolumeMounts
	got.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add = nil
	got.Spec.Template.Spec.Volumes = was.Spec.Template.Spec.Volumes
	got.Spec.UpdateStrategy = was.Spec.UpdateStrategy
	if b1, b2 := mustJSON(t, got), mustJSON(t, was); b1 != b2 {
		t.Errorf("the DaemonSet differs from the base's beyond the DRA additions:\n%s\n%s", b1, b2)
	}
}

// TestDRARights: with deploy/'s rights and deploy/overlays/dra's, the node daemon's
// service account has exactly the base's rights plus the DRA driver's (kubectl auth
// can-i, each and --list), and not the rights next to them.
func TestDRARights(t *testing.T) {
	e := startEnvOf(t, draOverlay, draPolicies)
	for _, r := range append(slices.Clone(rights[nodeSA].need), draRights...) {
		t.Run("can "+r.String(), func(t *testing.T) {
			if !canI(t, e.kubeconfig, nodeSA, r) {
				t.Errorf("%s cannot %s", nodeSA, r)
			}
		})
	}
	mustNot := append(slices.Clone(rights[nodeSA].mustNot),
		right{verb: "get", resource: slicesR}, right{verb: "patch", resource: slicesR},
		right{verb: "deletecollection", resource: slicesR},
		right{verb: "create", resource: claimsR, namespace: "default"}, right{verb: "update", resource: claimsR, namespace: "default"},
		right{verb: "patch", resource: claimsR, namespace: "default"}, right{verb: "delete", resource: claimsR, namespace: "default"},
		right{verb: "patch", resource: claimsR, subresource: "status", namespace: "default"},
		right{verb: "patch", resource: claimsR, subresource: "binding", namespace: "default"},
		right{verb: "update", resource: claimsR, subresource: "binding", namespace: "default"},
		right{verb: "arbitrary-node:update", resource: driverR, subresource: "driver", namespace: "default"},
		right{verb: "arbitrary-node:patch", resource: driverR, subresource: "driver", namespace: "default"},
		right{verb: "associated-node:patch", resource: driverR, subresource: "driver", namespace: "default"},
		right{verb: "associated-node:update", resource: claimsR + "/gpu.nvidia.com", subresource: "driver", namespace: "default"},
		right{verb: "create", resource: "deviceclasses.resource.k8s.io"},
		right{verb: "create", resource: "devicetaintrules.resource.k8s.io"},
		right{verb: "create", resource: "resourceclaimtemplates.resource.k8s.io", namespace: "default"},
	)
	for _, r := range mustNot {
		t.Run("cannot "+r.String(), func(t *testing.T) {
			if canI(t, e.kubeconfig, nodeSA, r) {
				t.Errorf("%s can %s", nodeSA, r)
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		got := listRights(t, e.kubeconfig, nodeSA, "default")
		none := listRights(t, e.kubeconfig, "no-bindings", "default")
		var extra []string
		for _, r := range got {
			if !slices.Contains(none, r) {
				extra = append(extra, r)
			}
		}
		var want []string
		for _, r := range rights[nodeSA].need {
			if r.namespace == "" {
				want = append(want, r.verb+" "+r.resource)
			}
		}
		want = append(want, "list "+slicesR, "watch "+slicesR, "create "+slicesR, "update "+slicesR, "delete "+slicesR,
			"get "+claimsR, "list "+claimsR, "watch "+claimsR, "update "+claimsR+"/status",
			"associated-node:update "+claimsR+"/driver:nic.hwipam.io")
		slices.Sort(want)
		if !slices.Equal(extra, want) {
			t.Errorf("kubectl auth can-i --list -n default for %s, beyond a service account without bindings:\n got  %q\n want %q",
				nodeSA, extra, want)
		}
	})
}

// TestDRANodeConfinedToItsNode: with only deploy/'s and deploy/overlays/dra's rights
// and tokens bound to daemon pods on node-a and node-b, as the kubelet issues them,
// node-a's daemon publishes, updates and deletes its own node's ResourceSlices of
// driver nic.hwipam.io through the kubelet plugin library's controller, and writes
// its devices' status (nicdra.ApplyClaimStatus) on a claim allocated on node-a;
// every other slice and claim write is refused.
func TestDRANodeConfinedToItsNode(t *testing.T) {
	e := startEnvOf(t, draOverlay, draPolicies)
	ctx := t.Context()
	for _, n := range []string{"node-a", "node-b"} {
		e.createNode(t, n)
	}
	tokA, tokB := e.token(t, e.daemonPod(t, "node-a")), e.token(t, e.daemonPod(t, "node-b"))
	asA, asB, asNone := e.as(tokA), e.as(tokB), e.as(e.token(t, nil))
	csA := clientset(t, asA)

	// The DeviceClass of the overlay is accepted by the API server (its CEL compiles).
	for _, o := range render(t, draOverlay) {
		if o.GetKind() == "DeviceClass" {
			apply(t, e.c, o)
		}
	}

	// In force once another node's slice is refused by the policy (a dry run).
	eventually(t, 30*time.Second, "the ResourceSlice policy in force", func() error {
		_, err := csA.ResourceV1().ResourceSlices().Create(ctx, slice("x", "node-b", nicdra.DriverName, "node-b"),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hwipam-node-own-resourceslices") {
			return nil
		}
		return fmt.Errorf("another node's slice is not refused by the policy yet: %w", err)
	})

	t.Run("the library's ResourceSlice controller on its own node", func(t *testing.T) {
		var errs []string
		delay := 100 * time.Millisecond
		dev := resourceapi.Device{Name: "pci-0000-18-00-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			nicdra.AttrRail: {StringValue: new("ibp24s0")}}}
		res := nicdra.Resources("node-a", []resourceapi.Device{dev})
		ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{DriverName: nicdra.DriverName, KubeClient: csA,
			Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: "node-a"}, Resources: &res, SyncDelay: &delay,
			ErrorHandler: func(_ context.Context, err error, msg string) { errs = append(errs, msg+": "+err.Error()) }})
		if err != nil {
			t.Fatal(err)
		}
		defer ctrl.Stop()
		waitSlices := func(what string, cond func([]resourceapi.ResourceSlice) error) {
			t.Helper()
			eventually(t, 30*time.Second, what, func() error {
				list, err := e.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
				if err != nil {
					return err
				}
				if err := cond(list.Items); err != nil {
					return fmt.Errorf("%w (controller errors: %v)", err, errs)
				}
				return nil
			})
		}
		waitSlices("node-a's slice", func(s []resourceapi.ResourceSlice) error {
			if len(s) != 1 || ptrValue(s[0].Spec.NodeName) != "node-a" || len(s[0].Spec.Devices) != 1 ||
				len(s[0].OwnerReferences) != 1 || s[0].OwnerReferences[0].Name != "node-a" {
				return fmt.Errorf("slices %+v", s)
			}
			return nil
		})
		dev.Attributes[nicdra.AttrRail] = resourceapi.DeviceAttribute{StringValue: new("ibp75s0")}
		res = nicdra.Resources("node-a", []resourceapi.Device{dev})
		ctrl.Update(&res)
		waitSlices("node-a's slice updated", func(s []resourceapi.ResourceSlice) error {
			if len(s) != 1 || len(s[0].Spec.Devices) != 1 || ptrValue(s[0].Spec.Devices[0].Attributes[nicdra.AttrRail].StringValue) != "ibp75s0" {
				return fmt.Errorf("slices %+v", s)
			}
			return nil
		})
		ctrl.Update(&resourceslice.DriverResources{})
		waitSlices("node-a's slice deleted", func(s []resourceapi.ResourceSlice) error {
			if len(s) != 0 {
				return fmt.Errorf("slices %+v", s)
			}
			return nil
		})
		// The library counts a write after the API server answered it: the
		// list may show the slice gone a moment before the count says so.
		eventually(t, 5*time.Second, "the controller's counts", func() error {
			if st := ctrl.GetStats(); st.NumCreates != 1 || st.NumUpdates != 1 || st.NumDeletes != 1 {
				return fmt.Errorf("controller stats %+v, want one create, one update, one delete", st)
			}
			return nil
		})
		if len(errs) != 0 {
			t.Errorf("the controller was refused: %v", errs)
		}
	})

	// Slices of node-b and of another driver, made by the admin, for the update and
	// delete cases.
	var foreign []*resourceapi.ResourceSlice
	for _, s := range []*resourceapi.ResourceSlice{slice("b", "node-b", nicdra.DriverName, "node-b"),
		slice("gpu", "node-a", "gpu.nvidia.com", "node-a")} {
		s, err := e.cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		foreign = append(foreign, s)
	}
	sliceB, sliceGPU := foreign[0], foreign[1]
	allNodes := slice("all", "", nicdra.DriverName, "node-a")
	allNodes.Spec.NodeName, allNodes.Spec.AllNodes = nil, new(true)
	for _, tc := range []struct {
		name string
		do   func(cs kubernetes.Interface) error
		cfg  *rest.Config
		want string
	}{
		{"create for another node", createSlice(slice("x", "node-b", nicdra.DriverName, "node-b")), asA,
			"on node node-a " + msgSliceNode + "node-a, not node-b"},
		{"node-b's token for node-a", createSlice(slice("x", "node-a", nicdra.DriverName, "node-a")), asB,
			"on node node-b " + msgSliceNode + "node-b, not node-a"},
		{"create for another driver", createSlice(slice("x", "node-a", "gpu.nvidia.com", "node-a")), asA,
			msgSliceDriver + "gpu.nvidia.com"},
		{"create in another node's pool", createSlice(slice("x", "node-a", nicdra.DriverName, "node-b")), asA,
			msgSlicePool + "node-a, not node-b"},
		{"create for all nodes", createSlice(allNodes), asA, msgSliceNode + "node-a, not a slice without spec.nodeName"},
		{"a token bound to no pod", createSlice(slice("x", "node-a", nicdra.DriverName, "node-a")), asNone, msgSliceNoNode},
		{"update another node's slice", updateSlice(sliceB), asA, msgSliceNode + "node-a, not node-b"},
		{"update another driver's slice", updateSlice(sliceGPU), asA, msgSliceDriver + "gpu.nvidia.com"},
		{"delete another node's slice", deleteSlice(sliceB.Name), asA, msgSliceNode + "node-a, not node-b"},
		{"delete another driver's slice", deleteSlice(sliceGPU.Name), asA, msgSliceDriver + "gpu.nvidia.com"},
		{"patch a slice", func(cs kubernetes.Interface) error {
			_, err := cs.ResourceV1().ResourceSlices().Patch(ctx, sliceB.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}, asA, `cannot patch resource "resourceslices"`},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantForbidden(t, tc.do(clientset(t, tc.cfg)), tc.want)
		})
	}

	checkClaimStatusConfined(t, e, asA, asB, asNone, true)
	t.Run("node-b's slice unchanged", func(t *testing.T) {
		if s, err := e.cs.ResourceV1().ResourceSlices().Get(ctx, sliceB.Name, metav1.GetOptions{}); err != nil ||
			ptrValue(s.Spec.NodeName) != "node-b" || s.ResourceVersion != sliceB.ResourceVersion {
			t.Errorf("node-b's slice changed: %v %+v", err, s)
		}
	})
}

// TestDRAClaimStatusWithoutGranularAuthorization: on an API server that does not
// check claim status writes itself (Kubernetes 1.34 and 1.35, or
// DRAResourceClaimGranularStatusAuthorization off), the overlay's policy
// hwipam-node-own-claim-status refuses the same writes.
func TestDRAClaimStatusWithoutGranularAuthorization(t *testing.T) {
	e := startEnvWith(t, draOverlay, draPolicies, "DRAResourceClaimGranularStatusAuthorization=false")
	for _, n := range []string{"node-a", "node-b"} {
		e.createNode(t, n)
	}
	asA, asB, asNone := e.as(e.token(t, e.daemonPod(t, "node-a"))), e.as(e.token(t, e.daemonPod(t, "node-b"))), e.as(e.token(t, nil))
	checkClaimStatusConfined(t, e, asA, asB, asNone, false)
}

// checkClaimStatusConfined makes claims allocated on node-a and node-b and checks
// that node-a's daemon (asA) writes its devices' status only on its node's claims,
// and nothing else of any claim. granular says whether the API server checks claim
// status writes itself (resourceclaims/binding and /driver), which then refuses
// before the policy does, in its own words.
func checkClaimStatusConfined(t *testing.T, e *env, asA, asB, asNone *rest.Config, granular bool) {
	t.Helper()
	ctx := t.Context()
	csA := clientset(t, asA)
	// Claims: one allocated on node-a, one on node-b (the scheduler's allocation: a
	// node-local device's nodeSelector names the node by metadata.name), each with a
	// GPU driver's device beside ours, and one not allocated yet.
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	byName := func(node string) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
	}
	byLabel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}}
	e.claim(t, "on-a", byName("node-a"))
	e.claim(t, "on-b", byName("node-b"))
	e.claim(t, "on-a-by-label", byLabel)
	e.claim(t, "unallocated", nil)
	dev := nicdra.PreparedDevice{Request: "nic", Device: "pci-0000-18-00-0", PCIAddress: "0000:18:00.0", HostNetdev: "ibp24s0",
		InterfaceName: "net1", Pools: []string{"rail0"}, PoolType: "ippool", Rail: "ibp24s0", Addresses: []string{"10.24.0.2/16"}}
	// The claim's UID, as the driver recorded it when it prepared the claim.
	uidOf := func(name string) types.UID {
		c, err := e.cs.ResourceV1().ResourceClaims("ml").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c.UID
	}

	t.Run("its devices' status on a claim allocated on its node", func(t *testing.T) {
		if err := nicdra.ApplyClaimStatus(ctx, csA, "ml", "on-a", uidOf("on-a"), "node-a", []nicdra.PreparedDevice{dev}); err != nil {
			t.Fatal(err)
		}
		if got := e.statusDrivers(t, "on-a"); !slices.Equal(got, []string{"gpu.nvidia.com", nicdra.DriverName}) {
			t.Errorf("status.devices drivers %v, want the GPU driver's and ours", got)
		}
		// And taking them away again (an apply of none, as on unprepare).
		if err := nicdra.ApplyClaimStatus(ctx, csA, "ml", "on-a", uidOf("on-a"), "node-a", nil); err != nil {
			t.Fatal(err)
		}
		if got := e.statusDrivers(t, "on-a"); !slices.Equal(got, []string{"gpu.nvidia.com"}) {
			t.Errorf("status.devices drivers %v, want the GPU driver's only", got)
		}
	})
	onB := dev
	onB.Device = "pci-0000-40-00-0"
	// The words of the refusals: the API server's own, or the policy's.
	notAssociated := func(_, _ string) string {
		return `changing status.devices requires resource="resourceclaims/driver", verb="[arbitrary-node:update]"`
	}
	noNode := notAssociated("", "")
	otherDriver := `changing status.devices requires resource="resourceclaims/driver", verb="[associated-node:update arbitrary-node:update]"`
	binding := `changing status.allocation or status.reservedFor requires resource="resourceclaims/binding"`
	if !granular {
		notAssociated = func(node, allocated string) string {
			return "hwipam-node on node " + node + " may write the status of claims allocated on that node only, not of one allocated " + allocated
		}
		noNode = "this token carries no node name"
		otherDriver = "may change only the status.devices entries of driver nic.hwipam.io"
		binding = "may not change a claim's status.allocation or status.reservedFor"
		eventually(t, 30*time.Second, "the claim status policy in force", func() error {
			err := updateClaimStatus(ctx, e.cs, csA, "on-b", func(c *resourceapi.ResourceClaim) {
				c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: "u1"})
			}, metav1.DryRunAll)
			if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hwipam-node-own-claim-status") {
				return nil
			}
			return fmt.Errorf("a reservedFor write is not refused by the policy yet: %w", err)
		})
	}
	for _, tc := range []struct {
		name string
		do   func(cs kubernetes.Interface) error
		cfg  *rest.Config
		want string
	}{
		{"its devices' status on a claim allocated on node-b", func(cs kubernetes.Interface) error {
			return nicdra.ApplyClaimStatus(ctx, cs, "ml", "on-b", uidOf("on-b"), "node-b", []nicdra.PreparedDevice{onB})
		}, asA, notAssociated("node-a", "on node-b")},
		{"node-b's token on node-a's claim", func(cs kubernetes.Interface) error {
			return nicdra.ApplyClaimStatus(ctx, cs, "ml", "on-a", uidOf("on-a"), "node-a", []nicdra.PreparedDevice{dev})
		}, asB, notAssociated("node-b", "on node-a")},
		{"a token bound to no pod", func(cs kubernetes.Interface) error {
			return nicdra.ApplyClaimStatus(ctx, cs, "ml", "on-a", uidOf("on-a"), "node-a", []nicdra.PreparedDevice{dev})
		}, asNone, noNode},
		// The API server knows a claim's node only from a nodeSelector naming it by
		// metadata.name (what the scheduler writes for a node-local device).
		{"a claim whose allocation selects node-a by label", func(cs kubernetes.Interface) error {
			return nicdra.ApplyClaimStatus(ctx, cs, "ml", "on-a-by-label", uidOf("on-a-by-label"), "node-a", []nicdra.PreparedDevice{dev})
		}, asA, notAssociated("node-a", "without naming a node by metadata.name")},
		{"another driver's entry on a claim of its node", func(cs kubernetes.Interface) error {
			return updateClaimStatus(ctx, e.cs, cs, "on-a", func(c *resourceapi.ResourceClaim) {
				for i := range c.Status.Devices {
					c.Status.Devices[i].Data = &runtime.RawExtension{Raw: []byte(`{"uuid":"forged"}`)}
				}
			}, "")
		}, asA, otherDriver},
		{"status.allocation", func(cs kubernetes.Interface) error {
			return updateClaimStatus(ctx, e.cs, cs, "unallocated", func(c *resourceapi.ResourceClaim) {
				c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "nic", Driver: nicdra.DriverName, Pool: "node-a", Device: "pci-0000-18-00-0"}}}}
			}, "")
		}, asA, binding},
		{"status.reservedFor", func(cs kubernetes.Interface) error {
			return updateClaimStatus(ctx, e.cs, cs, "on-a", func(c *resourceapi.ResourceClaim) {
				c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: "u1"})
			}, "")
		}, asA, binding},
		{"the claim's spec or metadata", func(cs kubernetes.Interface) error {
			return mergePatchClaim(ctx, cs, "on-a", `{"metadata":{"labels":{"x":"y"}}}`, "")
		}, asA, `cannot patch resource "resourceclaims"`},
		{"a patch of the claim's status", func(cs kubernetes.Interface) error {
			return mergePatchClaim(ctx, cs, "on-a", `{"status":{"devices":[]}}`, "status")
		}, asA, `cannot patch resource "resourceclaims/status"`},
		{"a server-side apply of the claim's status", func(cs kubernetes.Interface) error {
			claim := resourcev1ac.ResourceClaim("on-a", "ml").WithStatus(resourcev1ac.ResourceClaimStatus().WithDevices(
				resourcev1ac.AllocatedDeviceStatus().WithDriver(nicdra.DriverName).WithPool("node-a").WithDevice("pci-0000-18-00-0")))
			_, err := cs.ResourceV1().ResourceClaims("ml").ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager: nicdra.DriverName, Force: true})
			return err
		}, asA, `cannot patch resource "resourceclaims/status"`},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantRefused(t, tc.do(clientset(t, tc.cfg)), tc.want)
		})
	}
	t.Run("nothing of the refused writes stayed", func(t *testing.T) {
		for name, want := range map[string][]string{"on-a": {"gpu.nvidia.com"}, "on-b": {"gpu.nvidia.com"},
			"on-a-by-label": {"gpu.nvidia.com"}, "unallocated": nil} {
			if got := e.statusDrivers(t, name); !slices.Equal(got, want) {
				t.Errorf("claim %s: status.devices drivers %v, want %v", name, got, want)
			}
		}
		c, err := e.cs.ResourceV1().ResourceClaims("ml").Get(ctx, "unallocated", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation != nil || len(c.Labels) != 0 {
			t.Errorf("claim unallocated changed: %+v %v", c.Status, c.Labels)
		}
	})
}

// TestBaseGrantsNoDRA: with deploy/base alone (no overlay), node-a's daemon may
// neither publish a ResourceSlice for its own node nor write a claim's status: a
// cluster without the DRA overlay grants nothing of it.
func TestBaseGrantsNoDRA(t *testing.T) {
	e := startEnv(t)
	ctx := t.Context()
	e.createNode(t, "node-a")
	csA := clientset(t, e.as(e.token(t, e.daemonPod(t, "node-a"))))
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.claim(t, "on-a", &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}})
	wantForbidden(t, createSlice(slice("x", "node-a", nicdra.DriverName, "node-a"))(csA), `cannot create resource "resourceslices"`)
	_, err := csA.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	wantForbidden(t, err, `cannot list resource "resourceslices"`)
	_, err = csA.ResourceV1().ResourceClaims("ml").Get(ctx, "on-a", metav1.GetOptions{})
	wantForbidden(t, err, `cannot get resource "resourceclaims"`)
	// ApplyClaimStatus reads the claim first (refused above); the write itself:
	err = updateClaimStatus(ctx, e.cs, csA, "on-a", func(c *resourceapi.ResourceClaim) {
		c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: nicdra.DriverName, Pool: "node-a",
			Device: "pci-0000-18-00-0"})
	}, "")
	wantForbidden(t, err, `cannot update resource "resourceclaims/status"`)
}

// slice is a ResourceSlice with one device, node-local to node ("" for none).
func slice(name, node, driver, pool string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + driver},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "dev-0"}}}}
	if node != "" {
		s.Spec.NodeName = &node
	}
	return s
}

func createSlice(s *resourceapi.ResourceSlice) func(kubernetes.Interface) error {
	return func(cs kubernetes.Interface) error {
		_, err := cs.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{})
		return err
	}
}

func updateSlice(s *resourceapi.ResourceSlice) func(kubernetes.Interface) error {
	return func(cs kubernetes.Interface) error {
		s := s.DeepCopy()
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: "dev-1"})
		_, err := cs.ResourceV1().ResourceSlices().Update(context.Background(), s, metav1.UpdateOptions{})
		return err
	}
}

func deleteSlice(name string) func(kubernetes.Interface) error {
	return func(cs kubernetes.Interface) error {
		return cs.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
	}
}

// claim creates a claim in namespace ml for a GPU and a NIC and, unless node is nil,
// allocates it as the scheduler would (the devices in pool node-a or node-b, the
// nodeSelector given) with the GPU driver's status entry.
func (e *env) claim(t *testing.T, name string, node *corev1.NodeSelector) {
	t.Helper()
	ctx := t.Context()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}},
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}},
		}}}}
	c, err := e.cs.ResourceV1().ResourceClaims("ml").Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node == nil {
		return
	}
	pool, dev := "node-a", "pci-0000-18-00-0"
	if name == "on-b" {
		pool, dev = "node-b", "pci-0000-40-00-0"
	}
	c.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: node,
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.nvidia.com", Pool: pool, Device: "gpu-0"},
			{Request: "nic", Driver: nicdra.DriverName, Pool: pool, Device: dev},
		}}}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.nvidia.com", Pool: pool, Device: "gpu-0",
		Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"GPU-1"}`)}}}
	if _, err := e.cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// statusDrivers are the drivers of a claim's status.devices entries, sorted.
func (e *env) statusDrivers(t *testing.T, name string) []string {
	t.Helper()
	c, err := e.cs.ResourceV1().ResourceClaims("ml").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var d []string
	for _, s := range c.Status.Devices {
		d = append(d, s.Driver)
	}
	slices.Sort(d)
	return d
}

// updateClaimStatus reads the claim as the admin (the daemon could too) and
// writes its status, changed by change, with cs (dryRun: metav1.DryRunAll or "").
func updateClaimStatus(ctx context.Context, admin, cs kubernetes.Interface, name string, change func(*resourceapi.ResourceClaim),
	dryRun string) error {
	c, err := admin.ResourceV1().ResourceClaims("ml").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	change(c)
	opts := metav1.UpdateOptions{}
	if dryRun != "" {
		opts.DryRun = []string{dryRun}
	}
	_, err = cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, c, opts)
	return err
}

func mergePatchClaim(ctx context.Context, cs kubernetes.Interface, name, patch, subresource string) error {
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err := cs.ResourceV1().ResourceClaims("ml").Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, sub...)
	return err
}

// wantRefused fails unless err is the API server's refusal whose message holds want:
// Forbidden from RBAC or a policy, or Invalid from the claim status strategy's
// authorization checks (which it reports as field errors).
func wantRefused(t *testing.T, err error, want string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("want a refusal (%q), got %v", want, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("refused, but the message lacks %q: %v", want, err)
	}
}

func clientset(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the rendering", kind, name)
	return nil
}

func fromUnstructured(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func equalObjects(a, b *unstructured.Unstructured) bool {
	ja, errA := json.Marshal(a.Object)
	jb, errB := json.Marshal(b.Object)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
