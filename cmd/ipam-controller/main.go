// Command ipam-controller cuts IPPools and CIDRPools into per-node blocks.
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

	"github.com/hwipam/hwipam/pkg/ipamcontroller"
	"github.com/hwipam/hwipam/pkg/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	opts := ipamcontroller.NewOptions()
	logCfg := logsapi.NewLoggingConfiguration()
	fs := pflag.NewFlagSet("ipam-controller", pflag.ContinueOnError)
	opts.AddFlags(fs)
	logsapi.AddFlags(logCfg, fs)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "ipam-controller:", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, "ipam-controller", version.String())
		return 0
	}
	if err := logsapi.ValidateAndApply(logCfg, nil); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-controller: logging flags:", err)
		return 2
	}
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := ipamcontroller.Run(ctx, opts); err != nil {
		klog.Background().Error(err, "ipam-controller failed")
		return 1
	}
	return 0
}
