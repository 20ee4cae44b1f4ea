package ipamnode

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	toolscache "k8s.io/client-go/tools/cache"
)

// podWatch is an informer of the metadata of the pods bound to one node (a
// spec.nodeName field selector, applied by the API server), keeping of each pod
// only what the cleaner compares: namespace, name, UID and the mirror-pod
// annotation. It runs until stop.
type podWatch struct {
	informer toolscache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{}

	mu         sync.Mutex
	lastErr    error
	refusedErr error
}

// nodePodWatcher returns a function that starts a podWatch over the pods of node.
func nodePodWatcher(client metadata.Interface, node string, log logr.Logger) func(context.Context) *podWatch {
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	return func(ctx context.Context) *podWatch {
		inf := metadatainformer.NewFilteredMetadataInformer(client, corev1.SchemeGroupVersion.WithResource("pods"),
			metav1.NamespaceAll, 0, toolscache.Indexers{},
			func(o *metav1.ListOptions) { o.FieldSelector = selector }).Informer()
		w := &podWatch{informer: inf, done: make(chan struct{})}
		// Both only fail once the informer has started.
		_ = inf.SetTransform(slimPod)
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
			log.V(1).Info("listing or watching this node's pods failed", "error", err.Error())
			w.mu.Lock()
			defer w.mu.Unlock()
			w.lastErr = err
			if apierrors.IsForbidden(err) {
				w.refusedErr = err
			}
		})
		ctx, w.cancel = context.WithCancel(ctx)
		go func() {
			defer close(w.done)
			inf.RunWithContext(ctx)
		}()
		return w
	}
}

// stop ends the informer and waits for it.
func (w *podWatch) stop() {
	w.cancel()
	<-w.done
}

// synced reports whether the informer has listed the node's pods once.
func (w *podWatch) synced() bool { return w.informer.HasSynced() }

// forbidden returns the API server's refusal to list or watch pods, if it refused.
func (w *podWatch) forbidden() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusedErr
}

// lastError returns the last error of listing or watching, if any.
func (w *podWatch) lastError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// podGone reports whether the informer lacks the pod, or shows another one under
// its name (podReplaced). It never calls the API server.
func (w *podWatch) podGone(_ context.Context, namespace, name, uid string) (bool, error) {
	obj, ok, err := w.informer.GetStore().GetByKey(namespace + "/" + name)
	switch {
	case err != nil:
		return false, fmt.Errorf("reading pod %s/%s from the informer: %w", namespace, name, err)
	case !ok:
		return true, nil
	}
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return false, fmt.Errorf("pod %s/%s in the informer is a %T", namespace, name, obj)
	}
	return podReplaced(pod, uid), nil
}

// slimPod keeps of a pod's metadata what the cleaner reads, so that the informer
// holds a few hundred bytes per pod.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	slim := &metav1.PartialObjectMetadata{TypeMeta: pod.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion}}
	if v, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		slim.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: v}
	}
	return slim, nil
}
