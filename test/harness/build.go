package harness

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// PluginEntryFlag is the linker flag that gives the plugin its own entry point
// on linux/amd64 (cmd/nv-ipam/entry_linux_amd64.go), as the Makefile passes it.
const PluginEntryFlag = "-E main.entry"

// BuildBinary builds one of the project's commands (a package path relative to the
// repository root, such as "./cmd/ipam-controller") into a temporary directory and
// returns the binary's path. The Go build cache makes repeated builds cheap.
func BuildBinary(tb testing.TB, pkg string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	// As the Makefile builds the product's binaries.
	ldflags := "-s -w"
	if filepath.Base(pkg) == "nv-ipam" && runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
		ldflags += " " + PluginEntryFlag // the Makefile's PLUGIN_LDFLAGS
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags="+ldflags, "-o", out, pkg)
	cmd.Dir = RepoRoot()
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	StatSources()
	return out
}

// StatSources stats every file of the repository outside test/, hack/, bin/ and
// dot-directories. go test caches a test's result by the packages it imports and
// the files it opens or stats; a binary built in a subprocess (BuildBinary, `make
// image`) and the manifests kubectl reads are neither, so without this a test
// that execs them would be reported "(cached)" after a change to them alone.
func StatSources() {
	root := RepoRoot()
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // a file that cannot be read is left out, not fatal
		}
		if d.IsDir() {
			switch rel, _ := filepath.Rel(root, path); {
			case rel == "test", rel == "hack", rel == "bin", strings.HasPrefix(d.Name(), "."):
				if rel != "." {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if d.Type().IsRegular() && !strings.HasSuffix(path, "_test.go") {
			_, _ = os.Stat(path)
		}
		return nil
	})
}
