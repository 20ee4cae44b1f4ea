// Command nv-ipam is the CNI IPAM plugin: ADD and DEL on the plugin's fast path
// when it takes them, everything else through skel.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/hwipam/hwipam/pkg/cniplugin"
)

func main() {
	p := &cniplugin.Plugin{Stdout: os.Stdout, Stderr: os.Stderr}
	p.TakeOverNetNSCheck()
	if code, done := p.Fast(os.Getenv); done {
		os.Exit(code)
	}
	skel.PluginMainFuncs(p.Funcs(), version.PluginSupports(cniplugin.SupportedVersions...), "hwipam nv-ipam CNI IPAM plugin")
}
