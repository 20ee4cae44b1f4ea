package privilege

import (
	"slices"
	"strings"
	"testing"
)

// A right as `kubectl auth can-i` takes it: verb, resource[.group] and, where it
// matters, --subresource and -n.
type right struct {
	verb, resource, subresource, namespace string
}

func (r right) String() string {
	s := r.verb + " " + r.resource
	if r.subresource != "" {
		s += "/" + r.subresource
	}
	if r.namespace != "" {
		s += " -n " + r.namespace
	}
	return s
}

const (
	pools    = "ippools.nv-ipam.nvidia.com"
	nodeIPAM = "nodeipams.ipam.hwipam.io"
	specsR   = "poolspecs.ipam.hwipam.io"
	cidrs    = "cidrpools.nv-ipam.nvidia.com"
	features = "nodefeatures.nfd.k8s-sigs.io"
	leases   = "leases.coordination.k8s.io"
	events2  = "events.events.k8s.io"
	slicesR  = "resourceslices.resource.k8s.io"
	claimsR  = "resourceclaims.resource.k8s.io"
	// The synthetic resourceclaims/driver right the API server checks for a write of
	// a claim's status.devices entries of driver nic.hwipam.io (deploy/dra/rbac.yaml).
	driverR = claimsR + "/nic.hwipam.io"
)

// draRights are what deploy/dra adds for the node daemon: none of them is in the base.
var draRights = []right{
	{verb: "list", resource: slicesR}, {verb: "watch", resource: slicesR}, {verb: "create", resource: slicesR},
	{verb: "update", resource: slicesR}, {verb: "delete", resource: slicesR},
	{verb: "get", resource: claimsR, namespace: "default"}, {verb: "list", resource: claimsR},
	{verb: "watch", resource: claimsR},
	{verb: "update", resource: claimsR, subresource: "status", namespace: "default"},
	{verb: "associated-node:update", resource: driverR, subresource: "driver", namespace: "default"},
}

