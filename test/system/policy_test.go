package system

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// The claim-sharing guard of a real deployment is deploy/dra/policy.yaml's
// ValidatingAdmissionPolicy hwipam-nic-claims-not-shared: it refuses the
// scheduler's status write that reserves a claim with nic.hwipam.io devices
// for a second consumer. The test installs that policy and its binding (only
// those) into its API server, so that its scheduler (which writes reservedFor
// as an admin) is refused as the real one would be. A probe claim in a
// namespace of its own, never prepared, tells when the API server enforces
// the policy (a policy takes effect a moment after its objects exist).

const (
	notSharedPolicy = "hwipam-nic-claims-not-shared"
	probeNamespace  = "policy-probe"
	probeClaim      = "probe"
	// sharedRefusal is what the policy's message says.
	sharedRefusal = "the claim cannot be shared by pods"
)

// notSharedPolicyObjects reads the policy and its binding from
// deploy/dra/policy.yaml, picked by kind and name.
func (w *world) notSharedPolicyObjects() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "dra", "policy.yaml"))
	if err != nil {
		w.t.Fatalf("reading the DRA policies: %v", err)
	}
	var pol *admissionv1.ValidatingAdmissionPolicy
	var bind *admissionv1.ValidatingAdmissionPolicyBinding
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			w.t.Fatalf("deploy/dra/policy.yaml: %v", err)
		}
		if head.Metadata.Name != notSharedPolicy {
			continue
		}
		switch head.Kind {
		case "ValidatingAdmissionPolicy":
			pol = &admissionv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict(doc, pol)
		case "ValidatingAdmissionPolicyBinding":
			bind = &admissionv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict(doc, bind)
		}
		if err != nil {
			w.t.Fatalf("deploy/dra/policy.yaml, %s %s: %v", head.Kind, head.Metadata.Name, err)
		}
	}
	if pol == nil || bind == nil {
		w.t.Fatalf("deploy/dra/policy.yaml has no ValidatingAdmissionPolicy and binding named %s", notSharedPolicy)
	}
	return pol, bind
}

// installNotSharedPolicy creates the policy, its binding and the probe
// claim, and waits until the API server enforces the policy.
func (w *world) installNotSharedPolicy() {
	pol, bind := w.notSharedPolicyObjects()
	adm := w.cp.Clientset.AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Create(w.ctx, pol, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("creating the policy %s: %v", notSharedPolicy, err)
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(w.ctx, bind, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("creating the binding %s: %v", notSharedPolicy, err)
	}
	if _, err := w.cp.Clientset.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probeNamespace}},
		metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("creating namespace %s: %v", probeNamespace, err)
	}
	rc := w.cp.Clientset.ResourceV1().ResourceClaims(probeNamespace)
	claim, err := rc.Create(w.ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: probeClaim, Namespace: probeNamespace},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: draRequest, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicdra.DriverName}}}}}}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatalf("creating the policy's probe claim: %v", err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: draRequest, Driver: nicdra.DriverName, Pool: "no-node", Device: "probe"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"no-node"}}}}}}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "probe-1", UID: "probe-1"}}
	if _, err := rc.UpdateStatus(w.ctx, claim, metav1.UpdateOptions{}); err != nil {
		w.t.Fatalf("allocating the policy's probe claim: %v", err)
	}
	w.waitPolicy(true)
}

// policyEnforced tries to reserve the probe claim for a second pod: refused
// by the policy means enforced (anything else refusing it fails the test);
// a write that passes is taken back.
func (w *world) policyEnforced() bool {
	rc := w.cp.Clientset.ResourceV1().ResourceClaims(probeNamespace)
	claim, err := rc.Get(w.ctx, probeClaim, metav1.GetOptions{})
	if err != nil {
		w.fail("reading the policy's probe claim: %v", err)
	}
	claim.Status.ReservedFor = append(claim.Status.ReservedFor[:1], resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "probe-2", UID: "probe-2"})
	claim, err = rc.UpdateStatus(w.ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		if !strings.Contains(err.Error(), sharedRefusal) {
			w.fail("reserving the policy's probe claim for a second pod: %v; want the policy's refusal (%q) or nothing", err, sharedRefusal)
		}
		return true
	}
	claim.Status.ReservedFor = claim.Status.ReservedFor[:1]
	if _, err := rc.UpdateStatus(w.ctx, claim, metav1.UpdateOptions{}); err != nil {
		w.fail("taking the policy's probe claim's second reservation back: %v", err)
	}
	return false
}

// waitPolicy waits until the API server enforces the policy (on) or no
// longer does.
func (w *world) waitPolicy(on bool) {
	deadline := time.Now().Add(30 * time.Second)
	for w.policyEnforced() != on {
		if time.Now().After(deadline) {
			w.fail("the policy %s is not %s 30 s after its binding was %s", notSharedPolicy,
				map[bool]string{true: "enforced", false: "lifted"}[on], map[bool]string{true: "created", false: "deleted"}[on])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bypassPolicy runs fn with the policy's binding deleted (a claim shared
// before the policy was installed, or on a cluster without it), then creates
// the binding again and waits until it is enforced.
func (w *world) bypassPolicy(fn func()) {
	adm := w.cp.Clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if err := adm.Delete(w.ctx, notSharedPolicy, metav1.DeleteOptions{}); err != nil {
		w.fail("deleting the binding %s: %v", notSharedPolicy, err)
	}
	w.waitPolicy(false)
	fn()
	_, bind := w.notSharedPolicyObjects()
	if _, err := adm.Create(w.ctx, bind, metav1.CreateOptions{}); err != nil {
		w.fail("creating the binding %s again: %v", notSharedPolicy, err)
	}
	w.waitPolicy(true)
}
