// Command nv-ipam is the CNI IPAM plugin: one skel call.
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
	skel.PluginMainFuncs(p.Funcs(),
		version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "hwipam nv-ipam CNI IPAM plugin")
}
