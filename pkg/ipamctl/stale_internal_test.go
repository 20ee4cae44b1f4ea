package ipamctl

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/test/harness"
)

// requestLog records the method and path of each request a client makes.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			l.mu.Lock()
			l.reqs = append(l.reqs, req.Method+" "+req.URL.Path)
			l.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// count returns how many requests were GETs of one pod and how many listed pods.
func (l *requestLog) count() (gets, lists int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		switch {
		case r == "GET /api/v1/pods":
			lists++
		case strings.HasPrefix(r, "GET /api/v1/namespaces/") && strings.Contains(r, "/pods/"):
			gets++
		}
	}
	l.reqs = nil
	return gets, lists
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestCheckStaleListsTheNodesPods: the stale check lists the node's pods (in pages)
// instead of getting each allocation's pod, and gets only the pods the listing
// lacks; its findings are those a get of each pod gives: a pod gone, or replaced
// by one of another UID, is stale; a live pod on the node, or one of the
// allocation's name and UID bound elsewhere, or a static pod's mirror pod that names
// the allocation's UID, is not. With get but not list on
// pods it gets every pod and finds the same.
func TestCheckStaleListsTheNodesPods(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	ctx := t.Context()
	mkPod := func(name, node string, annotations ...string) *corev1.Pod {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		for i := 0; i+1 < len(annotations); i += 2 {
			pod.Annotations[annotations[i]] = annotations[i+1]
		}
		if err := cp.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	var allocs []*infov1.AllocationRecord
	alloc := func(pod, uid string) {
		allocs = append(allocs, &infov1.AllocationRecord{Pool: "p", Ip: fmt.Sprintf("10.0.%d.%d", len(allocs)/256, len(allocs)%256),
			PodName: pod, PodNamespace: "default", PodUid: uid})
	}
	const live = stalePageSize + 10 // more than one page
	for i := range live {
		alloc(fmt.Sprintf("live-%d", i), string(mkPod(fmt.Sprintf("live-%d", i), "n1").UID))
	}
	mkPod("replaced", "n1")
	// A static pod's mirror, naming the UID the kubelet gave the static pod.
	const staticUID = "c1b2a39a7d4b2f1e0d8e6f5a4b3c2d1e"
	mkPod("etcd-n1", "n1", corev1.MirrorPodAnnotationKey, staticUID, "kubernetes.io/config.hash", staticUID)
	alloc("etcd-n1", staticUID)
	alloc("replaced", "uid-of-the-old-pod")
	alloc("elsewhere", string(mkPod("elsewhere", "n2").UID))
	alloc("gone", "")
	alloc("", "") // no pod metadata: not checked

	wantStale := []string{"pod default/gone, which", "pod default/replaced, which"}
	check := func(t *testing.T, cfg *rest.Config) {
		t.Helper()
		cl, err := client.New(cfg, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		c := &checker{r: &CheckReport{}}
		checkStale(ctx, c, cl, "n1", allocs)
		var stale []string
		for _, f := range c.r.Findings {
			if f.Severity != SeverityOK {
				stale = append(stale, f.Message)
			}
		}
		ok := len(stale) == len(wantStale)
		for _, want := range wantStale {
			ok = ok && slices.ContainsFunc(stale, func(s string) bool { return strings.Contains(s, want) })
		}
		if !ok {
			t.Errorf("findings %q, want %q", stale, wantStale)
		}
	}

	t.Run("list", func(t *testing.T) {
		var l requestLog
		check(t, l.wrap(cp.Config))
		// elsewhere and gone are not in the listing; replaced is, with its new UID.
		if gets, lists := l.count(); gets != 2 || lists != 2 {
			t.Errorf("%d pod GETs and %d listings for %d allocations, want 2 GETs and 2 listing pages", gets, lists, len(allocs))
		}
	})

	t.Run("get only", func(t *testing.T) {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pods-get"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pods-get"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "pods-get"},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "pods-get"}}}
		for _, obj := range []client.Object{role, binding} {
			if err := cp.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
		cfg, err := cp.AddUser("pods-get")
		if err != nil {
			t.Fatal(err)
		}
		cfg.QPS, cfg.Burst = 1000, 2000
		var l requestLog
		check(t, l.wrap(cfg))
		if gets, _ := l.count(); gets != len(allocs)-1 {
			t.Errorf("%d pod GETs without list, want one per allocation with a pod (%d)", gets, len(allocs)-1)
		}
	})
}
