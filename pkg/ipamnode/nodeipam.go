package ipamnode

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/poolwatch"
)

// legacyCache starts a cache of the pools of the namespace that runs until ctx
// ends and calls kick after each pool event; it returns a reader of the cache
// once it has synced.
type legacyCache func(ctx context.Context, kick func()) (client.Reader, error)

func newLegacyCache(cfg *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper, namespace string) legacyCache {
	return func(ctx context.Context, kick func()) (client.Reader, error) {
		opts, err := poolwatch.CacheOptions(cfg, scheme, namespace)
		if err != nil {
			return nil, err
		}
		opts.Scheme, opts.Mapper = scheme, mapper
		c, err := cache.New(cfg, opts)
		if err != nil {
			return nil, fmt.Errorf("creating the pools' cache: %w", err)
		}
		handler := toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { kick() },
			UpdateFunc: func(any, any) { kick() },
			DeleteFunc: func(any) { kick() },
		}
		for _, obj := range []client.Object{&v1alpha1.IPPool{}, &v1alpha1.CIDRPool{}} {
			inf, err := c.GetInformer(ctx, obj)
			if err != nil {
				return nil, fmt.Errorf("watching pools: %w", err)
			}
			if _, err := inf.AddEventHandler(handler); err != nil {
				return nil, fmt.Errorf("watching pools: %w", err)
			}
		}
		go func() { _ = c.Start(ctx) }()
		if !c.WaitForCacheSync(ctx) {
			return nil, ctx.Err()
		}
		return c, nil
	}
}

const (
	// recheckInterval is how often a daemon without NodeIPAMs (no CRD, no RBAC)
	// looks whether they have come.
	recheckInterval = time.Minute
	// nodeIPAMWatchTimeout bounds one watch of the NodeIPAM (randomised up to
	// twice as long), after which it is listed and watched again.
	nodeIPAMWatchTimeout = 5 * time.Minute
)

// run keeps this node's blocks in line with the controller's until ctx ends.
// It reads the node's NodeIPAM, listed and watched by name, so that no other
// node's change reaches it. While there is none (a controller that has not
// written it yet, or before hwipam 0.9), and where NodeIPAMs cannot be read
// (network-operator's CRDs and RBAC), the pools are watched and their status
// read instead, as nv-ipam does; that stops once the NodeIPAM is there.
//
// At start the first answer is awaited startupSyncTimeout at most; without one
// the blocks kept in the store serve until the API server answers.
func (s *poolSync) run(ctx context.Context) {
	logger := s.log
	ctx = log.IntoContext(ctx, logger)
	var stopLegacy context.CancelFunc
	startLegacy := func() {
		if stopLegacy != nil {
			return
		}
		lctx, cancel := context.WithCancel(ctx)
		stopLegacy = cancel
		go s.runLegacy(lctx)
	}
	defer func() {
		if stopLegacy != nil {
			stopLegacy()
		}
	}()
	// The PoolSpecs first: a NodeIPAM read without them would send the daemon
	// to the pools' status for a moment (some 400 kB a pool at 5,000 nodes).
	sctx, cancel := context.WithTimeout(ctx, startupSyncTimeout)
	s.readSpecs(sctx)
	cancel()
	go s.watchSpecs(ctx)
	synced, storedServe, noCRDLogged := false, false, false
	for ctx.Err() == nil {
		lctx, cancel := ctx, context.CancelFunc(func() {})
		if !synced {
			lctx, cancel = context.WithTimeout(ctx, startupSyncTimeout)
		}
		var list nodeipamv1.NodeIPAMList
		err := s.mayRead(lctx, "nodeipams")
		if err == nil {
			err = s.reader.List(lctx, &list, client.InNamespace(s.namespace), client.MatchingFields{"metadata.name": s.node})
		}
		switch {
		case err == nil:
			noCRDLogged = false
			applied := len(list.Items) > 0 && s.deliver(ctx, &list.Items[0])
			if applied {
				synced = true
				if stopLegacy != nil {
					stopLegacy()
					stopLegacy = nil
					logger.Info("this node's NodeIPAM is there: no longer watching the pools' status")
				}
			} else if len(list.Items) == 0 || !s.hasSpecs() {
				// No NodeIPAM yet, or no PoolSpecs to read it with.
				s.setDelivered(false)
				if !synced {
					// Not written yet: the pools' status, as before NodeIPAMs.
					if n, err := s.sync(lctx, s.reader); err == nil {
						synced = true
						logger.Info("pools synced from the API server (this node has no NodeIPAM yet)", "blocks", n)
					}
				}
				startLegacy()
			}
			cancel()
			if !synced && !storedServe {
				storedServe = true
				logger.Info("no usable blocks from the API server yet: allocating from the blocks kept in the store until there are",
					"storedBlocks", s.manager.UseStoredBlocks())
			}
			s.watch(ctx, list.ResourceVersion, stopLegacy != nil)
			continue
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || errors.Is(err, errNoRights):
			cancel()
			s.setDelivered(false)
			if !noCRDLogged {
				noCRDLogged = true
				logger.Info("NodeIPAMs cannot be read here (the CRD is not installed, or this daemon's RBAC does not grant it): "+
					"reading the blocks from the pools' status", "reason", err.Error())
			}
			if !synced {
				lctx, cancel = context.WithTimeout(ctx, startupSyncTimeout)
				n, err := s.sync(lctx, s.reader)
				cancel()
				if err == nil {
					synced = true
					logger.Info("pools synced from the API server", "blocks", n)
				}
			}
			startLegacy()
			if !synced && !storedServe {
				storedServe = true
				logger.Info("the API server did not answer: allocating from the blocks kept in the store until it does",
					"storedBlocks", s.manager.UseStoredBlocks())
			}
			wait(ctx, recheckInterval)
		default:
			cancel()
			if !synced && !storedServe {
				storedServe = true
				logger.Info("the API server did not answer: allocating from the blocks kept in the store until it does",
					"storedBlocks", s.manager.UseStoredBlocks(), "error", err.Error())
			} else {
				logger.V(1).Info("the API server still does not answer", "error", err.Error())
			}
			wait(ctx, startupRetryInterval)
		}
	}
}

