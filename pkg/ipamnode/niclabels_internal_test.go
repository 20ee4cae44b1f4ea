package ipamnode

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/test/harness"
)

// staleReader answers Gets of the Node with what the labeler saw before the Node
// was deleted: the race between its read and its apply, made certain.
type staleReader struct {
	client.Reader
	uid types.UID
}

func (r staleReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	obj.SetName(key.Name)
	obj.SetUID(r.uid)
	return nil
}

// The apply carries the UID the labeler read: a Node deleted since is not
// re-created, and a Node re-created since (another UID) is not written blind.
func TestNICLabelApplyNeverCreatesOrCrossesANode(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.ControlPlaneOptions{})
	tree, err := fakesysfs.VPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := &nicLabeler{client: cp.Client, reader: staleReader{Reader: cp.Client, uid: "0a0b0c0d-0000-4000-8000-000000000001"},
		node: "gone", mode: NICLabelsNode, root: tree.Root, interval: time.Minute, log: testr.New(t)}
	l.publish(t.Context())
	var nodes corev1.NodeList
	if err := cp.Client.List(t.Context(), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 0 {
		t.Fatalf("the apply created a Node: %v", nodes.Items[0].Name)
	}
	if l.problems.last == "" || len(l.last) > 0 {
		t.Fatalf("no problem reported (%q) or labels taken as published (%v)", l.problems.last, l.last)
	}

	// The Node exists, with another UID than the one read.
	if err := cp.Client.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	l.problems.clear()
	l.publish(t.Context())
	var n corev1.Node
	if err := cp.Client.Get(t.Context(), client.ObjectKey{Name: "gone"}, &n); err != nil {
		t.Fatal(err)
	}
	if len(n.Labels) != 0 || l.problems.last == "" {
		t.Fatalf("labels %v written to a Node with another UID (problem %q)", n.Labels, l.problems.last)
	}
}
