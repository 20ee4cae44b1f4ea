package v1alpha1

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/hwipam/hwipam/pkg/iprange"
)

// +kubebuilder:webhook:path=/validate-nv-ipam-nvidia-com-v1alpha1-ippool,mutating=false,failurePolicy=fail,sideEffects=None,groups=nv-ipam.nvidia.com,resources=ippools,verbs=create;update,versions=v1alpha1,name=validate-ippool.nv-ipam.nvidia.com,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-nv-ipam-nvidia-com-v1alpha1-cidrpool,mutating=false,failurePolicy=fail,sideEffects=None,groups=nv-ipam.nvidia.com,resources=cidrpools,verbs=create;update,versions=v1alpha1,name=validate-cidrpool.nv-ipam.nvidia.com,admissionReviewVersions=v1

// SetupWebhooksWithManager registers the validating webhooks of both pool kinds on
// the paths nv-ipam uses. reader lists the pools of a namespace for the overlap
// check; an uncached reader avoids admitting two overlapping pools created at once
// only as far as the API server's own ordering allows.
func SetupWebhooksWithManager(mgr ctrl.Manager, reader client.Reader) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &IPPool{}).
		WithValidator(&ipPoolValidator{reader: reader}).Complete(); err != nil {
		return fmt.Errorf("setting up the IPPool webhook: %w", err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &CIDRPool{}).
		WithValidator(&cidrPoolValidator{reader: reader}).Complete(); err != nil {
		return fmt.Errorf("setting up the CIDRPool webhook: %w", err)
	}
	return nil
}

type ipPoolValidator struct{ reader client.Reader }

func (v *ipPoolValidator) ValidateCreate(ctx context.Context, p *IPPool) (admission.Warnings, error) {
	return nil, admit(ctx, v.reader, p, "IPPool", p.Validate(), field.NewPath("spec", "subnet"), p.Spec.Subnet)
}

func (v *ipPoolValidator) ValidateUpdate(ctx context.Context, _, p *IPPool) (admission.Warnings, error) {
	return v.ValidateCreate(ctx, p)
}

func (*ipPoolValidator) ValidateDelete(context.Context, *IPPool) (admission.Warnings, error) {
	return nil, nil
}

type cidrPoolValidator struct{ reader client.Reader }

func (v *cidrPoolValidator) ValidateCreate(ctx context.Context, p *CIDRPool) (admission.Warnings, error) {
	return nil, admit(ctx, v.reader, p, "CIDRPool", p.Validate(), field.NewPath("spec", "cidr"), p.Spec.CIDR)
}

func (v *cidrPoolValidator) ValidateUpdate(ctx context.Context, _, p *CIDRPool) (admission.Warnings, error) {
	return v.ValidateCreate(ctx, p)
}

func (*cidrPoolValidator) ValidateDelete(context.Context, *CIDRPool) (admission.Warnings, error) {
	return nil, nil
}

// admit turns validation errors, and an overlap with another pool of the namespace,
// into the Invalid error the API server reports to the user.
func admit(ctx context.Context, reader client.Reader, obj client.Object, kind string,
	errs field.ErrorList, netPath *field.Path, network string) error {
	if len(errs) == 0 {
		others, err := OverlappingPools(ctx, reader, obj, network)
		if err != nil {
			return apierrors.NewInternalError(fmt.Errorf("checking for overlapping pools: %w", err))
		}
		for _, o := range others {
			errs = append(errs, field.Invalid(netPath, network,
				fmt.Sprintf("overlaps %s in namespace %s; pools of one namespace must not overlap", o, obj.GetNamespace())))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(GroupVersion.WithKind(kind).GroupKind(), obj.GetName(), errs)
}

// OverlappingPools names ("IPPool a (10.0.0.0/24)") the other pools in obj's
// namespace whose network overlaps network. Pools whose own network does not parse
// are ignored.
func OverlappingPools(ctx context.Context, reader client.Reader, obj client.Object, network string) ([]string, error) {
	mine, err := ParsePrefix(network)
	if err != nil {
		return nil, nil
	}
	var ips IPPoolList
	if err := reader.List(ctx, &ips, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil, fmt.Errorf("listing IPPools: %w", err)
	}
	var cidrs CIDRPoolList
	if err := reader.List(ctx, &cidrs, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil, fmt.Errorf("listing CIDRPools: %w", err)
	}
	_, isIPPool := obj.(*IPPool)
	var out []string
	check := func(kind, name, other string) {
		if name == obj.GetName() && (kind == "IPPool") == isIPPool {
			return
		}
		p, err := ParsePrefix(other)
		if err != nil || !rangesOverlap(mine, p) {
			return
		}
		out = append(out, fmt.Sprintf("%s %s (%s)", kind, name, p))
	}
	for i := range ips.Items {
		check("IPPool", ips.Items[i].Name, ips.Items[i].Spec.Subnet)
	}
	for i := range cidrs.Items {
		check("CIDRPool", cidrs.Items[i].Name, cidrs.Items[i].Spec.CIDR)
	}
	slices.Sort(out)
	return out, nil
}

func rangesOverlap(a, b netip.Prefix) bool {
	return iprange.PrefixRange(a).Overlaps(iprange.PrefixRange(b))
}
