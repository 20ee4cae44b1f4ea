// Package ipamctl is the operator's command line for a node: it shows and checks
// what hwipam knows there. Each subcommand lives in its own file.
package ipamctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

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
	// controller-runtime's client logs nothing ipamctl wants; without a logger
	// it complains on stderr.
	ctrllog.SetLogger(logr.Discard())
	root := &cobra.Command{
		Use:           "ipamctl",
		Short:         "Inspect and check hwipam on this node",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(opts.Args)
	root.SetOut(opts.Stdout)
	root.SetErr(opts.Stderr)
	root.AddCommand(versionCommand(), poolsCommand(), allocationsCommand(), nicsCommand(), gpusCommand(), labelsCommand(), planCommand(), checkCommand(), storeCommand())
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &UsageError{err} })
	if _, _, err := root.Find(opts.Args); err != nil {
		return &UsageError{err}
	}
	return root.ExecuteContext(ctx)
}

// Exit codes.
const (
	ExitOK = 0
	// ExitProblems: the command ran and found problems (or failed on its own).
	ExitProblems = 1
	// ExitUsage: a usage mistake, or the daemon or API server could not be reached.
	ExitUsage = 2
)

// ExitCode is the process exit code for Run's error.
func ExitCode(err error) int {
	var conn *ConnectionError
	switch {
	case err == nil:
		return ExitOK
	case IsUsageError(err), errors.As(err, &conn):
		return ExitUsage
	}
	return ExitProblems
}

// ConnectionError is a failure to reach ipam-node or the API server.
type ConnectionError struct{ err error }

func (e *ConnectionError) Error() string { return e.err.Error() }
func (e *ConnectionError) Unwrap() error { return e.err }

// VersionReport is `ipamctl version -o json|yaml`.
type VersionReport struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

func versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of this build",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if output == "table" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "ipamctl %s\n", version.String())
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, VersionReport{Version: version.Version, Commit: version.Commit,
				GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}, nil)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table (one line), json or yaml")
	return cmd
}
