package nicdra_test

import (
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// A claim reserved for two pods is refused at prepare, saying why, with
// nothing held or recorded: its devices move into one pod's network
// namespace, and the kubelet prepares a claim once for all its pods.
func TestPrepareRefusesASharedClaim(t *testing.T) {
	n := newNode(t)
	p := n.preparer()
	c := claim("s1", map[string]string{"nic": "pci-0000-18-00-0"})
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "second", UID: "pod-2"})
	_, err := p.Prepare(t.Context(), c)
	if !errors.Is(err, nicdra.ErrSharedClaim) || !strings.Contains(err.Error(), "reserved for 2 pods (trainer, second)") ||
		!strings.Contains(err.Error(), "network namespace") {
		t.Errorf("prepare of a shared claim: %v", err)
	}
	if held := n.held(t); len(held) != 0 {
		t.Errorf("held after the refusal: %v", held)
	}
	if len(n.fileClaims(t)) != 0 {
		t.Errorf("recorded after the refusal: %v", n.fileClaims(t))
	}
	if err := p.Refusal("pod-2"); err != nil {
		t.Errorf("a pod refused before any claim was prepared for it: %v", err)
	}
}
