package nicdra_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwipam/hwipam/pkg/nicdra"
)

// Issue 39, item 5: a prepare that failed was only in the pod's events and
// ipam-node's log; `ipamctl check` did not see it. Now the driver keeps it
// (the claim and the message) until the claim prepares, for the status file.
func TestFailedPrepareIsKeptUntilTheClaimPrepares(t *testing.T) {
	n := newNode(t)
	log := &nicdra.FailureLog{}
	d := &nicdra.Driver{Preparer: n.preparer(), Failures: log}
	// rail 1's port has no pool: the prepare fails.
	bad := claim("u1", map[string]string{"nic": "pci-0000-40-00-0"})
	res, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{bad})
	if err != nil || res[bad.UID].Err == nil {
		t.Fatalf("prepare of a claim for a rail without a pool: %v, %v", res, err)
	}
	got := log.Recent()
	if len(got) != 1 || got[0].Op != nicdra.FailedPrepare || got[0].Claim != "ml/c-u1" ||
		!strings.Contains(got[0].Message, res[bad.UID].Err.Error()) {
		t.Fatalf("failures %+v, want the prepare of ml/c-u1 with %q", got, res[bad.UID].Err)
	}
	// Another claim's failure is kept beside it; the unprepare of the first
	// (its pod deleted) clears the first.
	other := claim("u2", map[string]string{"nic": "pci-0000-40-00-0"})
	if _, err := d.PrepareResourceClaims(t.Context(), []*resourceapi.ResourceClaim{other}); err != nil {
		t.Fatal(err)
	}
	if got := log.Recent(); len(got) != 2 || got[0].Claim != "ml/c-u2" {
		t.Fatalf("failures %+v, want ml/c-u2's, then ml/c-u1's", got)
	}
	log.Succeeded(nicdra.FailedPrepare, "ml/c-u1", "")
	if got := log.Recent(); len(got) != 1 || got[0].Claim != "ml/c-u2" {
		t.Fatalf("failures after ml/c-u1 succeeded: %+v", got)
	}
}

// One tenant's claims failing to prepare again and again do not push another
// pod's failed detach out of what ipamctl check shows: the failures are
// bounded per operation, not in one list (issue 45, item 9).
func TestFailuresAreBoundedPerOperation(t *testing.T) {
	log := &nicdra.FailureLog{}
	log.Add(nicdra.FailedDetach, "", "web/frontend", errors.New("netdev not found"))
	for i := range 100 {
		log.Add(nicdra.FailedPrepare, fmt.Sprintf("tenant/c-%03d", i), "", errors.New("no pool for the rail"))
	}
	got := log.Recent()
	prepares, detach := 0, false
	for _, f := range got {
		switch f.Op {
		case nicdra.FailedPrepare:
			prepares++
		case nicdra.FailedDetach:
			detach = f.Pod == "web/frontend"
		}
	}
	if !detach {
		t.Errorf("the failed detach of web/frontend was pushed out by 100 failed prepares: %d failures kept", len(got))
	}
	if prepares != 32 || got[0].Claim != "tenant/c-099" {
		t.Errorf("%d failed prepares kept, the newest %q; want the newest 32", prepares, got[0].Claim)
	}
}
