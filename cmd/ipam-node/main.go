// Command ipam-node is the node daemon: it hands out addresses from this node's blocks over gRPC and keeps them durably on the host.
package main

import (
	"context"
	"os"

	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/ipamnode"
)

func main() {
	opts := ipamnode.NewOptions()
	os.Exit(daemon.Main("ipam-node", os.Args[1:], opts.AddFlags, func(ctx context.Context) error {
		return ipamnode.Run(ctx, opts)
	}))
}