// errNoRights says that this daemon's role does not let it read NodeIPAMs or
// PoolSpecs (network-operator's does not).
var errNoRights = errors.New("this daemon's role does not grant list and watch on them")

// mayRead returns errNoRights when the API server says this daemon may not list
// and watch resource (of ipam.hwipam.io) in its namespace: asked first, so that
// under network-operator's roles no request is refused.
func (s *poolSync) mayRead(ctx context.Context, resource string) error {
	denied, err := daemon.Allowed(ctx, s.watcher, nodeipamv1.GroupVersion.Group, resource, s.namespace, "list", "watch")
	if err == nil && denied != "" {
		return errNoRights
	}
	return nil // asking failed: the request itself will tell
}

func wait(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (s *poolSync) setDelivered(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivered = v
}

// deliver applies the node's NodeIPAM when the controller alone wrote it and the
// pools' specs are there, and reports whether it did.
func (s *poolSync) deliver(ctx context.Context, obj *nodeipamv1.NodeIPAM) bool {
	if !nodeipamv1.OwnedByController(obj) {
		s.problems.warn(s.log, "this node's NodeIPAM was written by someone other than the ipam-controller: "+
			"its blocks are not used until the controller writes it again (it does at once when it runs)", nil,
			"nodeipam", obj.Namespace+"/"+obj.Name, "resourceVersion", obj.ResourceVersion)
		return false
	}
	s.mu.Lock()
	s.last = obj
	s.mu.Unlock()
	if !s.hasSpecs() {
		return false
	}
	n, err := s.syncNodeIPAM(ctx, obj)
	if err != nil {
		s.log.Error(err, "applying this node's NodeIPAM")
		return true
	}
	s.log.V(1).Info("blocks synced from this node's NodeIPAM", "blocks", n, "resourceVersion", obj.ResourceVersion)
	return true
}

// watch watches the node's NodeIPAM from rv and applies each version until the
// watch ends, or, while the pools are watched too (legacy), until one is applied.
func (s *poolSync) watch(ctx context.Context, rv string, legacy bool) {
	timeout := int64((nodeIPAMWatchTimeout + time.Duration(rand.Int64N(int64(nodeIPAMWatchTimeout)))).Seconds())
	w, err := s.watcher.Watch(ctx, &nodeipamv1.NodeIPAMList{}, client.InNamespace(s.namespace),
		client.MatchingFields{"metadata.name": s.node},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, TimeoutSeconds: &timeout}})
	if err != nil {
		s.log.V(1).Info("watching this node's NodeIPAM failed; will list it again", "error", err.Error())
		wait(ctx, startupRetryInterval)
		return
	}
	defer w.Stop()
	for {
		var ev watch.Event
		select {
		case <-s.kick:
			if legacy {
				return // the PoolSpecs applied the NodeIPAM: listed again, which ends the pools' watch
			}
			continue
		case e, open := <-w.ResultChan():
			if !open {
				return
			}
			ev = e
		}
		obj, ok := ev.Object.(*nodeipamv1.NodeIPAM)
		switch {
		case ev.Type == watch.Error || !ok:
			return // listed and watched again
		case ev.Type == watch.Deleted:
			s.log.Info("this node's NodeIPAM was deleted: keeping the blocks it gave until the controller writes it again")
		default:
			if s.deliver(ctx, obj) && legacy {
				return // listed again, which ends the pools' watch
			}
		}
	}
}

