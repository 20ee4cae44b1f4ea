package nicdiscovery

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/jaypipes/pcidb"
)

// pciNames looks up model names the built-in table lacks in a pci.ids file.
type pciNames struct {
	db *pcidb.PCIDB
}

// loadPCINames loads path, or the first pci.ids found under root or on the host.
// Without one, lookups give "unknown (15b3:xxxx)". Never fetched from the network.
func loadPCINames(path, root string, log logr.Logger) *pciNames {
	if path == "" {
		path = findPCIIDs(root)
	}
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
