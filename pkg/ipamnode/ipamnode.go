// Package ipamnode runs the ipam-node daemon: the durable store, the allocation
// state, the gRPC API on a unix socket, the pool sync from the API server, the
// stale-allocation cleaner, the node's pools-in-use annotation and its NIC labels
// (nicdiscovery, published by server-side apply), all under one
// errgroup so that any fatal error stops the process with a non-zero exit.
// Nothing on the allocation path calls the API server: with the API server down
// the daemon keeps allocating from the blocks it last learned. At start those
// blocks serve only once a listing of the pools has confirmed them, or once the
// API server has failed to answer (see poolSync).
package ipamnode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	nodev1 "github.com/hwipam/hwipam/api/grpc/nvidia/ipam/node/v1"
	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/ipamwire"
	"github.com/hwipam/hwipam/pkg/nicdra"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/pkg/nodeservice"
	"github.com/hwipam/hwipam/pkg/store"
	"github.com/hwipam/hwipam/pkg/version"
)

// RBAC of the node daemon (deploy/rbac/node/role.yaml is generated from these
// markers): exactly the verbs its API calls use, checked by test/privilege with
// `kubectl auth can-i --list`; see docs/rbac.md. Pools (list, watch: the informers and
// the start-up listing) and pods (list, watch: the stale-allocation cleaner's informer
// of this node's pods; get: its confirmation before a release) are within what
// network-operator grants. Nodes (get, patch: the NIC labels by server-side apply and
// the pools-in-use annotations by merge patch) are optional and degrade to a warning;
// deploy/policy's ValidatingAdmissionPolicy narrows patch to the daemon's own Node and
// its own keys. NodeFeatures (--nic-labels=nodefeature: get, create and patch by
// server-side apply, delete when no NIC is left) are granted in the DaemonSet's
// namespace only, where the daemon writes them. NodeIPAMs and PoolSpecs (list, watch:
// its own NodeIPAM and the namespace's PoolSpecs, by name) are how the controller
// delivers its blocks; without them (network-operator's role) it reads the pools'
// status as nv-ipam does.
// +kubebuilder:rbac:groups=nv-ipam.nvidia.com,resources=ippools;cidrpools,verbs=list;watch
// +kubebuilder:rbac:groups=ipam.hwipam.io,resources=nodeipams;poolspecs,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;patch
// +kubebuilder:rbac:groups=nfd.k8s-sigs.io,namespace=kube-system,resources=nodefeatures,verbs=get;create;patch;delete

// shutdownGrace bounds how long in-flight requests may take after SIGTERM.
const shutdownGrace = 10 * time.Second

