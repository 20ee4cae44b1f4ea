package harness

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildBinary builds one of the project's commands (a package path relative to the
// repository root, such as "./cmd/ipam-controller") into a temporary directory and
// returns the binary's path. The Go build cache makes repeated builds cheap.
func BuildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	// As the Makefile builds the product's binaries.
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	return out
}
