package nicdiscovery_test

import (
	"testing"

	"github.com/hwipam/hwipam/nicdiscovery"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
)

// BenchmarkScan measures one full inventory plus its label set, as the node
// daemon does every rescan: a DGX-H100-like node and a 2-PF × 64-VF SR-IOV node.
func BenchmarkScan(b *testing.B) {
	for _, tc := range []struct {
		name   string
		build  func(string) (*fakesysfs.Tree, error)
		nics   int
		labels int
	}{
		// The BlueField port without link has no speed, the BlueField has no GPU.
		{"DGX-H100", fakesysfs.DGXH100, 10, 3 + 10*7 - 1 - 2},
		{"2PFx64VF", func(root string) (*fakesysfs.Tree, error) { return fakesysfs.SRIOV(root, 2, 64) }, 2 + 128, 3 + 2*5},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tree, err := tc.build(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				inv, err := nicdiscovery.Scan(b.Context(), nicdiscovery.Options{Root: tree.Root, Live: &notLive})
				if err != nil {
					b.Fatal(err)
				}
				labels, _ := nicdiscovery.Labels(inv, nil)
				if len(inv.NICs) != tc.nics || len(labels) != tc.labels {
					b.Fatalf("%d NICs and %d labels, want %d and %d", len(inv.NICs), len(labels), tc.nics, tc.labels)
				}
			}
		})
	}
}
