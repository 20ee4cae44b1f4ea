// Package daemon is what hwipam's long-running processes (ipam-controller,
// ipam-node) share around their Run: parsing flags with the component-base
// logging flags, the signal context, the exit code, and finding the API server.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hwipam/hwipam/pkg/version"
)

// Main parses args into the flags addFlags registers (plus --version and the
// logging flags), runs run until SIGINT or SIGTERM, and returns the process exit
// code: 0 on a clean stop, 1 when run failed, 2 for bad flags.
func Main(name string, args []string, addFlags func(*pflag.FlagSet), run func(context.Context) error) int {
	logCfg := logsapi.NewLoggingConfiguration()
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	addFlags(fs)
	logsapi.AddFlags(logCfg, fs)
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, name, version.String())
		return 0
	}
	if err := logsapi.ValidateAndApply(logCfg, nil); err != nil {
		fmt.Fprintf(os.Stderr, "%s: logging flags: %v\n", name, err)
		return 2
	}
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := run(ctx); err != nil {
		klog.Background().Error(err, name+" failed")
		return 1
	}
	return 0
}

// AddAPIFlags registers the flags both daemons take for the API server and the
// pools: --kubeconfig and --ippools-namespace.
func AddAPIFlags(fs *pflag.FlagSet, kubeconfig, poolsNamespace *string) {
	fs.StringVar(kubeconfig, "kubeconfig", *kubeconfig,
		"Path to a kubeconfig; empty uses $KUBECONFIG, the in-cluster config, or ~/.kube/config.")
	fs.StringVar(poolsNamespace, "ippools-namespace", *poolsNamespace, "Namespace of the IPPool and CIDRPool objects.")
}

// RESTConfig loads the API server configuration: from kubeconfig when set, else
// from $KUBECONFIG, the in-cluster configuration or ~/.kube/config.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading --kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes API configuration found (set --kubeconfig or $KUBECONFIG, or run in a pod): %w", err)
	}
	return cfg, nil
}
