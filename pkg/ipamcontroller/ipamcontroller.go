// Package ipamcontroller runs the ipam-controller: a controller-runtime manager with
// the IPPool and CIDRPool reconcilers, optional validating webhooks, leader
// election, health and metrics endpoints.
package ipamcontroller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/poolcontroller"
	"github.com/hwipam/hwipam/pkg/poolwatch"
	"github.com/hwipam/hwipam/pkg/version"
)

// LeaderElectionID is the Lease nv-ipam's controller uses too, so that during a
// switch from nv-ipam to hwipam the two never assign blocks at the same time.
const LeaderElectionID = "dd1643cf.nvidia.com"

// Options are the ipam-controller's settings; AddFlags binds them to the flags of
// nv-ipam's controller plus hwipam's own.
type Options struct {
	Kubeconfig           string
	PoolsNamespace       string
	LeaderElect          bool
	LeaderElectNamespace string
	Webhook              bool
	WebhookPort          int
	WebhookCertDir       string
	MetricsBindAddress   string
	// MetricsSecure serves the metrics over HTTPS (a self-signed certificate)
	// to clients whose token may get the non-resource URL /metrics.
	MetricsSecure          bool
	HealthProbeBindAddress string
	PprofBindAddress       string
	ReleaseGracePeriod     time.Duration
	Workers                int
	// MinGrantAge is how long a block taken from a node counts for its
	// daemon's report at least (hidden flag --min-grant-age, for tests); 0 is
	// the built-in minute.
	MinGrantAge time.Duration
	// StatusAllocationsMaxNodes is how many blocks a pool's status lists at most
	// while blocks are delivered through NodeIPAMs; 0 lists every block.
	StatusAllocationsMaxNodes int

	// RestConfig, when set, is used instead of Kubeconfig (tests).
	RestConfig *rest.Config
	// WebhookHost binds the webhook server to one address (tests); "" is all.
	WebhookHost string
}

// NewOptions returns the defaults, those of nv-ipam where it has the flag.
func NewOptions() *Options {
	return &Options{
		PoolsNamespace:         "kube-system",
		LeaderElectNamespace:   "kube-system",
		WebhookPort:            9443,
		MetricsBindAddress:     ":8080",
		HealthProbeBindAddress: ":8081",
		ReleaseGracePeriod:     5 * time.Minute,
		Workers:                4,
		// Some 760 kB of status.allocations (76 bytes a node): half etcd's
		// request limit, and a status every nv-ipam tool still reads.
		StatusAllocationsMaxNodes: 10000,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	daemon.AddAPIFlags(fs, &o.Kubeconfig, &o.PoolsNamespace)
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect a leader so that only one controller replica acts.")
	fs.StringVar(&o.LeaderElectNamespace, "leader-elect-namespace", o.LeaderElectNamespace, "Namespace of the leader election Lease.")
	fs.BoolVar(&o.Webhook, "webhook", o.Webhook, "Serve the validating admission webhooks for IPPool and CIDRPool.")
	fs.IntVar(&o.WebhookPort, "webhook-port", o.WebhookPort, "Port of the webhook server.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir,
		"Directory with tls.crt and tls.key for the webhook server; empty uses controller-runtime's default.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "Serve the metrics over HTTPS (a self-signed certificate) "+
		"only to clients whose bearer token the API server authenticates and lets get the non-resource URL /metrics "+
		"(TokenReview and SubjectAccessReview: deploy/monitoring grants them).")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "Address of the /healthz and /readyz endpoints; 0 disables them.")
	fs.StringVar(&o.PprofBindAddress, "pprof-bind-address", o.PprofBindAddress,
		"Address of the Go profiler's /debug/pprof endpoints; empty or 0 disables them.")
	fs.DurationVar(&o.ReleaseGracePeriod, "release-grace-period", o.ReleaseGracePeriod,
		"How long the block of a node that is deleted or no longer selected stays reserved before another node may get it; 0 releases at once.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Pools of each kind reconciled in parallel.")
	fs.DurationVar(&o.MinGrantAge, "min-grant-age", o.MinGrantAge,
		"How long a block taken from a node still counts for its daemon's held report at least (at least the grace period too); 0 is one minute. For tests.")
	_ = fs.MarkHidden("min-grant-age")
	fs.IntVar(&o.StatusAllocationsMaxNodes, "status-allocations-max-nodes", o.StatusAllocationsMaxNodes,
		"How many nodes' blocks a pool's status.allocations lists at most while blocks are delivered through NodeIPAM objects "+
			"(the NodeIPAM CRD is installed); above it the status lists none and each node's block is in its NodeIPAM only. 0 lists every block.")
}

