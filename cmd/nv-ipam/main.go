// Command nv-ipam is the CNI IPAM plugin. It links neither skel nor anything that
// needs start-up work it does not use: a runtime execs it for every call.
package main

import (
	"os"

	"github.com/hwipam/hwipam/pkg/cniplugin"
)

func main() {
	undoEntry()
	p := &cniplugin.Plugin{Stdout: os.Stdout, Stderr: os.Stderr}
	os.Exit(p.Run(os.Getenv, os.Stdin))
}
