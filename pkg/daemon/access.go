package daemon

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Allowed asks the API server (SelfSubjectAccessReviews, which every
// authenticated user may create) whether this process may do each of verbs on
// resource of group in namespace; it returns the first verb it may not do ("" if
// it may do them all). Asking first spares a refused request and its error in the
// log where a feature is optional (network-operator's roles grant less than
// hwipam's).
func Allowed(ctx context.Context, c client.Client, group, resource, namespace string, verbs ...string) (string, error) {
	for _, verb := range verbs {
		r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: group, Resource: resource, Namespace: namespace, Verb: verb}}}
		if err := c.Create(ctx, r); err != nil {
			return "", fmt.Errorf("asking whether %s of %s.%s is allowed: %w", verb, resource, group, err)
		}
		if !r.Status.Allowed {
			return verb, nil
		}
	}
	return "", nil
}
