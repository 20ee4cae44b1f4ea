package ipamnode_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hwipam/hwipam/pkg/ipamnode"
)

func TestNICLabelOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*ipamnode.Options)
		want string // "" means valid
	}{
		{"defaults", func(*ipamnode.Options) {}, ""},
		{"off", func(o *ipamnode.Options) { o.NICLabels = "off"; o.NICRescanInterval = 0 }, ""},
		{"nodefeature", func(o *ipamnode.Options) { o.NICLabels = "nodefeature"; o.NodeFeatureNamespace = "nfd" }, ""},
		{"nodefeature without namespace", func(o *ipamnode.Options) { o.NICLabels = "nodefeature"; o.NodeFeatureNamespace = "" },
			"--nic-labels=nodefeature needs --nodefeature-namespace"},
		{"unknown mode", func(o *ipamnode.Options) { o.NICLabels = "annotations" }, `--nic-labels "annotations": want node, nodefeature or off`},
		{"zero interval", func(o *ipamnode.Options) { o.NICRescanInterval = 0 }, "--nic-rescan-interval 0s must be positive"},
		{"host netns path", func(o *ipamnode.Options) { o.DRA = true; o.DRAHostNetNS = "/proc/1/ns/net" }, ""},
		{"relative CDI dir", func(o *ipamnode.Options) { o.DRA = true; o.DRACDIDir = "cdi" }, "--dra-cdi-dir"},
		{"relative host netns", func(o *ipamnode.Options) { o.DRA = true; o.DRAHostNetNS = "ns/net" },
			`--dra-host-netns "ns/net" must be an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ipamnode.NewOptions()
			o.NodeName = "n"
			tc.mod(o)
			err := o.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if d := ipamnode.NewOptions(); d.NICLabels != "node" || d.NICRescanInterval != time.Minute || d.SysfsRoot != "/" {
		t.Errorf("defaults %q %s %q", d.NICLabels, d.NICRescanInterval, d.SysfsRoot)
	}
}

// A rail map that does not parse stops the daemon before it starts, naming the file.
func TestBadRailConfigStopsTheDaemon(t *testing.T) {
	dir := t.TempDir()
	rails := filepath.Join(dir, "rails.yaml")
	writeFile(t, rails, "rail0: not-a-list\n")
	o := ipamnode.NewOptions()
	o.NodeName = "n"
	o.StoreFile = filepath.Join(dir, "store")
	o.BindAddress = "unix://" + filepath.Join(dir, "sock")
	o.RailConfig = rails
	err := ipamnode.Run(t.Context(), o)
	if err == nil || !strings.Contains(err.Error(), rails) {
		t.Fatalf("Run = %v, want an error naming %s", err, rails)
	}
}
