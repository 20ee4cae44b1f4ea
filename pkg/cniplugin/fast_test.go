package cniplugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// The fast path's promise is to read and print exactly what the full path does,
// or to leave the call to it. These tests hold it to that against encoding/json
// and the CNI library, on random input (seed logged; HWIPAM_SEED replays).

// randJSON writes a random JSON value: strings with escapes, surrogate pairs and
// multi-byte characters, numbers of every shape, nesting, random white space.
func randJSON(r *rand.Rand, b *strings.Builder, depth int) {
	ws := func() {
		for range r.IntN(3) {
			b.WriteByte(" \t\n\r"[r.IntN(4)])
		}
	}
	ws()
	k := r.IntN(7)
	if depth > 4 {
		k = r.IntN(4)
	}
	switch k {
	case 0:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	case 1:
		b.WriteString([]string{"0", "-0", "12", "-7", "3.25", "1e3", "-2.5E-2", "1E+2", "9223372036854775807",
			"9223372036854775808", "2147483648", "-2147483649", "5.0", "100000000000000000000000"}[r.IntN(14)])
	case 2, 3:
		b.WriteString(randJSONString(r))
	case 4:
		b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			randJSON(r, b, depth+1)
		}
		ws()
		b.WriteByte(']')
	default:
		b.WriteByte('{')
		for i := range r.IntN(5) {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			b.WriteString(randJSONString(r))
			ws()
			b.WriteByte(':')
			randJSON(r, b, depth+1)
		}
		ws()
		b.WriteByte('}')
	}
	ws()
}

func randJSONString(r *rand.Rand) string {
	parts := []string{"a", "name", "ipam", "IPAM", `\"`, `\\`, `\/`, `\n`, `\t`, `\u0041`, `\u00e9`, "é", "日本", `\ud83d\ude00`,
		"😀", `\u2028`, " ", "poolName", "x-y.z", `\b\f\r`}
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(4) {
		b.WriteString(parts[r.IntN(len(parts))])
	}
	b.WriteByte('"')
	return b.String()
}

// mutate damages a document now and then: a byte dropped, added or changed.
func mutate(r *rand.Rand, doc []byte) []byte {
	if len(doc) == 0 || r.IntN(3) > 0 {
		return doc
	}
	i := r.IntN(len(doc))
	out := append([]byte(nil), doc[:i]...)
	switch r.IntN(3) {
	case 0:
		out = append(out, doc[i+1:]...)
	case 1:
		out = append(out, []byte{'"', '\\', '{', '}', ',', ':', 0x01, 0xff, 'u', '0', '[', ']'}[r.IntN(12)])
		out = append(out, doc[i:]...)
	default:
		out = append(out, []byte{'"', '\\', 'x', 0xc3, ' ', '1'}[r.IntN(6)])
		out = append(out, doc[i+1:]...)
	}
	return out
}

var loneSurrogate = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// mayRefuse: the documented cases where jsonlite refuses JSON that encoding/json
// reads (replacing invalid UTF-8 and lone surrogates with U+FFFD).
func mayRefuse(doc []byte) bool {
	return !utf8.Valid(doc) || loneSurrogate.Match(doc)
}

func (v *jvalue) toAny() any {
	switch v.kind {
	case jNull:
		return nil
	case jBool:
		return v.b
	case jNum:
		f, err := strconv.ParseFloat(v.s, 64)
		if err != nil && !math.IsInf(f, 0) {
			return "bad number " + v.s
		}
		return f
	case jStr:
		return v.s
	case jArr:
		out := []any{}
		for _, e := range v.arr {
			out = append(out, e.toAny())
		}
		return out
	}
	out := map[string]any{}
	for i, k := range v.keys {
		out[k] = v.vals[i].toAny() // the last of duplicates, as encoding/json
	}
	return out
}

