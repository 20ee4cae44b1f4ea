package nicdiscovery

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"github.com/jaypipes/pcidb"
)

// pciNames looks up model names the built-in table lacks in a pci.ids file.
type pciNames struct {
	db *pcidb.PCIDB
}

// hostPCIIDs are the places a pci.ids file is looked for, under the scan root first
// and then on the host.
var hostPCIIDs = []string{"usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids"}

// findPCIIDs returns the pci.ids file to use for names the built-in table lacks, or "".
func findPCIIDs(root string) string {
	for _, dir := range []string{root, "/"} {
		for _, p := range hostPCIIDs {
			if fi, err := os.Stat(filepath.Join(dir, p)); err == nil && fi.Mode().IsRegular() {
				return filepath.Join(dir, p)
			}
		}
	}
	return ""
}

// loadPCINames loads the first pci.ids found under root or on the host. Without
// one, lookups give "unknown (15b3:xxxx)". Never fetched from the network.
func loadPCINames(root string, log logr.Logger) *pciNames {
	path := findPCIIDs(root)
	if path == "" {
		return &pciNames{}
	}
	noFetch := false
	db, err := pcidb.New(&pcidb.WithOption{Path: &path, EnableNetworkFetch: &noFetch})
	if err != nil {
		log.Info("warning: cannot read the PCI ID database; unknown NIC models are shown by ID", "path", path, "error", err.Error())
		return &pciNames{}
	}
	return &pciNames{db: db}
}

func (n *pciNames) lookup(vendor, device uint16) string {
	if n.db != nil {
		if p, ok := n.db.Products[fmt.Sprintf("%04x%04x", vendor, device)]; ok && p.Name != "" {
			return p.Name
		}
	}
	return fmt.Sprintf("unknown (%04x:%04x)", vendor, device)
}
