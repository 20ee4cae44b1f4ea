package harness

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// NFDCRDFile returns the path of NFD's CRD manifest (NodeFeature, NodeFeatureRule,
// NodeFeatureGroup) in the node-feature-discovery module that hack/node/nfd pins,
// the release whose nfd-master hack/test-assets.sh builds. It downloads the module
// through the Go module proxy when the module cache lacks it.
func NFDCRDFile() (string, error) {
	dir := filepath.Join(RepoRoot(), "hack", "node", "nfd")
	list := func() (string, error) {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/node-feature-discovery")
		cmd.Dir = dir
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	mod, err := list()
	if err == nil && mod == "" {
		dl := exec.Command("go", "mod", "download", "sigs.k8s.io/node-feature-discovery")
		dl.Dir = dir
		if out, err := dl.CombinedOutput(); err != nil {
			return "", fmt.Errorf("downloading NFD's module for hack/node/nfd: %w\n%s", err, out)
		}
		mod, err = list()
	}
	if err != nil || mod == "" {
		return "", fmt.Errorf("finding NFD's module from hack/node/nfd (got %q): %w", mod, err)
	}
	return filepath.Join(mod, "deployment", "base", "nfd-crds", "nfd-api-crds.yaml"), nil
}
