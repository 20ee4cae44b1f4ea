package poolcontroller_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/hwipam/hwipam/api/v1alpha1"
)

// tableAccept asks the API server for what `kubectl get` prints: the CRD's
// printer columns, computed by the server.
const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io"

// printedColumns fetches `kubectl get <resource> <name>` from the API server as a
// Table and returns its cells by column name.
func printedColumns(t *testing.T, cfg *rest.Config, ns, resource, name string) map[string]any {
	t.Helper()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/%s/%s", strings.TrimSuffix(cfg.Host, "/"), v1alpha1.GroupVersion.Group,
		v1alpha1.GroupVersion.Version, ns, resource, name)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", tableAccept)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s as a Table: %s: %s", url, resp.Status, body)
	}
	var table metav1.Table
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("decoding the Table of %s %s: %v", resource, name, err)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("the Table of %s %s has %d rows, want 1", resource, name, len(table.Rows))
	}
	cells := map[string]any{}
	for i, col := range table.ColumnDefinitions {
		if i < len(table.Rows[0].Cells) {
			cells[col.Name] = table.Rows[0].Cells[i]
		}
	}
	return cells
}

// wantPrinted checks that `kubectl get` prints want in the named columns; a
// field left out of the status prints as nothing (a null cell).
func wantPrinted(t *testing.T, what string, cells map[string]any, want map[string]int) {
	t.Helper()
	for col, n := range want {
		v, ok := cells[col]
		if !ok {
			t.Errorf("%s: no column %q in %v", what, col, cells)
			continue
		}
		// Integers come back as JSON numbers.
		if f, isNum := v.(float64); !isNum || f != float64(n) {
			t.Errorf("%s: column %s prints %v (%T), want %d", what, col, v, v, n)
		}
	}
}

// A pool that selects no node prints 0 in SELECTED and ALLOCATED (issue 39, item
// 9), not blanks that look like a pool the controller has not got to, and its
// status is not rewritten on every reconcile.
func TestPrintedColumnsShowZero(t *testing.T) {
	f := newFixture(t, 0)
	f.node("unselected", false, nil)
	f.newIPPool("none", "10.103.0.0/24", 8, nil)
	f.create(&v1alpha1.CIDRPool{ObjectMeta: metav1.ObjectMeta{Name: "cnone"}, Spec: v1alpha1.CIDRPoolSpec{
		CIDR: "10.104.0.0/16", PerNodeNetworkPrefix: 24, NodeSelector: f.selector()}})
	f.reconcile(f.ip, "none")
	f.reconcile(f.cidr, "cnone")
	wantPrinted(t, "ippool selecting no node", printedColumns(t, cp.Config, f.ns, "ippools", "none"),
		map[string]int{"Selected": 0, "Allocated": 0})
	wantPrinted(t, "cidrpool selecting no node", printedColumns(t, cp.Config, f.ns, "cidrpools", "cnone"),
		map[string]int{"Selected": 0, "Allocated": 0})

	// A genuine 0 is not taken for a status the API server pruned.
	before := f.ip.StatusWrites() + f.cidr.StatusWrites()
	rv := f.ipPool("none").ResourceVersion
	for range 3 {
		f.reconcile(f.ip, "none")
		f.reconcile(f.cidr, "cnone")
	}
	if w := f.ip.StatusWrites() + f.cidr.StatusWrites() - before; w != 0 {
		t.Errorf("%d status writes in 3 reconciles of unchanged pools that select no node, want 0", w)
	}
	if got := f.ipPool("none").ResourceVersion; got != rv {
		t.Errorf("pool selecting no node rewritten (resourceVersion %s -> %s)", rv, got)
	}

	// Once a node is selected, the columns count it.
	f.node("selected", true, nil)
	f.reconcile(f.ip, "none")
	wantPrinted(t, "ippool selecting one node", printedColumns(t, cp.Config, f.ns, "ippools", "none"),
		map[string]int{"Selected": 1, "Allocated": 1})
}