// Validate checks the options.
func (o *Options) Validate() error {
	var errs []error
	if o.PoolsNamespace == "" {
		errs = append(errs, errors.New("--ippools-namespace must not be empty"))
	}
	if o.LeaderElect && o.LeaderElectNamespace == "" {
		errs = append(errs, errors.New("--leader-elect-namespace must not be empty with --leader-elect"))
	}
	if o.ReleaseGracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--release-grace-period %s must not be negative", o.ReleaseGracePeriod))
	}
	if o.MinGrantAge < 0 {
		errs = append(errs, fmt.Errorf("--min-grant-age %s must not be negative", o.MinGrantAge))
	}
	if o.StatusAllocationsMaxNodes < 0 {
		errs = append(errs, fmt.Errorf("--status-allocations-max-nodes %d must not be negative", o.StatusAllocationsMaxNodes))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers %d must be at least 1", o.Workers))
	}
	return errors.Join(errs...)
}

// Run runs the controller until ctx ends or a component fails.
func Run(ctx context.Context, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	// The caller's logger (main puts klog's there); a context without one runs quiet.
	// controller-runtime's own root logger must not be set to itself, which is what
	// log.FromContext returns for a bare context.
	logger := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(logger)
	logger.Info("starting ipam-controller", "version", version.String(), "poolsNamespace", o.PoolsNamespace,
		"releaseGracePeriod", o.ReleaseGracePeriod, "webhook", o.Webhook, "leaderElect", o.LeaderElect)

	cfg := o.RestConfig
	if cfg == nil {
		var err error
		if cfg, err = daemon.RESTConfig(o.Kubeconfig); err != nil {
			return err
		}
	}
	cfg = withoutClientRateLimit(cfg)
	if err := checkAPIServer(cfg); err != nil {
		return err
	}
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		return err
	}
	// Pools are cached in their namespace and watched with a decoder that reads a
	// watch event in one pass: a status write of a 5,000-node pool is some 400 kB,
	// which the controller reads back as its informer's echo. (Over a connection of
	// its own: the manager makes its HTTP client only when it is created.)
	cacheOpts, err := poolwatch.CacheOptions(cfg, scheme, o.PoolsNamespace)
	if err != nil {
		return err
	}
	// Nothing reads managedFields, which on a real Node are several kB (kubelet's
	// status fields) of every cached node's metadata, nor a Node's annotations
	// but hwipam's. A status update sent from a cached pool without them leaves
	// them as stored.
	cacheOpts.DefaultTransform = poolcontroller.CacheTransform()
	cacheOpts.ByObject[&nodeipamv1.NodeIPAM{}] = poolcontroller.NodeIPAMCacheOptions(o.PoolsNamespace)
	cacheOpts.ByObject[&nodeipamv1.PoolSpecs{}] = poolcontroller.NodeIPAMCacheOptions(o.PoolsNamespace)
	if err := nodeipamv1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering %s: %w", nodeipamv1.GroupVersion, err)
	}
	mopts := ctrl.Options{
		Scheme:                        scheme,
		Cache:                         cacheOpts,
		MapperProvider:                newMemoMapper,
		Metrics:                       daemon.MetricsOptions(o.MetricsBindAddress, o.MetricsSecure),
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		PprofBindAddress:              o.PprofBindAddress,
		LeaderElection:                o.LeaderElect,
		LeaderElectionNamespace:       o.LeaderElectNamespace,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionReleaseOnCancel: true,
		Logger:                        logger,
	}
	if o.Webhook {
		mopts.WebhookServer = webhook.NewServer(webhook.Options{Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.WebhookCertDir})
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	statusWriter, err := poolcontroller.NewStatusWriter(mgr.GetConfig(), mgr.GetHTTPClient(), scheme)
	if err != nil {
		return err
	}
	// The daemons' held reports the Nodes may no longer show, kept in a Lease
	// beside the leader election's across restarts (see poolcontroller.Memory).
	memory := &poolcontroller.Memory{Lease: types.NamespacedName{Namespace: o.LeaderElectNamespace, Name: poolcontroller.MemoryLeaseName},
		Reader: mgr.GetAPIReader(), Client: mgr.GetClient(), Log: logger.WithName("held-reports"), MinGrantAge: o.MinGrantAge}
	if err := mgr.Add(memory); err != nil {
		return fmt.Errorf("adding the held reports' keeper: %w", err)
	}
	// Each node's blocks, in its NodeIPAM (when the CRD is installed).
	delivery := &poolcontroller.Delivery{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Cache: mgr.GetCache(),
		Namespace: o.PoolsNamespace, Log: logger.WithName("nodeipam"), Memory: memory}
	// The blocks retired from nodes are kept in their records, and read back
	// from them before the first plan.
	memory.Records = delivery
	if err := mgr.Add(delivery); err != nil {
		return fmt.Errorf("adding the NodeIPAM writer: %w", err)
	}
	for _, kind := range []string{v1alpha1.KindIPPool, v1alpha1.KindCIDRPool} {
		r := &poolcontroller.Reconciler{
			Delivery:           delivery,
			MaxListed:          o.StatusAllocationsMaxNodes,
			Memory:             memory,
			Client:             mgr.GetClient(),
			Reader:             mgr.GetAPIReader(),
			StatusWriter:       statusWriter,
			Recorder:           mgr.GetEventRecorder("ipam-controller"),
			Kind:               kind,
			ReleaseGracePeriod: o.ReleaseGracePeriod,
		}
		if err := r.SetupWithManager(mgr, o.PoolsNamespace, o.Workers); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	// Ready once the informers (pools, node metadata) have synced, and, with
	// --webhook, once the webhook server is serving.
	ready := func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 200*time.Millisecond)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced yet")
		}
		if o.Webhook {
			return mgr.GetWebhookServer().StartedChecker()(req)
		}
		return nil
	}
	if o.Webhook {
		if err := v1alpha1.SetupWebhooksWithManager(mgr, mgr.GetAPIReader()); err != nil {
			return err
		}
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the controller manager: %w", err)
	}
	logger.Info("ipam-controller stopped")
	return nil
}

// withoutClientRateLimit turns client-go's default rate limit off when cfg sets
// none: 5 requests/s in bursts of 10 would queue the status writes of a dozen pools
// changed together behind each other. Like controller-runtime's own config loader
// (which nv-ipam's controller uses, also with --kubeconfig), it relies on the API
// server's priority and fairness instead. A limit set in cfg is kept.
func withoutClientRateLimit(cfg *rest.Config) *rest.Config {
	if cfg.QPS != 0 || cfg.RateLimiter != nil {
		return cfg
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = -1
	return cfg
}

// checkAPIServer fails fast, with the address, when the API server cannot be
// reached, instead of leaving informers to retry until their sync timeout.
func checkAPIServer(cfg *rest.Config) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = 15 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return fmt.Errorf("creating a client for the API server at %s: %w", cfg.Host, err)
	}
	if _, err := dc.ServerVersion(); err != nil {
		return fmt.Errorf("cannot reach the Kubernetes API server at %s (check --kubeconfig and that the server is up): %w",
			cfg.Host, err)
	}
	return nil
}