func TestJSONLiteAgreesWithEncodingJSON(t *testing.T) {
	r := harness.Rand(t)
	accepted := 0
	for range 20000 {
		var b strings.Builder
		randJSON(r, &b, 0)
		doc := mutate(r, []byte(b.String()))
		v, err := parseJSONLite(doc)
		valid := json.Valid(doc)
		switch {
		case err == nil && !valid:
			t.Fatalf("jsonlite read what encoding/json refuses: %q", doc)
		case err != nil && valid && !mayRefuse(doc):
			t.Fatalf("jsonlite refused valid JSON: %q", doc)
		case err == nil:
			accepted++
			var want any
			if err := json.Unmarshal(doc, &want); err != nil {
				t.Fatalf("%q: %v", doc, err)
			}
			if got := v.toAny(); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: jsonlite read %#v, encoding/json %#v", doc, got, want)
			}
		}
	}
	if accepted < 10000 {
		t.Errorf("only %d of 20000 documents were valid: the generator tests too little", accepted)
	}
	deep := strings.Repeat("[", jsonMaxDepth+2) + strings.Repeat("]", jsonMaxDepth+2)
	if _, err := parseJSONLite([]byte(deep)); err == nil {
		t.Errorf("jsonlite read %d levels of nesting", jsonMaxDepth+2)
	}
}

// randMember writes "key": value for one of fields (or another key), with the
// right type most of the time, sometimes another type, null, or the key in
// another case.
func randMember(r *rand.Rand, key string, value func() string) string {
	switch r.IntN(12) {
	case 0:
		key = strings.ToUpper(key)
	case 1:
		return fmt.Sprintf("%q: null", key)
	case 2:
		var b strings.Builder
		randJSON(r, &b, 3)
		return fmt.Sprintf("%q: %s", key, b.String())
	}
	return fmt.Sprintf("%q: %s", key, value())
}

func randObject(r *rand.Rand, members []string) string {
	r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	if len(members) > 0 && r.IntN(10) == 0 { // a duplicate
		members = append(members, members[0])
	}
	return "{" + strings.Join(members, ", ") + "}"
}

func randConfig(r *rand.Rand) string {
	str := func(vals ...string) func() string {
		return func() string { return strconv.Quote(vals[r.IntN(len(vals))]) }
	}
	strs := func() string {
		n := r.IntN(3)
		var out []string
		for range n {
			out = append(out, strconv.Quote([]string{"10.1.0.7", "10.1.0.8/24", "fd00::1", "pool-a", ""}[r.IntN(5)]))
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	num := func() string { return []string{"0", "5", "-3", "2.5", "1e1", "2147483648", "30"}[r.IntN(7)] }
	boolean := func() string { return []string{"true", "false"}[r.IntN(2)] }
	pick := func(all map[string]func() string) []string {
		var out []string
		for k, v := range all {
			if r.IntN(3) > 0 {
				out = append(out, randMember(r, k, v))
			}
		}
		return out
	}
	fileFields := func() map[string]func() string {
		return map[string]func() string{"daemonSocket": str("unix:///run/x.sock", "tcp://1.2.3.4:5"), "daemonCallTimeoutSeconds": num,
			"logFile": str("", "/var/log/x.log"), "logLevel": str("info", "debug"), "confDir": str("/nonexistent"),
			"poolName": str("pool-a", "a,b", "a,b,c", " "), "poolType": str("ippool", "CIDRPool", "other"),
			"rail": str("auto", "rail-1", "bad rail"), "forcePoolName": boolean}
	}
	ipam := fileFields()
	ipam["type"] = str("nv-ipam")
	top := map[string]func() string{
		"cniVersion": str("0.3.1", "1.0.0", "1.1.0", "0.2.0"), "name": str("net-a", "bad name", ""),
		"ipam":     func() string { return randObject(r, pick(ipam)) },
		"deviceID": str("0000:3b:00.2"), "pciBusID": str("0000:3b:00.3"), "master": str("ens1"), "device": str("ens2"),
		"runtimeConfig": func() string {
			return randObject(r, pick(map[string]func() string{"ips": strs, "deviceID": str("0000:3b:00.4"), "other": str("x")}))
		},
		"args": func() string {
			cni := map[string]func() string{"ips": strs, "poolNames": strs, "poolType": str("cidrpool"),
				"allocateDefaultGateway": boolean, "allocateIPWithIndex": num}
			return randObject(r, pick(map[string]func() string{"cni": func() string { return randObject(r, pick(cni)) }}))
		},
		"prevResult": func() string { return `{"cniVersion": "1.0.0", "ips": []}` },
		"type":       str("macvlan"),
	}
	if r.IntN(20) == 0 {
		top["cni.dev/valid-attachments"] = func() string { return `[{"containerID": "c", "ifname": "net1"}]` }
	}
	return randObject(r, pick(top))
}

func TestNetConfLiteAgreesWithEncodingJSON(t *testing.T) {
	r := harness.Rand(t)
	accepted := 0
	for range 20000 {
		doc := []byte(randConfig(r))
		var want netConf
		errJ := json.Unmarshal(doc, &want)
		var got netConf
		v, err := parseJSONLite(doc)
		if err == nil {
			err = netConfLite(v, &got)
		}
		if err != nil {
			continue
		}
		accepted++
		want.PrevResult = nil
		if errJ != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\njsonlite %+v\nencoding/json %+v (%v)", doc, got, want, errJ)
		}
	}
	if accepted < 2000 {
		t.Errorf("jsonlite took %d of 20000 configs: the generator tests too little", accepted)
	}
	t.Logf("jsonlite took %d of 20000 network configs", accepted)
}

func TestFileConfigLiteAgreesWithEncodingJSON(t *testing.T) {
	r := harness.Rand(t)
	accepted := 0
	for range 5000 {
		var members []string
		for k, v := range map[string]string{"daemonSocket": `"unix:///x.sock"`, "daemonCallTimeoutSeconds": "7",
			"logFile": `""`, "logLevel": `"debug"`, "forcePoolName": "true", "poolName": `"p"`, "other": "[1, {}]"} {
			if r.IntN(3) > 0 {
				members = append(members, randMember(r, k, func() string { return v }))
			}
		}
		doc := []byte(randObject(r, members))
		var want, got FileConfig
		errJ := json.Unmarshal(doc, &want)
		if err := fileConfigLite(doc, &got); err != nil {
			continue
		}
		accepted++
		if errJ != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s:\njsonlite %+v\nencoding/json %+v (%v)", doc, got, want, errJ)
		}
	}
	if accepted < 500 {
		t.Errorf("jsonlite took %d of 5000 files", accepted)
	}
}

