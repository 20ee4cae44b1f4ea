// Command ipamctl inspects and checks hwipam on a node.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hwipam/hwipam/pkg/ipamctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := ipamctl.Run(ctx, ipamctl.Options{Args: os.Args[1:], Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ipamctl:", err)
		os.Exit(ipamctl.ExitCode(err))
	}
}
