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
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

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

// TestRunMatchesSkel: random calls of every verb (environment, network config,
// nv-ipam.conf, CNI_ARGS; good most of the time, broken in every way now and
// then) against a real node service. Run must print the same bytes on stdout and
// stderr, with the same exit code, as the CNI library's skel dispatching to the
// same verbs (with the own-netns check the plugin makes itself, as main did
// before Run replaced skel). ADD is idempotent and DEL of nothing succeeds, so
// Run goes first and skel repeats the call on the same daemon.
func TestRunMatchesSkel(t *testing.T) {
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
	grpcSocket, _ := harness.ServeNode(t, pool("net-a", v1alpha1.KindIPPool, "10.1.0.0/24"),
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
	sk := newSkelRunner(t)
	verbs := map[string]int{}
	fastWay := 0
	for i := range 2000 {
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
		verb := or([]string{"ADD", "ADD", "ADD", "DEL", "DEL", "CHECK", "GC", "STATUS", "VERSION"}, "", "add", "BOGUS")
		add(`"cniVersion": %q`, or([]string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.1.0"}, "0.2.0", "", "1.2.0", "x.y"))
		add(`"name": %q`, or([]string{"net-a", "net-a", "six"}, "bad name", "", "-a"))
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
		if verb == "GC" || r.IntN(20) == 0 {
			add(`"cni.dev/valid-attachments": [%s]`, or([]string{"", `{"containerID": "c1", "ifname": "net1"}`}, `5`))
		}
		if verb == "CHECK" || r.IntN(20) == 0 {
			add(`"prevResult": %s`, or([]string{`{"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}]}`, `{"ips": []}`}, `"x"`))
		}
		r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
		data := []byte("{" + strings.Join(members, ", ") + "}")
		if r.IntN(40) == 0 {
			data = data[:r.IntN(len(data))] // cut short: not JSON
		}
		env := map[string]string{}
		// Each variable is bad one time in 8 ("-" leaves it unset).
		set := func(k string, good []string, bad ...string) {
			v := pick(good...)
			if r.IntN(8) == 0 {
				v = pick(bad...)
			}
			if v != "-" {
				env[k] = v
			}
		}
		if verb != "" {
			env["CNI_COMMAND"] = verb
		}
		set("CNI_CONTAINERID", []string{"c1", "c2", "c3", "c-4.x_y"}, "bad id", "-", "-c", "c\u00e9")
		set("CNI_NETNS", []string{podNS.Path}, "-", "/proc/self/ns/net", "/nonexistent")
		set("CNI_IFNAME", []string{"net1", "net1", "net2"}, "eth0:1", "-", "a-name-of-16-chr", ".", "..", "n\u00e9t", "n\u2003t", "n\xfft", "a/b")
		set("CNI_ARGS", []string{"K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns", "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns;IP=10.1.0.11"}, "-", "bad")
		set("CNI_PATH", []string{"/opt/cni/bin"}, "-")
		if r.IntN(10) == 0 { // the runtime's override, mostly into the plugin's own namespace
			env["CNI_NETNS_OVERRIDE"] = pick("1", "true", "TRUE", "True", "0", "yes", "")
			env["CNI_NETNS"] = pick("/proc/self/ns/net", "/proc/self/ns/net", podNS.Path)
		}
		step := fmt.Sprintf("call %d: %q %s", i, env, data)
		var out, errOut bytes.Buffer
		p := &Plugin{Stdout: &out, Stderr: &errOut}
		code := p.Run(func(k string) string { return env[k] }, bytes.NewReader(data))
		skelOut, skelErr, skelCode := sk.run(env, data)
		if code != skelCode || out.String() != skelOut || errOut.String() != skelErr {
			t.Fatalf("%s:\nRun (exit %d):\n%s\nstderr %q\nskel (exit %d):\n%s\nstderr %q", step, code, out.String(), errOut.String(),
				skelCode, skelOut, skelErr)
		}
		verbs[verb]++
		if _, err := fastConfig(data, env["CNI_ARGS"], verb == "ADD"); err == nil && (verb == "ADD" || verb == "DEL") {
			fastWay++
		}
	}
	t.Logf("calls per verb %v; %d ADDs and DELs read by the short way", verbs, fastWay)
	if fastWay < 400 || verbs["ADD"]+verbs["DEL"]-fastWay < 200 {
		t.Errorf("%d of %d ADDs and DELs went the short way: the generator tests too little of one side", fastWay, verbs["ADD"]+verbs["DEL"])
	}
}

// skelRunner runs the plugin's verbs through the CNI library's skel in this
// process: skel reads the process's environment and standard input, and prints
// on its standard output and error, so those are swapped for files around each
// call and put back after.
type skelRunner struct {
	t   *testing.T
	dir string
}

var cniEnvNames = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

func newSkelRunner(t *testing.T) *skelRunner {
	saved := map[string]*string{}
	for _, k := range cniEnvNames {
		if v, ok := os.LookupEnv(k); ok {
			saved[k] = &v
		} else {
			saved[k] = nil
		}
	}
	t.Cleanup(func() {
		for k, v := range saved {
			if v == nil {
				_ = os.Unsetenv(k)
			} else {
				_ = os.Setenv(k, *v)
			}
		}
	})
	return &skelRunner{t: t, dir: t.TempDir()}
}

func (s *skelRunner) run(env map[string]string, data []byte) (stdout, stderr string, code int) {
	t := s.t
	for _, k := range cniEnvNames {
		if v, ok := env[k]; ok {
			_ = os.Setenv(k, v)
		} else {
			_ = os.Unsetenv(k)
		}
	}
	// As main did with skel: the plugin makes the own-netns check itself, and
	// tells skel to skip its own.
	v := env["CNI_NETNS_OVERRIDE"]
	slowCheck := strings.ToUpper(v) != "TRUE" && v != "1" //nolint:gocritic // skel's own comparison
	_ = os.Setenv("CNI_NETNS_OVERRIDE", "1")
	files := make([]*os.File, 3)
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		path := filepath.Join(s.dir, name)
		content := []byte{}
		if i == 0 {
			content = data
		}
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close() //nolint:gocritic // three files, closed when the run ends
		files[i] = f
	}
	in, out, errOut := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = files[0], files[1], files[2]
	func() {
		defer func() { os.Stdin, os.Stdout, os.Stderr = in, out, errOut }()
		slow := &Plugin{Stdout: files[1], Stderr: files[2], CheckNetNS: slowCheck}
		conv := func(f func(*CmdArgs) error) func(*skel.CmdArgs) error {
			return func(a *skel.CmdArgs) error {
				return f(&CmdArgs{ContainerID: a.ContainerID, Netns: a.Netns, IfName: a.IfName, Args: a.Args, Path: a.Path,
					NetnsOverride: a.NetnsOverride, StdinData: a.StdinData})
			}
		}
		funcs := skel.CNIFuncs{Add: conv(slow.Add), Del: conv(slow.Del), Check: conv(slow.Check), GC: conv(slow.GC), Status: conv(slow.Status)}
		if e := skel.PluginMainFuncsWithError(funcs, version.PluginSupports(SupportedVersions...), About); e != nil {
			code = 1
			if err := e.Print(); err != nil {
				t.Fatal(err)
			}
		}
	}()
	o, err := os.ReadFile(filepath.Join(s.dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := os.ReadFile(filepath.Join(s.dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	return string(o), string(e), code
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