func TestPrintResultLiteByteForByte(t *testing.T) {
	r := harness.Rand(t)
	addr := func() netip.Addr {
		switch r.IntN(3) {
		case 0:
			return netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		case 1:
			return netip.AddrFrom16([16]byte{0xfd, 0, 10: byte(r.IntN(256)), 15: byte(r.IntN(256))})
		}
		return netip.AddrFrom16(netip.AddrFrom4([4]byte{10, 9, 8, byte(r.IntN(256))}).As16()) // 4in6
	}
	for range 3000 {
		res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
		for range r.IntN(4) {
			a := addr()
			ipc := &current.IPConfig{Address: net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(r.IntN(a.BitLen()+1), a.BitLen())}}
			if r.IntN(2) == 0 {
				ipc.Gateway = addr().AsSlice()
			}
			res.IPs = append(res.IPs, ipc)
		}
		for range r.IntN(3) {
			a := addr()
			route := &types.Route{Dst: net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(r.IntN(a.BitLen()+1), a.BitLen())}}
			if r.IntN(2) == 0 {
				route.GW = addr().AsSlice()
			}
			res.Routes = append(res.Routes, route)
		}
		for _, v := range SupportedVersions {
			var want, got bytes.Buffer
			if err := printResult(&want, res, v); err != nil {
				t.Fatal(err)
			}
			if err := printResultLite(&got, res, v); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Fatalf("version %s:\nlite:\n%s\nCNI library:\n%s", v, got.String(), want.String())
			}
		}
	}
}

