package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	nodeipamv1 "github.com/hwipam/hwipam/api/nodeipam/v1alpha1"
	"github.com/hwipam/hwipam/api/v1alpha1"
)

// NADClient is a typed client for NetworkAttachmentDefinitions on this node.
func (c *Cluster) NADClient() (nadclient.Interface, error) {
	cs, err := nadclient.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("NetworkAttachmentDefinition client: %w", err)
	}
	return cs, nil
}

// clientLogOnce gives controller-runtime's log its sink once per process.
var clientLogOnce sync.Once

// quietClientLog sends what controller-runtime's clients log to the node's
// logs/clients.log (nowhere without a run directory). Without a logger,
// controller-runtime prints "log.SetLogger(...) was never called" with a
// goroutine stack trace at the first client, in the middle of `make demo`'s
// output, which reads as a crash.
func (c *Cluster) quietClientLog() {
	clientLogOnce.Do(func() {
		l := logr.Discard()
		if c.Dir != "" {
			if f, err := os.OpenFile(filepath.Join(c.Dir, "logs", "clients.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
				var mu sync.Mutex
				l = funcr.New(func(prefix, args string) {
					mu.Lock()
					defer mu.Unlock()
					fmt.Fprintln(f, prefix, args)
				}, funcr.Options{})
			}
		}
		ctrllog.SetLogger(l)
	})
}

// Client is a controller-runtime client that knows the core types, IPPool/CIDRPool and NodeIPAM.
func (c *Cluster) Client() (client.Client, error) {
	c.quietClientLog()
	scheme, err := v1alpha1.NewScheme()
	if err != nil {
		return nil, err
	}
	if err := nodeipamv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return cl, nil
}