// What each service account needs (every API call of its binary) and a list of
// what it must not be able to do. docs/rbac.md says the same in prose.
var rights = map[string]struct{ need, mustNot []right }{
	nodeSA: {
		need: []right{
			{verb: "get", resource: "nodes"}, {verb: "patch", resource: "nodes"},
			{verb: "get", resource: "pods"}, {verb: "list", resource: "pods"}, {verb: "watch", resource: "pods"},
			{verb: "list", resource: pools}, {verb: "watch", resource: pools},
			{verb: "list", resource: cidrs}, {verb: "watch", resource: cidrs},
			{verb: "get", resource: features, namespace: ns}, {verb: "create", resource: features, namespace: ns},
			{verb: "patch", resource: features, namespace: ns}, {verb: "delete", resource: features, namespace: ns},
			{verb: "get", resource: nodeIPAM}, {verb: "list", resource: nodeIPAM}, {verb: "watch", resource: nodeIPAM},
			{verb: "get", resource: specsR}, {verb: "list", resource: specsR}, {verb: "watch", resource: specsR},
		},
		mustNot: []right{
			{verb: "create", resource: nodeIPAM, namespace: ns}, {verb: "update", resource: nodeIPAM, namespace: ns},
			{verb: "patch", resource: nodeIPAM, namespace: ns}, {verb: "delete", resource: nodeIPAM, namespace: ns},
			{verb: "update", resource: specsR, namespace: ns}, {verb: "patch", resource: specsR, namespace: ns},
			{verb: "list", resource: "nodes"}, {verb: "watch", resource: "nodes"}, {verb: "update", resource: "nodes"},
			{verb: "create", resource: "nodes"}, {verb: "delete", resource: "nodes"},
			{verb: "patch", resource: "nodes", subresource: "status"}, {verb: "update", resource: "nodes", subresource: "status"},
			{verb: "delete", resource: "pods", namespace: ns}, {verb: "create", resource: "pods", subresource: "eviction", namespace: ns},
			{verb: "update", resource: "pods", namespace: ns}, {verb: "patch", resource: "pods", subresource: "status", namespace: ns},
			{verb: "get", resource: "secrets", namespace: ns}, {verb: "list", resource: "secrets", namespace: ns},
			{verb: "get", resource: "configmaps", namespace: ns},
			{verb: "get", resource: pools, namespace: ns}, {verb: "create", resource: pools, namespace: ns},
			{verb: "update", resource: pools, subresource: "status", namespace: ns},
			{verb: "get", resource: features, namespace: "default"}, {verb: "create", resource: features, namespace: "default"},
			{verb: "patch", resource: features, namespace: "default"},
			{verb: "list", resource: features, namespace: ns}, {verb: "update", resource: features, namespace: ns},
			{verb: "create", resource: "nodefeaturerules.nfd.k8s-sigs.io"},
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: ns},
			{verb: "get", resource: leases, namespace: ns},
			{verb: "impersonate", resource: "users"}, {verb: "escalate", resource: "clusterroles.rbac.authorization.k8s.io"},
			{verb: "delete", resource: "validatingadmissionpolicybindings.admissionregistration.k8s.io"},
		},
	},
	controlSA: {
		need: []right{
			{verb: "get", resource: pools}, {verb: "list", resource: pools},
			{verb: "watch", resource: pools},
			{verb: "get", resource: cidrs}, {verb: "list", resource: cidrs},
			{verb: "watch", resource: cidrs},
			{verb: "update", resource: pools, subresource: "status"},
			{verb: "update", resource: cidrs, subresource: "status"},
			{verb: "list", resource: "nodes"}, {verb: "watch", resource: "nodes"},
			{verb: "create", resource: "events", namespace: ns}, {verb: "patch", resource: "events", namespace: ns},
			{verb: "create", resource: events2, namespace: ns}, {verb: "patch", resource: events2, namespace: ns},
			{verb: "get", resource: leases, namespace: ns}, {verb: "create", resource: leases, namespace: ns},
			{verb: "update", resource: leases, namespace: ns},
			{verb: "list", resource: nodeIPAM}, {verb: "watch", resource: nodeIPAM}, {verb: "create", resource: nodeIPAM},
			{verb: "update", resource: nodeIPAM}, {verb: "delete", resource: nodeIPAM},
			{verb: "list", resource: specsR}, {verb: "watch", resource: specsR}, {verb: "create", resource: specsR},
			{verb: "update", resource: specsR}, {verb: "delete", resource: specsR},
		},
		mustNot: []right{
			{verb: "patch", resource: nodeIPAM, namespace: ns}, {verb: "get", resource: nodeIPAM, namespace: ns},
			{verb: "get", resource: "nodes"}, {verb: "patch", resource: "nodes"}, {verb: "update", resource: "nodes"},
			{verb: "create", resource: pools, namespace: ns}, {verb: "update", resource: pools, namespace: ns},
			{verb: "patch", resource: pools, namespace: ns}, {verb: "delete", resource: cidrs, namespace: ns},
			{verb: "patch", resource: pools, subresource: "status", namespace: ns},
			{verb: "get", resource: pools, subresource: "status", namespace: ns},
			{verb: "create", resource: "events", namespace: "default"}, {verb: "update", resource: "events", namespace: ns},
			{verb: "create", resource: events2, namespace: "default"},
			{verb: "get", resource: leases, namespace: "default"}, {verb: "list", resource: leases, namespace: ns},
			{verb: "delete", resource: leases, namespace: ns}, {verb: "patch", resource: leases, namespace: ns},
			{verb: "get", resource: "secrets", namespace: ns}, {verb: "get", resource: "configmaps", namespace: ns},
			{verb: "get", resource: "pods", namespace: ns}, {verb: "list", resource: "pods", namespace: ns},
			{verb: "create", resource: features, namespace: ns},
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: ns},
		},
	},
}

// asSA are kubectl's impersonation flags for a service account of kube-system,
// with the groups its real tokens carry.
func asSA(name string) []string {
	return []string{"--as=system:serviceaccount:" + ns + ":" + name, "--as-group=system:serviceaccounts",
		"--as-group=system:serviceaccounts:" + ns, "--as-group=system:authenticated"}
}