// TestFastMatchesTheFullPath: random ADDs and DELs (environment, network config,
// nv-ipam.conf, CNI_ARGS) against a real node service. Where Fast takes a call,
// skel would have taken it too (its checks pass), and the full path then prints
// the same bytes with the same exit code (ADD is idempotent, DEL of nothing
// succeeds); where Fast leaves a call, the daemon saw nothing and standard input
// reads again from its start.
func TestFastMatchesTheFullPath(t *testing.T) {
	r := harness.Rand(t)
	start, end := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.12")
	pool := func(name string, kind string, prefix string) *nodealloc.PoolConfig {
		p := netip.MustParsePrefix(prefix)
		s, e := start, end
		if p.Addr().Is6() {
			s, e = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::c")
		}
		return &nodealloc.PoolConfig{Name: name, Kind: kind, Prefix: p, Block: iprange.Range{Start: s, End: e},
			ExclusionBase: s, Gateway: s, DefaultGateway: true}
	}
	grpcSocket, m := harness.ServeNode(t, pool("net-a", v1alpha1.KindIPPool, "10.1.0.0/24"),
		pool("six", v1alpha1.KindIPPool, "fd00::/64"), pool("cidr", v1alpha1.KindCIDRPool, "10.1.0.0/24"))
	podNS := harness.NewNetNS(t)
	confDir := t.TempDir()
	confFile := filepath.Join(confDir, ConfFileName)
	pick := func(vals ...string) string { return vals[r.IntN(len(vals))] }
	// or picks from good most of the time, and from bad one time in 25.
	or := func(good []string, bad ...string) string {
		if r.IntN(25) == 0 {
			return pick(bad...)
		}
		return pick(good...)
	}
	taken, full := 0, 0
	for i := range 400 {
		switch r.IntN(20) { // nv-ipam.conf: the daemon's, absent, odd or broken
		case 0:
			_ = os.Remove(confFile)
		case 1:
			_ = os.WriteFile(confFile, []byte(`{"daemonSocket": 5}`), 0o644)
		case 2, 3:
			_ = os.WriteFile(confFile, []byte(fmt.Sprintf(`{"daemonSocket": %q, "DaemonCallTimeoutSeconds": 3}`, grpcSocket)), 0o644)
		default:
			_ = os.WriteFile(confFile, []byte(fmt.Sprintf("{\n  \"daemonCallTimeoutSeconds\": 5,\n  \"daemonSocket\": %q,\n"+
				"  \"forcePoolName\": false,\n  \"logFile\": \"\",\n  \"logLevel\": \"info\"\n}\n", grpcSocket)), 0o644)
		}
		var members []string
		add := func(format string, a ...any) {
			if r.IntN(30) > 0 {
				members = append(members, fmt.Sprintf(format, a...))
			}
		}
		add(`"cniVersion": %q`, or([]string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}, "0.2.0", ""))
		add(`"name": %q`, or([]string{"net-a", "net-a", "six"}, "bad name"))
		add(`"type": "macvlan", "master": %q`, pick("ens1", ""))
		var ipam []string
		ipamAdd := func(format string, a ...any) {
			if r.IntN(4) > 0 {
				ipam = append(ipam, fmt.Sprintf(format, a...))
			}
		}
		ipamAdd(`"type": "nv-ipam"`)
		ipamAdd(`"confDir": %q`, confDir)
		ipamAdd(`"poolName": %q`, or([]string{"net-a", "six", "net-a,six", "nope", "cidr"}, "a,b,c"))
		ipamAdd(`"poolType": %q`, or([]string{"ippool", "cidrpool", "IPPool"}, "bad"))
		ipamAdd(`"daemonCallTimeoutSeconds": %s`, or([]string{"5", "3"}, "0", "2.5"))
		ipamAdd(`"logFile": ""`)
		if r.IntN(15) == 0 {
			ipamAdd(`"daemonSocket": %q`, pick("unix:///nonexistent/d.sock", "", "tcp://"))
		}
		add(`"ipam": {%s}`, strings.Join(ipam, ", "))
		add(`"runtimeConfig": {"ips": [%s]}`, or([]string{"", "", `"10.1.0.9"`, `"10.1.0.200"`}, `"x"`))
		add(`"args": {"cni": {"allocateDefaultGateway": %s}}`, or([]string{"true", "false"}, `"yes"`))
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		data := []byte("{" + strings.Join(members, ", ") + "}")
		env := map[string]string{
			"CNI_COMMAND":     or([]string{"ADD", "ADD", "DEL"}, "CHECK", "VERSION"),
			"CNI_CONTAINERID": or([]string{"c1", "c2", "c3", "c-4.x_y"}, "bad id", "", "-c"),
			"CNI_NETNS":       or([]string{podNS.Path}, "", "/proc/self/ns/net"),
			"CNI_IFNAME":      or([]string{"net1", "net1", "net2"}, "eth0:1", "", "a-name-of-16-chr"),
			"CNI_ARGS":        or([]string{"K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns", "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns;IP=10.1.0.11"}, "", "bad"),
			"CNI_PATH":        or([]string{"/opt/cni/bin"}, ""),
		}
		before := m.Allocations("")
		if err := replayStdin(data); err != nil {
			t.Fatal(err)
		}
		var fastOut bytes.Buffer
		fast := &Plugin{Stdout: &fastOut, CheckNetNS: true}
		code, done := fast.Fast(func(k string) string { return env[k] })
		step := fmt.Sprintf("call %d: %v %s", i, env, data)
		if !done {
			again, err := readAll(int(os.Stdin.Fd()))
			if err != nil || !bytes.Equal(again, data) || fastOut.Len() != 0 {
				t.Fatalf("%s: left to the full path, but stdin reads %q (%v) and it printed %q", step, again, err, fastOut.String())
			}
			if after := m.Allocations(""); !reflect.DeepEqual(before, after) {
				t.Fatalf("%s: left to the full path, but the daemon's allocations changed: %v -> %v", step, before, after)
			}
			full++
			continue
		}
		taken++
		// skel's own checks pass for every call Fast takes.
		verb := env["CNI_COMMAND"]
		var nc struct {
			CNIVersion string `json:"cniVersion"`
			Name       string `json:"name"`
		}
		if utils.ValidateContainerID(env["CNI_CONTAINERID"]) != nil || utils.ValidateInterfaceName(env["CNI_IFNAME"]) != nil ||
			env["CNI_PATH"] == "" || verb == "ADD" && env["CNI_NETNS"] == "" || json.Unmarshal(data, &nc) != nil ||
			utils.ValidateNetworkName(nc.Name) != nil || !slices.Contains(SupportedVersions, nc.CNIVersion) {
			t.Fatalf("%s: Fast took a call skel refuses", step)
		}
		args := &skel.CmdArgs{ContainerID: env["CNI_CONTAINERID"], Netns: env["CNI_NETNS"], IfName: env["CNI_IFNAME"],
			Args: env["CNI_ARGS"], Path: env["CNI_PATH"], StdinData: data}
		var fullOut bytes.Buffer
		slow := &Plugin{Stdout: &fullOut, CheckNetNS: true}
		var err error
		if verb == "ADD" {
			err = slow.Add(args)
		} else {
			err = slow.Del(args)
		}
		fullCode := 0
		if err != nil {
			fullCode = slow.printError(err)
		}
		if code != fullCode || fastOut.String() != fullOut.String() {
			t.Fatalf("%s:\nfast (exit %d):\n%s\nfull (exit %d):\n%s", step, code, fastOut.String(), fullCode, fullOut.String())
		}
	}
	t.Logf("Fast took %d calls, left %d to the full path", taken, full)
	if taken < 60 || full < 60 {
		t.Errorf("Fast took %d calls and left %d: the generator tests too little of one side", taken, full)
	}
}

// FuzzJSONLite: whatever jsonlite reads, encoding/json reads the same; whatever
// valid JSON it refuses is one of its documented refusals.
func FuzzJSONLite(f *testing.F) {
	for _, s := range []string{`{"cniVersion": "1.0.0", "name": "a", "ipam": {"type": "nv-ipam"}}`, `[1, -0.5e3, "\u00e9\ud83d\ude00"]`,
		`{"a": {"b": [true, false, null]}, "a": 1}`, `"\u002f\/"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		v, err := parseJSONLite(doc)
		valid := json.Valid(doc)
		if err != nil {
			if valid && !mayRefuse(doc) && strings.Count(string(doc), "[")+strings.Count(string(doc), "{") <= jsonMaxDepth {
				t.Fatalf("jsonlite refused valid JSON %q", doc)
			}
			return
		}
		if !valid {
			t.Fatalf("jsonlite read what encoding/json refuses: %q", doc)
		}
		var want any
		if json.Unmarshal(doc, &want) != nil {
			return // a number beyond float64: jsonlite keeps its text, and its typed reads refuse it
		}
		if got := v.toAny(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: jsonlite read %#v, encoding/json %#v", doc, got, want)
		}
	})
}
