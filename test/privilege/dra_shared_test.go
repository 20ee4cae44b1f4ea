package privilege

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestDRAClaimNotShared: with deploy/overlays/dra's policies, a claim with
// nic.hwipam.io devices is reserved for one pod, never two (the scheduler's
// write of status.reservedFor is refused, saying why); a claim of only
// another driver's devices may be shared; a claim shared before may be
// reserved for fewer.
func TestDRAClaimNotShared(t *testing.T) {
	e := startEnvOf(t, draOverlay, draPolicies)
	ctx := t.Context()
	if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	onA := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}}
	e.claim(t, "nic", onA) // a GPU and a nic.hwipam.io device
	gpuOnly := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}}}}
	gpuOnly, err := e.cs.ResourceV1().ResourceClaims("ml").Create(ctx, gpuOnly, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpuOnly.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: onA, Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-1"}}}}
	if _, err := e.cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, gpuOnly, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) resourceapi.ResourceClaimConsumerReference {
		return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: name, UID: types.UID("uid-" + name)}
	}
	reserve := func(claim string, pods ...string) error {
		c, err := e.cs.ResourceV1().ResourceClaims("ml").Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.ReservedFor = nil
		for _, p := range pods {
			c.Status.ReservedFor = append(c.Status.ReservedFor, pod(p))
		}
		_, err = e.cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	}
	if err := reserve("nic", "first"); err != nil {
		t.Fatalf("reserving the claim for its pod: %v", err)
	}
	eventually(t, 30*time.Second, "a second pod refused", func() error {
		if err := reserve("nic", "first"); err != nil { // back, when a try passed before the policy was in force
			return err
		}
		err := reserve("nic", "first", "second")
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "hwipam-nic-claims-not-shared") &&
			strings.Contains(err.Error(), "cannot be shared") && strings.Contains(err.Error(), "ml/nic") {
			return nil
		}
		return fmt.Errorf("reserving ml/nic for a second pod: %v", err)
	})
	if err := reserve("gpu", "first", "second"); err != nil {
		t.Errorf("a claim of another driver's devices shared: %v", err)
	}
	if err := reserve("nic"); err != nil {
		t.Errorf("releasing the claim's reservation: %v", err)
	}
	// The policy is the overlay's.
	found := false
	for _, o := range render(t, draOverlay) {
		if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "hwipam-nic-claims-not-shared" {
			found = true
		}
	}
	if !found {
		t.Errorf("the overlay lacks the policy")
	}
}
