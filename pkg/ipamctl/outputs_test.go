package ipamctl_test

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/nicdiscovery/fakesysfs"
	"github.com/hwipam/hwipam/pkg/ipamctl"
)

// sameJSONAndYAML runs a command with -o json and -o yaml and fails unless both
// parse and carry the same document; it returns the JSON.
func sameJSONAndYAML(t *testing.T, args ...string) []byte {
	t.Helper()
	js, err := run(t, append(args, "-o", "json")...)
	if err != nil && ipamctl.ExitCode(err) != ipamctl.ExitProblems {
		t.Fatalf("%v -o json: %v", args, err)
	}
	ym, err := run(t, append(args, "-o", "yaml")...)
	if err != nil && ipamctl.ExitCode(err) != ipamctl.ExitProblems {
		t.Fatalf("%v -o yaml: %v", args, err)
	}
	var a, b any
	if err := json.Unmarshal([]byte(js), &a); err != nil {
		t.Fatalf("%v -o json does not parse: %v\n%s", args, err, js)
	}
	if err := yaml.Unmarshal([]byte(ym), &b); err != nil {
		t.Fatalf("%v -o yaml does not parse: %v\n%s", args, err, ym)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("%v: JSON and YAML differ:\n%s\n%s", args, js, ym)
	}
	return []byte(js)
}

// roundTrip decodes doc into a new T, encodes it again as the command does (two
// spaces, a final newline) and fails unless that is doc again, and unless the
// YAML form decodes (strictly) to the same T.
func roundTrip[T any](t *testing.T, what string, doc []byte) {
	t.Helper()
	var v T
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	again, err := json.MarshalIndent(v, "", "  ")
	if err != nil || !bytes.Equal(append(again, '\n'), doc) {
		t.Errorf("%s: JSON does not round-trip (%v):\n%s\n%s", what, err, again, doc)
	}
	y, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var w T
	if err := yaml.UnmarshalStrict(y, &w); err != nil || !reflect.DeepEqual(v, w) {
		t.Errorf("%s: YAML does not round-trip (%v):\n%s", what, err, y)
	}
}

// protoRoundTrip decodes a daemon response printed as JSON, and its YAML form,
// into the response message, and fails unless they are equal.
func protoRoundTrip(t *testing.T, what string, doc []byte, m, fromYAML proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(doc, m); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	y, err := yaml.JSONToYAML(doc)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(j, fromYAML); err != nil || !proto.Equal(m, fromYAML) {
		t.Errorf("%s: YAML does not round-trip (%v):\n%s", what, err, y)
	}
}

// Every command's -o json and -o yaml parse and carry the same document, and the
// documents decode into their types and encode back to themselves.
func TestOutputsParseAndRoundTrip(t *testing.T) {
	sock := serve(t)
	protoRoundTrip(t, "pools", sameJSONAndYAML(t, "pools", "--socket", sock),
		&infov1.ListPoolsResponse{}, &infov1.ListPoolsResponse{})
	roundTrip[ipamctl.AllocationsReport](t, "allocations", sameJSONAndYAML(t, "allocations", "--socket", sock))

	root, err := fakesysfs.Extract(filepath.Join("..", "..", "nicdiscovery", "testdata", "sysfs", "hwloc-32em64t-2n8c-cx3-ib.tar.bz2"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sameJSONAndYAML(t, "nics", "--sysfs-root", root)
	roundTrip[map[string]string](t, "labels", sameJSONAndYAML(t, "labels", "--sysfs-root", root))

	// check without API access: the daemon, its store, plugin and config (neither
	// installed here: errors, exit 1), the pool.
	t.Setenv("KUBECONFIG", "")
	dir := t.TempDir()
	doc := sameJSONAndYAML(t, "check", "--socket", sock, "--cni-bin-dir", dir, "--cni-conf-dir", dir,
		"--store-file", filepath.Join(filepath.Dir(strings.TrimPrefix(sock, "unix://")), "store"))
	roundTrip[ipamctl.CheckReport](t, "check", doc)

	roundTrip[ipamctl.PlanReport](t, "plan", sameJSONAndYAML(t, "plan", "--subnet", "10.0.0.0/24", "--block-size", "16", "--list"))
	roundTrip[ipamctl.VersionReport](t, "version", sameJSONAndYAML(t, "version"))
}