// TestServiceAccountRights asks the real API server, through the real kubectl's
// `auth can-i`, for every right each service account needs (yes) and a list of
// rights it must not have (no), and compares `auth can-i --list` - less what a
// service account without any binding gets - to exactly the needed set, so that a
// widened rule fails the test.
func TestServiceAccountRights(t *testing.T) {
	e := startEnv(t)
	for _, sa := range []string{nodeSA, controlSA} {
		for _, r := range rights[sa].need {
			t.Run(sa+" can "+r.String(), func(t *testing.T) {
				if !canI(t, e.kubeconfig, sa, r) {
					t.Errorf("%s cannot %s", sa, r)
				}
			})
		}
		mustNot := rights[sa].mustNot
		if sa == nodeSA {
			// Without deploy/dra, the node daemon has none of the DRA driver's rights.
			mustNot = append(slices.Clone(mustNot), draRights...)
		}
		for _, r := range mustNot {
			t.Run(sa+" cannot "+r.String(), func(t *testing.T) {
				if canI(t, e.kubeconfig, sa, r) {
					t.Errorf("%s can %s", sa, r)
				}
			})
		}
		for _, namespace := range []string{ns, "default"} {
			t.Run(sa+" list -n "+namespace, func(t *testing.T) {
				got := listRights(t, e.kubeconfig, sa, namespace)
				base := listRights(t, e.kubeconfig, "no-bindings", namespace)
				var extra []string
				for _, r := range got {
					if !slices.Contains(base, r) {
						extra = append(extra, r)
					}
				}
				var want []string
				for _, r := range rights[sa].need {
					if r.namespace == "" || r.namespace == namespace {
						want = append(want, r.verb+" "+r.resource+subresourceSuffix(r.subresource))
					}
				}
				slices.Sort(want)
				want = slices.Compact(want)
				if !slices.Equal(extra, want) {
					t.Errorf("kubectl auth can-i --list -n %s for %s, beyond a service account without bindings:\n got  %q\n want %q",
						namespace, sa, extra, want)
				}
			})
		}
	}
}

// canI asks the real API server, through the real kubectl's `auth can-i`, whether a
// service account of kube-system has a right.
func canI(t *testing.T, kubeconfig, sa string, r right) bool {
	t.Helper()
	args := append([]string{"--kubeconfig", kubeconfig, "auth", "can-i", r.verb, r.resource}, asSA(sa)...)
	if r.subresource != "" {
		args = append(args, "--subresource", r.subresource)
	}
	if r.namespace != "" {
		args = append(args, "-n", r.namespace)
	}
	out, err := kubectl(t, args...)
	switch strings.TrimSpace(out) {
	case "yes":
		return true
	case "no":
		return false
	}
	t.Fatalf("kubectl auth can-i %s: %q %v", r, out, err)
	return false
}

func subresourceSuffix(s string) string {
	if s == "" {
		return ""
	}
	return "/" + s
}

// listRights parses `kubectl auth can-i --list` into sorted "verb resource" items
// (non-resource URLs as "verb url", resource names as "verb resource:name").
func listRights(t *testing.T, kubeconfig, sa, namespace string) []string {
	t.Helper()
	out, err := kubectl(t, append([]string{"--kubeconfig", kubeconfig, "auth", "can-i", "--list", "-n", namespace}, asSA(sa)...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	cols := []int{0, strings.Index(header, "Non-Resource URLs"), strings.Index(header, "Resource Names"), strings.Index(header, "Verbs")}
	if slices.Contains(cols[1:], -1) {
		t.Fatalf("unexpected kubectl auth can-i --list header %q", header)
	}
	field := func(line string, i int) string {
		from := min(cols[i], len(line))
		to := len(line)
		if i+1 < len(cols) {
			to = min(cols[i+1], len(line))
		}
		return strings.TrimSpace(line[from:to])
	}
	list := func(s string) []string { return strings.Fields(strings.Trim(s, "[]")) }
	var items []string
	for _, line := range lines[1:] {
		resource, urls, names, verbs := field(line, 0), list(field(line, 1)), list(field(line, 2)), list(field(line, 3))
		var subjects []string
		switch {
		case len(urls) > 0:
			subjects = urls
		case len(names) > 0:
			for _, n := range names {
				subjects = append(subjects, resource+":"+n)
			}
		default:
			subjects = []string{resource}
		}
		for _, v := range verbs {
			for _, s := range subjects {
				items = append(items, v+" "+s)
			}
		}
	}
	slices.Sort(items)
	return slices.Compact(items)
}
