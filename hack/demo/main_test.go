package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// docs/demo.md shows the manifests the demo writes to try.yaml and try-nic.yaml;
// test/examples applies them to a real API server, test/realnode runs the NIC
// claim on the real node.
func TestTryManifestsAreTheDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "demo.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) != 2 || blocks[0][1] != tryYAML || blocks[1][1] != tryNICYAML {
		t.Errorf("docs/demo.md's yaml blocks are not hack/demo's tryYAML and tryNICYAML (%d blocks): make them the same", len(blocks))
	}
}
