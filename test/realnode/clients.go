package realnode

import (
	"fmt"

	nadclient "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// Client is a controller-runtime client that knows the core types, IPPool/CIDRPool and NodeIPAM.
func (c *Cluster) Client() (client.Client, error) {
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
