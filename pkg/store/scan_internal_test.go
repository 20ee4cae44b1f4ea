package store

import (
	"encoding/json"
	"testing"
)

// TestScanIPAgreesWithEncodingJSON: wherever scanIP answers, it answers what
// encoding/json does; where it does not, recordIP still does, through
// encoding/json.
func TestScanIPAgreesWithEncodingJSON(t *testing.T) {
	for _, v := range []string{
		`{"containerID":"c","ifName":"net1","ip":"10.0.0.1","podName":"p","createTime":"2026-01-02T03:04:05Z"}`,
		`{"ip":"fd00::1"}`,
		` { "ip" : "10.0.0.2" , "x" : [1, -2.5e3, {"a": [true, false, null]}], "y": {} } `,
		`{"podName":"ip","ip":"10.0.0.3","note":"\"ip\":\"1.2.3.4\""}`,
		`{"a":[],"b":[ ],"ip":"10.0.0.4"}`,
		`{"ip":"10.0.0.5","ip":"10.0.0.6"}`,   // last wins in encoding/json
		`{"IP":"10.0.0.7"}`,                   // case-insensitive in encoding/json
		`{"ip":"10.0.0.8","Ip":"10.0.0.9"}`,   // likewise
		`{"ip":"\u0031\u0030.0.0.10"}`,        // escapes
		`{"i\u0070":"10.0.0.11"}`,             // an escaped member name
		`{"x":"tab	inside","ip":"10.0.0.12"}`, // a control character: invalid JSON
		`{"ip":"10.0.0.13",}`,
		`{"ip":"10.0.0.14"} trailing`,
		`{"x":tru,"ip":"10.0.0.15"}`,
		`{"x":nul,"ip":"10.0.0.16"}`,
		`{"ip":10}`,
		`{}`,
		`[]`,
		``,
	} {
		var want struct {
			IP string `json:"ip"`
		}
		jerr := json.Unmarshal([]byte(v), &want)
		if raw, ok := scanIP([]byte(v)); ok {
			if jerr != nil || string(raw) != want.IP {
				t.Errorf("scanIP(%s) = %q, encoding/json: %q, %v", v, raw, want.IP, jerr)
			}
		}
		ip, err := recordIP([]byte(v))
		switch {
		case jerr != nil || want.IP == "":
			if err == nil {
				t.Errorf("recordIP(%s) = %s, want an error", v, ip)
			}
		case err != nil || ip.String() != want.IP:
			t.Errorf("recordIP(%s) = %s, %v, want %s", v, ip, err, want.IP)
		}
	}
}

func BenchmarkRecordIP(b *testing.B) {
	v := []byte(`{"containerID":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","ifName":"net1",` +
		`"ip":"10.0.12.34","podName":"pod-0123456789","podNamespace":"default","podUID":"9f0e6b8c-4c1d-4d53-9a55-0e6f1d2b3c4d",` +
		`"createTime":"2026-11-23T14:59:16.318289571Z","network":"rail0"}`)
	for b.Loop() {
		if _, err := recordIP(v); err != nil {
			b.Fatal(err)
		}
	}
}
