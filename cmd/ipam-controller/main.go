// Command ipam-controller cuts IPPools and CIDRPools into per-node blocks.
package main

import (
	"context"
	"os"

	"github.com/hwipam/hwipam/pkg/daemon"
	"github.com/hwipam/hwipam/pkg/ipamcontroller"
)

func main() {
	opts := ipamcontroller.NewOptions()
	os.Exit(daemon.Main("ipam-controller", os.Args[1:], opts.AddFlags, func(ctx context.Context) error {
		return ipamcontroller.Run(ctx, opts)
	}))
}
