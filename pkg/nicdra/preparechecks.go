package nicdra

import (
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// ErrNotReady is a prepare that fails now and succeeds later by itself: the
// pools labelled for the rails are not known yet (ipam-node has not listed
// them from the API server since it started). Nothing is allocated; the
// kubelet retries.
var ErrNotReady = errors.New("nic.hwipam.io is not ready yet")

// railPools returns the pools of kind labelled for a rail: ErrNotReady while
// they are not known, nodealloc.ErrUnknownPool when none is labelled.
func (p *Preparer) railPools(rail, kind string) ([]string, error) {
	pools, known := p.PoolsForRail(rail, kind)
	switch {
	case !known:
		return nil, fmt.Errorf("%w: the pools labelled for rail %s are not loaded yet (ipam-node has not listed the "+
			"pools from the API server since it started, or cannot reach it); the kubelet retries the prepare",
			ErrNotReady, rail)
	case len(pools) == 0:
		return nil, fmt.Errorf("%w: no %s is labelled %s=%s: label the rail's pool (two for dual-stack), "+
			"or name a pool in the claim's %s configuration", nodealloc.ErrUnknownPool, kind, v1alpha1.LabelRail, rail, ConfigKind)
	}
	return pools, nil
}

// checkInterfaceNames refuses a claim whose devices of this driver would not
// get their names in the pod: one named eth0 or lo (the pod has them), two
// named alike (a request of count 2 or allocationMode All with one
// interfaceName gives all its devices that name), or one named as a device of
// another claim prepared for the same pod. A device's name in the pod is its
// configured interfaceName, else its host netdev's name. Such a claim would
// hold its addresses while its pod's sandbox failed on every start; refused
// here, nothing is allocated. st is the checkpoint as it stands.
func (p *Preparer) checkInterfaceNames(claim *resourceapi.ResourceClaim, pod podRef, inv *nicdiscovery.Inventory, st *Checkpoint) error {
	taken := map[string]string{} // name in the pod → the device that has it
	for uid, other := range st.Claims {
		if uid == claim.UID || other.PodUID != pod.uid {
			continue
		}
		for _, d := range other.Devices {
			if d.InterfaceName != "" {
				taken[d.InterfaceName] = fmt.Sprintf("device %s of claim %s/%s", d.Device, other.Namespace, other.Name)
			}
		}
	}
	var problems []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		cfg, err := ConfigFor(claim.Status.Allocation, r.Request)
		if err != nil {
			return fmt.Errorf("claim %s/%s, request %s, device %s: %w", claim.Namespace, claim.Name, r.Request, r.Device, err)
		}
		name, how := cfg.InterfaceName, "its interfaceName"
		if name == "" {
			if name = hostNetdevOf(inv, r.Device); name == "" {
				continue // no netdev to name (prepareDevice says what is wrong, if anything)
			}
			how = "its host netdev's name (it has no interfaceName)"
		}
		this := fmt.Sprintf("device %s (request %s)", r.Device, r.Request)
		if why := podOwnName(name); why != "" {
			problems = append(problems, fmt.Sprintf("%s would be %q in the pod, %s, which is %s: set another interfaceName, "+
				"e.g. net1", this, name, how, why))
			continue
		}
		if prev, ok := taken[name]; ok {
			problems = append(problems, fmt.Sprintf("%s and %s would both be %q in the pod: one name per device (a request "+
				"with count > 1 or allocationMode All gives its interfaceName to each of its devices: drop interfaceName "+
				"there to keep each port's host name, or ask for one device per request, each with its own name)",
				prev, this, name))
			continue
		}
		taken[name] = this
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: claim %s/%s: %s", ErrConfig, claim.Namespace, claim.Name, strings.Join(problems, "; "))
}

// hostNetdevOf is the host netdev of a device of the inventory, "" when it
// has none or the inventory lacks the device.
func hostNetdevOf(inv *nicdiscovery.Inventory, device string) string {
	if inv == nil {
		return ""
	}
	for _, n := range inv.NICs {
		if DeviceName(n.PCIAddress) == device && len(n.Netdevs) > 0 {
			return n.Netdevs[0]
		}
	}
	return ""
}
