package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// docs/demo.md shows the manifests the demo writes to try.yaml; test/examples
// applies them to a real API server.
func TestTryManifestsAreTheDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "demo.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) != 1 || blocks[0][1] != tryYAML {
		t.Errorf("docs/demo.md's yaml block is not hack/demo's tryYAML (%d blocks): make them the same", len(blocks))
	}
}
