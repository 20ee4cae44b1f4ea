// Package version reports which build of hwipam is running. The Makefile sets the
// variables with -ldflags -X; a plain `go build` reports "dev".
package version

import (
	"fmt"
	"runtime"
)

// Version and Commit identify the build; set at link time by the Makefile.
var (
	Version = "dev"
	Commit  = "unknown"
)

// String is the one-line form every binary prints for --version.
func String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s/%s)", Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
