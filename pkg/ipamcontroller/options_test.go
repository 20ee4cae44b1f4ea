package ipamcontroller_test

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"github.com/hwipam/hwipam/pkg/ipamcontroller"
)

func TestFlagsAndDefaults(t *testing.T) {
	o := ipamcontroller.NewOptions()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	// nv-ipam's flag names must parse unchanged.
	if err := fs.Parse([]string{"--ippools-namespace=nvidia-network-operator", "--leader-elect", "--leader-elect-namespace=x",
		"--webhook", "--metrics-bind-address=:9090", "--health-probe-bind-address=:9091", "--kubeconfig=/k",
		"--release-grace-period=0", "--pprof-bind-address=127.0.0.1:6060"}); err != nil {
		t.Fatal(err)
	}
	if o.PoolsNamespace != "nvidia-network-operator" || !o.LeaderElect || o.LeaderElectNamespace != "x" || !o.Webhook ||
		o.MetricsBindAddress != ":9090" || o.HealthProbeBindAddress != ":9091" || o.Kubeconfig != "/k" || o.ReleaseGracePeriod != 0 ||
		o.PprofBindAddress != "127.0.0.1:6060" {
		t.Errorf("parsed options = %+v", o)
	}
	if d := ipamcontroller.NewOptions(); d.PoolsNamespace != "kube-system" || d.ReleaseGracePeriod != 5*time.Minute ||
		d.MetricsBindAddress != ":8080" || d.HealthProbeBindAddress != ":8081" || d.PprofBindAddress != "" {
		t.Errorf("defaults = %+v", d)
	}
}

func TestValidateRejectsBadOptions(t *testing.T) {
	o := ipamcontroller.NewOptions()
	o.PoolsNamespace = ""
	o.ReleaseGracePeriod = -time.Second
	o.Workers = 0
	err := o.Validate()
	for _, want := range []string{"--ippools-namespace", "--release-grace-period", "--workers"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}

func TestRunFailsClearlyWithoutAPIServer(t *testing.T) {
	o := ipamcontroller.NewOptions()
	o.RestConfig = &rest.Config{Host: "https://127.0.0.1:1"}
	o.MetricsBindAddress, o.HealthProbeBindAddress = "0", "0"
	err := ipamcontroller.Run(t.Context(), o)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Kubernetes API server at https://127.0.0.1:1") {
		t.Errorf("Run without an API server = %v, want a clear error naming the address", err)
	}
}
