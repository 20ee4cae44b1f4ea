package poolcontroller

// RBAC of ipam-controller (deploy/rbac/controller/role.yaml is generated from these
// markers): exactly the verbs its API calls use, checked by test/privilege with
// `kubectl auth can-i --list`; see docs/rbac.md.
//
// Pools: the informers list and watch them, the reconciler and the admission webhook
// read them from the API server (get, list); status is written with an update.
// +kubebuilder:rbac:groups=nv-ipam.nvidia.com,resources=ippools;cidrpools,verbs=get;list;watch
// +kubebuilder:rbac:groups=nv-ipam.nvidia.com,resources=ippools/status;cidrpools/status,verbs=update
//
// NodeIPAMs (one per node) and PoolSpecs (one per namespace), the controller's to
// write (see Delivery): informers (list, watch), and create, update, delete.
// +kubebuilder:rbac:groups=ipam.hwipam.io,resources=nodeipams;poolspecs,verbs=list;watch;create;update;delete
//
// Nodes: a metadata informer (list, watch); the controller never writes a Node.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch
//
// Leader election (a Lease: get, create, update), the Lease that keeps the daemons'
// held reports across restarts (see Memory; the same verbs), and events are
// namespaced: the Leases live in --leader-elect-namespace, pool events in the pools'
// namespace, both kube-system in deploy/. Pool events go through events.k8s.io;
// leader election (controller-runtime's resource lock) records its events through
// the core/v1 Events API - without that rule the API server rejects them ("events
// is forbidden ... in API group \"\"", seen on a real node). Both recorders create
// and patch (a repeated event is patched), never update.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=kube-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups=events.k8s.io,namespace=kube-system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=kube-system,resources=events,verbs=create;patch