func (s *poolSync) hasSpecs() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.specs != nil
}

// watchSpecs keeps the pools' specs from the namespace's PoolSpecs, listed and
// watched by name, until ctx ends, and applies the last NodeIPAM again after
// each change. A PoolSpecs someone other than the controller wrote is not used
// (the last one stays); one deleted leaves the specs as they are.
func (s *poolSync) watchSpecs(ctx context.Context) {
	byName := client.MatchingFields{"metadata.name": nodeipamv1.PoolSpecsName}
	for ctx.Err() == nil {
		var list nodeipamv1.PoolSpecsList
		err := s.mayRead(ctx, "poolspecs")
		if err == nil {
			err = s.reader.List(ctx, &list, client.InNamespace(s.namespace), byName)
		}
		switch {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || errors.Is(err, errNoRights):
			s.log.V(1).Info("PoolSpecs cannot be read here; looking again later", "reason", err.Error())
			wait(ctx, recheckInterval)
			continue
		case err != nil:
			s.log.V(1).Info("listing the PoolSpecs failed; will retry", "error", err.Error())
			wait(ctx, startupRetryInterval)
			continue
		}
		if len(list.Items) > 0 {
			s.useSpecs(ctx, &list.Items[0])
		}
		timeout := int64((nodeIPAMWatchTimeout + time.Duration(rand.Int64N(int64(nodeIPAMWatchTimeout)))).Seconds())
		w, err := s.watcher.Watch(ctx, &nodeipamv1.PoolSpecsList{}, client.InNamespace(s.namespace), byName,
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion, TimeoutSeconds: &timeout}})
		if err != nil {
			wait(ctx, startupRetryInterval)
			continue
		}
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(*nodeipamv1.PoolSpecs)
			if ev.Type == watch.Error || !ok {
				break
			}
			if ev.Type != watch.Deleted {
				s.useSpecs(ctx, obj)
			}
		}
		w.Stop()
	}
}

// readSpecs reads the PoolSpecs once, if it can.
func (s *poolSync) readSpecs(ctx context.Context) {
	if s.mayRead(ctx, "poolspecs") != nil {
		return
	}
	var list nodeipamv1.PoolSpecsList
	err := s.reader.List(ctx, &list, client.InNamespace(s.namespace), client.MatchingFields{"metadata.name": nodeipamv1.PoolSpecsName})
	if err == nil && len(list.Items) > 0 {
		s.useSpecs(ctx, &list.Items[0])
	}
}

// useSpecs takes the pools' specs from obj when the controller alone wrote it,
// and applies the last NodeIPAM with them.
func (s *poolSync) useSpecs(ctx context.Context, obj *nodeipamv1.PoolSpecs) {
	if !nodeipamv1.OwnedByController(obj) {
		s.problems.warn(s.log, "the PoolSpecs were written by someone other than the ipam-controller: the pools' specs "+
			"last written by the controller stay in use until it writes them again (it does at once when it runs)", nil,
			"poolspecs", obj.Namespace+"/"+obj.Name, "resourceVersion", obj.ResourceVersion)
		return
	}
	specs := make(map[railKey]nodeipamv1.PoolSpec, len(obj.Spec.Pools))
	for _, p := range obj.Spec.Pools {
		specs[railKey{p.Kind, p.Pool}] = p
	}
	s.mu.Lock()
	s.specs = specs
	last := s.last
	s.mu.Unlock()
	if last == nil {
		return
	}
	if _, err := s.syncNodeIPAM(ctx, last); err != nil {
		s.log.Error(err, "applying this node's NodeIPAM")
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// runLegacy reads the blocks from the pools' status until ctx ends.
func (s *poolSync) runLegacy(ctx context.Context) {
	kicks := make(chan struct{}, 1)
	kick := func() {
		select {
		case kicks <- struct{}{}:
		default:
		}
	}
	r, err := s.legacy(ctx, kick)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error(err, "watching the pools")
		}
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-kicks:
		}
		n, err := s.sync(ctx, r)
		if err != nil {
			s.log.Error(err, "syncing the pools' blocks")
			continue
		}
		s.log.V(1).Info("pools synced", "blocks", n)
	}
}
