// Command ipam-node is the node daemon: it hands out addresses from this node's
// blocks over gRPC and keeps them durably on the host.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/hwipam/hwipam/pkg/ipamnode"
	"github.com/hwipam/hwipam/pkg/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	opts := ipamnode.NewOptions()
	logCfg := logsapi.NewLoggingConfiguration()
	fs := pflag.NewFlagSet("ipam-node", pflag.ContinueOnError)
	opts.AddFlags(fs)
	logsapi.AddFlags(logCfg, fs)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "ipam-node:", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, "ipam-node", version.String())
		return 0
	}
	if err := logsapi.ValidateAndApply(logCfg, nil); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-node: logging flags:", err)
		return 2
	}
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := ipamnode.Run(ctx, opts); err != nil {
		klog.Background().Error(err, "ipam-node failed")
		return 1
	}
	return 0
}