// Run runs the daemon until ctx ends or a part fails.
func Run(ctx context.Context, o *Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	logger := logr.FromContextOrDiscard(ctx)
	ctrl.SetLogger(logger)
	tuneGC(logger)
	var err error
	logger.Info("starting ipam-node", "version", version.String(), "node", o.NodeName, "store", o.StoreFile,
		"bindAddress", o.BindAddress, "poolsNamespace", o.PoolsNamespace)

	var rails nicdiscovery.Rails
	var railsContent []byte
	if o.RailConfig != "" {
		if railsContent, err = os.ReadFile(o.RailConfig); err != nil {
			return fmt.Errorf("reading the rail map: %w", err)
		}
		if rails, err = nicdiscovery.ParseRails(railsContent, o.RailConfig); err != nil {
			return err
		}
	}
	pluginSum, confSum, err := installCNI(&o.CNI)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.StoreFile), 0o700); err != nil {
		return fmt.Errorf("creating the store's directory: %w", err)
	}
	st, err := store.Open(o.StoreFile, store.Options{})
	if err != nil {
		return err
	}
	defer func() {
		if err := st.Close(); err != nil {
			logger.Error(err, "closing the store")
		}
	}()
	mgrState, err := nodealloc.New(st, o.NodeName)
	if err != nil {
		return err
	}
	metricState := registerMetrics(mgrState, st)
	keepLegacyDRA := markLegacyDRA(ctx, o.StoreFile, mgrState, logger)

	lis, err := listen(o.BindAddress)
	if err != nil {
		return err
	}
	interceptors := []grpc.UnaryServerInterceptor{recoverPanics(logger), requestMetrics, requestLogger(logger)}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(interceptors...))
	svc := &nodeservice.Service{Manager: mgrState, Info: &infov1.GetInfoResponse{Version: version.String(), NodeName: o.NodeName,
		StoreFile: o.StoreFile, CniBinDir: o.CNI.BinDir, CniConfDir: o.CNI.ConfDir, PluginSha256: pluginSum,
		PoolsNamespace: o.PoolsNamespace, ConfSha256: confSum, SysfsRoot: o.SysfsRoot, RailConfig: o.RailConfig,
		RailConfigContent: string(railsContent), NicLabels: o.NICLabels}}
	scan := inventoryCache(o.SysfsRoot)
	nics := &nicView{rails: rails, scan: scan}
	svc.NICs = nics
	nodev1.RegisterIPAMServiceServer(srv, svc)
	infov1.RegisterNodeInfoServiceServer(srv, svc)
	// The plugin's compact endpoint, beside a unix gRPC socket.
	var fast *nodeservice.FastServer
	var fastLis net.Listener
	if network, addr, _ := parseBindAddress(o.BindAddress); network == "unix" && o.FastEndpoint {
		fastAddr := ipamwire.FastSocketPath(addr)
		if fastLis, err = listen("unix://" + fastAddr); err != nil {
			_ = lis.Close()
			return fmt.Errorf("the plugin's compact endpoint: %w", err)
		}
		fast = nodeservice.NewFastServer(logger.WithName("fast-endpoint"), interceptors...)
		fast.Register(&nodev1.IPAMService_ServiceDesc, svc)
		fast.Register(&infov1.NodeInfoService_ServiceDesc, svc)
	}

	cfg := o.RestConfig
	if cfg == nil {
		if cfg, err = daemon.RESTConfig(o.Kubeconfig); err != nil {
			return err
		}
	}
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		return err
	}
	if err := nodeipamv1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("registering %s: %w", nodeipamv1.GroupVersion, err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                daemon.MetricsOptions(o.MetricsBindAddress, o.MetricsSecure),
		HealthProbeBindAddress: o.HealthProbeBindAddress,
		Logger:                 logger,
		// A fixed mapper: the daemon must start, and serve its stored blocks, while
		// the API server is unreachable; discovery would make that fail.
		MapperProvider: func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return restMapper(), nil },
	})
	if err != nil {
		return fmt.Errorf("creating the controller manager: %w", err)
	}
	// The pool sync kicks the annotator when a block changes, so that the controller
	// learns soon that this node stopped allocating from a block it took away.
	blocksChanged := make(chan struct{}, 1)
	// The node's blocks come from its NodeIPAM, watched by name; where there is
	// none, from the pools, cached in their namespace and watched with a decoder
	// that reads each event in one pass (every status write of every pool then
	// reaches every node, some 400 kB for a 5,000-node pool).
	watcher, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: mgr.GetRESTMapper(), HTTPClient: mgr.GetHTTPClient()})
	if err != nil {
		return fmt.Errorf("creating the NodeIPAM watch client: %w", err)
	}
	pools := &poolSync{reader: mgr.GetAPIReader(), watcher: watcher, manager: mgrState, node: o.NodeName,
		legacy: newLegacyCache(cfg, scheme, mgr.GetRESTMapper(), o.PoolsNamespace), log: logger.WithName("poolsync"),
		namespace: o.PoolsNamespace, changed: blocksChanged, kick: make(chan struct{}, 1)}
	railSel := newRailSelector(pools, mgrState, o.SysfsRoot, o.PoolsNamespace, rails, scan)
	metricState.setRailOf(func(key string) string { return railSel.RailOf(v1alpha1.SplitPoolKey(key)) })
	svc.Rails = railSel
	// Every CNI allocation that names a device records its port, with or
	// without --dra (the driver may be turned on later).
	ports := &cniPorts{loc: railSel.resolver.Locator}
	svc.Ports = ports
	var dra *nicdra.Driver
	if !o.DRA {
		// A status file left by an earlier --dra run would tell ipamctl that a
		// driver runs here (the checkpoint stays: its claims still hold
		// addresses, which ipamctl check reports).
		if err := os.Remove(nicdra.StatusFile(draCheckpoint(o.StoreFile))); err == nil {
			logger.Info("removed the DRA driver's status file: ipam-node runs without --dra")
		}
	}
	if o.DRA {
		if dra, err = newDRADriver(o, cfg, mgrState, pools, rails, scan, logger); err != nil {
			return err
		}
		kick := make(chan struct{}, 1)
		pools.railsChanged, dra.Kick = kick, kick
		ports.ledger, ports.kick = dra.Preparer.Ledger, kick
		registerDRAMetrics()
	}
	if o.CleanupInterval > 0 {
		podMeta, err := metadata.NewForConfigAndClient(cfg, mgr.GetHTTPClient())
		if err != nil {
			return fmt.Errorf("creating the pod metadata client: %w", err)
		}
		cleanupLog := logger.WithName("cleanup")
		if err := mgr.Add(&cleaner{reader: mgr.GetAPIReader(), watchPods: nodePodWatcher(podMeta, o.NodeName, cleanupLog),
			manager: mgrState, interval: o.CleanupInterval, misses: o.CleanupMisses, log: cleanupLog,
			keepLegacyDRA: keepLegacyDRA}); err != nil {
			return fmt.Errorf("adding the stale-allocation cleaner: %w", err)
		}
	}
	if o.AnnotationInterval > 0 {
		if err := mgr.Add(&annotator{client: mgr.GetClient(), reader: mgr.GetAPIReader(), manager: mgrState, node: o.NodeName,
			interval: o.AnnotationInterval, kick: blocksChanged, log: logger.WithName("pools-in-use")}); err != nil {
			return fmt.Errorf("adding the pools-in-use annotator: %w", err)
		}
	}
	// SIGHUP asks for a NIC rescan; it is caught for the daemon's whole life, so
	// that it never ends the process (its default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if o.NICLabels != NICLabelsOff {
		if err := mgr.Add(&nicLabeler{client: mgr.GetClient(), reader: mgr.GetAPIReader(), node: o.NodeName, mode: o.NICLabels,
			namespace: o.NodeFeatureNamespace, root: o.SysfsRoot, rails: rails, interval: o.NICRescanInterval, hup: hup, view: nics,
			log: logger.WithName("nic-labels"), prepared: func() map[string]string { return preparedNetdevs(o.StoreFile) }}); err != nil {
			return fmt.Errorf("adding the NIC labeler: %w", err)
		}
	} else {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					logger.Info("SIGHUP ignored: --nic-labels=off, nothing to rescan")
				}
			}
		}()
	}
	var serving atomic.Bool
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", func(*http.Request) error {
		if !serving.Load() {
			return errors.New("the gRPC socket is not serving yet")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		serving.Store(true)
		if err := srv.Serve(lis); err != nil {
			return fmt.Errorf("serving gRPC on %s: %w", o.BindAddress, err)
		}
		return nil
	})
	if fast != nil {
		g.Go(func() error {
			if err := fast.Serve(fastLis); err != nil {
				return fmt.Errorf("serving the compact endpoint on %s: %w", fastLis.Addr(), err)
			}
			return nil
		})
	}
	g.Go(func() error {
		pools.run(gctx)
		return nil
	})
	if dra != nil {
		g.Go(func() error { return runDRA(gctx, dra) })
	}
	g.Go(func() error {
		if err := mgr.Start(gctx); err != nil {
			return fmt.Errorf("running pool sync, cleanup and endpoints: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		serving.Store(false)
		stopped := make(chan struct{})
		go func() {
			var wg sync.WaitGroup
			if fast != nil {
				wg.Go(func() { fast.Stop(shutdownGrace) })
			}
			srv.GracefulStop()
			wg.Wait()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(shutdownGrace):
			srv.Stop()
		}
		return nil
	})
	err = g.Wait()
	logger.Info("ipam-node stopped", "error", err)
	return err
}

// listen opens the gRPC listener. A unix socket's directory is created, a stale
// socket file is replaced (anything else at the path is an error), and the socket
// gets mode 0600.
func listen(bindAddress string) (net.Listener, error) {
	network, addr, err := parseBindAddress(bindAddress)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		if err := os.MkdirAll(filepath.Dir(addr), 0o700); err != nil {
			return nil, fmt.Errorf("creating the socket's directory: %w", err)
		}
		if fi, err := os.Lstat(addr); err == nil {
			if fi.Mode().Type() != fs.ModeSocket {
				return nil, fmt.Errorf("--bind-address %s: the path exists and is not a socket; remove it or choose another path", addr)
			}
			if err := os.Remove(addr); err != nil {
				return nil, fmt.Errorf("removing the stale socket %s: %w", addr, err)
			}
		}
	}
	lis, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", bindAddress, err)
	}
	if network == "unix" {
		if err := os.Chmod(addr, 0o600); err != nil {
			_ = lis.Close()
			return nil, fmt.Errorf("setting mode 0600 on %s: %w", addr, err)
		}
	}
	return lis, nil
}

// restMapper knows the few kinds the daemon touches.
func restMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for _, k := range []string{"IPPool", "IPPoolList", "CIDRPool", "CIDRPoolList"} {
		m.Add(v1alpha1.GroupVersion.WithKind(k), meta.RESTScopeNamespace)
	}
	for _, k := range []string{"NodeIPAM", "NodeIPAMList"} {
		m.Add(nodeipamv1.GroupVersion.WithKind(k), meta.RESTScopeNamespace)
	}
	// "PoolSpecs" is plural already: the guess would say "poolspecses".
	poolSpecs := nodeipamv1.GroupVersion.WithResource("poolspecs")
	m.AddSpecific(nodeipamv1.GroupVersion.WithKind("PoolSpecs"), poolSpecs, poolSpecs, meta.RESTScopeNamespace)
	m.AddSpecific(nodeipamv1.GroupVersion.WithKind("PoolSpecsList"), poolSpecs, poolSpecs, meta.RESTScopeNamespace)
	m.Add(authorizationv1.SchemeGroupVersion.WithKind("SelfSubjectAccessReview"), meta.RESTScopeRoot)
	m.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	m.Add(corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot)
	m.Add(NodeFeatureGVK, meta.RESTScopeNamespace)
	return m
}
