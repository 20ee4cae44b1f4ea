package poolcontroller

// Leader election (controller-runtime's resource lock) records its events through the
// core/v1 Events API, not events.k8s.io: without this rule the API server rejects them
// ("events is forbidden ... in API group \"\"") - seen on a real node.
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;update
