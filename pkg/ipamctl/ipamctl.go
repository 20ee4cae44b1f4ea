// Package ipamctl is the operator's command line for a node: it shows and checks
// what hwipam knows there. Each subcommand lives in its own file.
package ipamctl

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/hwipam/hwipam/pkg/version"
)

// Options are where the command reads and writes; main wires in the process's own.
type Options struct {
	Args   []string
	Stdout io.Writer
	Stderr io.Writer
}

// Run executes one ipamctl invocation and returns its error; usage errors are
// reported on Stderr with the usage text.
func Run(ctx context.Context, opts Options) error {
	root := &cobra.Command{
		Use:           "ipamctl",
		Short:         "Inspect and check hwipam on this node",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(opts.Args)
	root.SetOut(opts.Stdout)
	root.SetErr(opts.Stderr)
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version of this build",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "ipamctl %s\n", version.String())
			return err
		},
	})
	root.AddCommand(poolsCommand(), allocationsCommand(), nicsCommand(), labelsCommand())
	return root.ExecuteContext(ctx)
}
