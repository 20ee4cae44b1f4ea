package cniplugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/hwipam/hwipam/api/v1alpha1"
	"github.com/hwipam/hwipam/pkg/cniplugin"
	"github.com/hwipam/hwipam/pkg/iprange"
	"github.com/hwipam/hwipam/pkg/nodealloc"
	"github.com/hwipam/hwipam/test/harness"
)

// daemon serves the real node service with the pool net-a (10.1.0.1-100).
func daemon(t *testing.T) (string, *nodealloc.Manager) {
	t.Helper()
	start, end := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.100")
	return harness.ServeNode(t, &nodealloc.PoolConfig{Name: "net-a", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.1.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: start, DefaultGateway: true})
}

func conf(version, socket, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion": %q, "name": "net-a", "type": "macvlan", "deviceID": "0000:3b:00.2" %s,
		"ipam": {"type": "nv-ipam", "daemonSocket": %q, "confDir": "/nonexistent", "logFile": ""}}`, version, extra, socket))
}

const podArgs = "IgnoreUnknown=1;K8S_POD_NAME=p1;K8S_POD_NAMESPACE=ns;K8S_POD_UID=u1"

// grpcOnlyDaemon is daemon without the compact endpoint: a daemon of an earlier
// version during a rolling upgrade, or nv-ipam's.
func grpcOnlyDaemon(t *testing.T) (string, *nodealloc.Manager) {
	t.Helper()
	start, end := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.100")
	return harness.ServeNodeGRPCOnly(t, &nodealloc.PoolConfig{Name: "net-a", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.1.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start, Gateway: start, DefaultGateway: true})
}

func TestVerbsAcrossSpecVersions(t *testing.T) {
	for name, serve := range map[string]func(*testing.T) (string, *nodealloc.Manager){"compact endpoint": daemon, "gRPC only": grpcOnlyDaemon} {
		t.Run(name, func(t *testing.T) { verbsAcrossSpecVersions(t, serve) })
	}
}

func verbsAcrossSpecVersions(t *testing.T, serve func(*testing.T) (string, *nodealloc.Manager)) {
	socket, m := serve(t)
	for i, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			var out bytes.Buffer
			p := &cniplugin.Plugin{Stdout: &out}
			args := &cniplugin.CmdArgs{ContainerID: fmt.Sprintf("c%d", i), IfName: "net1", Args: podArgs, StdinData: conf(v, socket, "")}
			if err := p.Add(args); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			var res map[string]any
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatalf("ADD printed %q: %v", out.String(), err)
			}
			want := fmt.Sprintf("10.1.0.%d/24", i+2)
			if res["cniVersion"] != v || !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "0.0.0.0/0") {
				t.Errorf("ADD result for %s = %s, want version %s, %s and a default route", v, out.String(), v, want)
			}
			if v != "0.3.0" && v != "0.3.1" { // CHECK exists since 0.4.0
				withPrev := conf(v, socket, `, "prevResult": `+out.String())
				if err := p.Check(&cniplugin.CmdArgs{ContainerID: args.ContainerID, IfName: "net1", Args: podArgs, StdinData: withPrev}); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := p.Del(args); err != nil {
				t.Errorf("DEL: %v", err)
			}
			if err := p.Del(args); err != nil {
				t.Errorf("second DEL: %v", err)
			}
		})
	}
	if n := len(m.Allocations("")); n != 0 {
		t.Errorf("%d pools still hold allocations after every DEL", n)
	}
}

func TestDeviceIDStaticIPsAndArgs(t *testing.T) {
	socket, m := daemon(t)
	var out bytes.Buffer
	p := &cniplugin.Plugin{Stdout: &out}
	// runtimeConfig.ips wins over args.cni.ips, which wins over CNI_ARGS IP=.
	stdin := conf("1.0.0", socket, `, "runtimeConfig": {"ips": ["10.1.0.50/24"]}, "args": {"cni": {"ips": ["10.1.0.60"]}}`)
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "s1", IfName: "net1", Args: podArgs + ";IP=10.1.0.70", StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "10.1.0.50/24") {
		t.Errorf("runtimeConfig.ips not used: %s", out.String())
	}
	out.Reset()
	stdin = conf("1.0.0", socket, `, "args": {"cni": {"ips": ["10.1.0.60"]}}`)
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "s2", IfName: "net1", Args: podArgs + ";IP=10.1.0.70", StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "10.1.0.60/24") {
		t.Errorf("args.cni.ips not used: %s", out.String())
	}
	out.Reset()
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "s3", IfName: "net1", Args: podArgs + ";IP=10.1.0.70", StdinData: conf("1.0.0", socket, "")}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "10.1.0.70/24") {
		t.Errorf("CNI_ARGS IP= not used: %s", out.String())
	}
	out.Reset()
	stdin = conf("1.0.0", socket, `, "args": {"cni": {"allocateIPWithIndex": 9}}`)
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "s4", IfName: "net1", Args: podArgs, StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "10.1.0.10/24") {
		t.Errorf("allocateIPWithIndex 9 not used: %s", out.String())
	}
	for _, a := range m.Allocations("net-a")["net-a"] {
		if a.DeviceID != "0000:3b:00.2" || a.PodName != "p1" || a.PodNamespace != "ns" || a.PodUID != "u1" {
			t.Errorf("allocation %s recorded as %+v, want the deviceID and pod metadata", a.IP, a)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	socket, _ := daemon(t)
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}}
	for name, tc := range map[string]struct {
		stdin string
		args  string
		code  uint
	}{
		"no ipam section":  {`{"cniVersion": "1.0.0", "name": "n"}`, podArgs, types.ErrInvalidNetworkConfig},
		"no pod name":      {string(conf("1.0.0", socket, "")), "K8S_POD_NAMESPACE=ns", types.ErrInvalidNetworkConfig},
		"bad static IP":    {string(conf("1.0.0", socket, `, "runtimeConfig": {"ips": ["nope"]}`)), podArgs, types.ErrInvalidNetworkConfig},
		"negative timeout": {strings.Replace(string(conf("1.0.0", socket, "")), `"logFile": ""`, `"daemonCallTimeoutSeconds": -1`, 1), podArgs, types.ErrInvalidNetworkConfig},
		"daemon not there": {string(conf("1.0.0", "unix:///nonexistent/x.sock", "")), podArgs, types.ErrTryAgainLater},
	} {
		t.Run(name, func(t *testing.T) {
			err := p.Add(&cniplugin.CmdArgs{ContainerID: "e", IfName: "net1", Args: tc.args, StdinData: []byte(tc.stdin)})
			var cniErr *types.Error
			if !errors.As(err, &cniErr) || cniErr.Code != tc.code {
				t.Errorf("ADD = %v, want CNI code %d", err, tc.code)
			}
		})
	}
}

// TestPoolWithoutBlockOnNode: ADD in a pool that has no block on this node is
// CNI code 11 saying so and what to check, not "unknown container"; CHECK of an
// interface with nothing allocated stays code 3.
func TestPoolWithoutBlockOnNode(t *testing.T) {
	socket, _ := daemon(t)
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}}
	stdin := []byte(strings.Replace(string(conf("1.0.0", socket, "")), `"name": "net-a"`, `"name": "net-z"`, 1))
	err := p.Add(&cniplugin.CmdArgs{ContainerID: "e", IfName: "net1", Args: podArgs, StdinData: stdin})
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater || cniErr.Msg != "pool has no block on this node" ||
		!strings.Contains(cniErr.Details, `IPPool "net-z" has no block on node n1`) || !strings.Contains(cniErr.Details, "nodeSelector") {
		t.Errorf("ADD in a pool without a block here = %v, want code 11 naming the pool and node and what to check", err)
	}
	err = p.Check(&cniplugin.CmdArgs{ContainerID: "never-added", IfName: "net1", Args: podArgs, StdinData: conf("1.0.0", socket, "")})
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrUnknownContainer {
		t.Errorf("CHECK of nothing = %v, want CNI code 3", err)
	}
}

func TestConfFileFillsGapsAndForcePoolName(t *testing.T) {
	socket, _ := daemon(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, cniplugin.ConfFileName),
		[]byte(fmt.Sprintf(`{"daemonSocket": %q, "daemonCallTimeoutSeconds": 3, "forcePoolName": true}`, socket)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "net-a", "ipam": {"type": "nv-ipam", "confDir": %q %%s}}`, dir)
	c, err := cniplugin.LoadConfig([]byte(fmt.Sprintf(base, `, "poolName": "net-a"`)), podArgs, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.DaemonSocket != socket || c.Timeout.Seconds() != 3 || c.Pools[0] != "net-a" {
		t.Errorf("config = %+v, want the socket and timeout from the conf file", c)
	}
	if _, err := cniplugin.LoadConfig([]byte(fmt.Sprintf(base, "")), podArgs, true); err == nil ||
		!strings.Contains(err.Error(), "forcePoolName") {
		t.Errorf("no poolName under forcePoolName = %v", err)
	}
	c, err = cniplugin.LoadConfig([]byte(fmt.Sprintf(base, `, "poolName": "a, b", "poolType": "CIDRPool"`)), podArgs, true)
	if err != nil || len(c.Pools) != 2 || c.Pools[1] != "b" || c.PoolType != "cidrpool" {
		t.Errorf("two pools, case-insensitive type: %+v %v", c, err)
	}
}

func TestExhaustedPoolNamesPoolAndNode(t *testing.T) {
	socket, m := daemon(t)
	start, end := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	if err := m.SetPool(&nodealloc.PoolConfig{Name: "tiny", Kind: v1alpha1.KindIPPool, Prefix: netip.MustParsePrefix("10.9.0.0/24"),
		Block: iprange.Range{Start: start, End: end}, ExclusionBase: start}); err != nil {
		t.Fatal(err)
	}
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}}
	stdin := []byte(strings.Replace(string(conf("1.0.0", socket, "")), `"name": "net-a"`, `"name": "tiny"`, 1))
	var err error
	for i := range 3 {
		err = p.Add(&cniplugin.CmdArgs{ContainerID: fmt.Sprintf("x%d", i), IfName: "net1", Args: podArgs, StdinData: stdin})
	}
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Msg != "pool exhausted" || !strings.Contains(cniErr.Details, "pool tiny") ||
		!strings.Contains(cniErr.Details, "node n1") {
		t.Errorf("third ADD in a two-address block = %v, want a 'pool exhausted' error naming pool tiny and node n1", err)
	}
}

// TestGatewayHolderResult: the CNI result for allocateDefaultGateway carries the
// gateway address as the interface's address, and neither a gateway nor the
// default route through it.
func TestGatewayHolderResult(t *testing.T) {
	socket, _ := daemon(t)
	var out bytes.Buffer
	p := &cniplugin.Plugin{Stdout: &out}
	stdin := conf("1.0.0", socket, `, "args": {"cni": {"allocateDefaultGateway": true}}`)
	if err := p.Add(&cniplugin.CmdArgs{ContainerID: "router", IfName: "net1", Args: podArgs, StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
			Gateway string `json:"gateway"`
		} `json:"ips"`
		Routes []any `json:"routes"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("ADD printed %q: %v", out.String(), err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address != "10.1.0.1/24" || res.IPs[0].Gateway != "" || len(res.Routes) != 0 {
		t.Errorf("ADD result = %s, want 10.1.0.1/24 with no gateway and no routes", out.String())
	}
}

// TestImportGraphIsLean: the plugin binary, exec'd for every CNI call, links
// neither grpc-go, net/http nor the protobuf runtime, nor skel.
func TestImportGraphIsLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", filepath.Join(harness.RepoRoot(), "cmd", "nv-ipam")).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		// skel and the packages only it brings (a regular expression compiled at
		// start-up among them) cost every call about 0.1 ms before main runs.
		if strings.HasPrefix(d, "google.golang.org/grpc") || d == "net/http" || strings.HasPrefix(d, "google.golang.org/protobuf") ||
			strings.HasPrefix(d, "k8s.io/") || d == "github.com/containernetworking/cni/pkg/skel" || d == "regexp" {
			t.Errorf("cmd/nv-ipam imports %s", d)
		}
	}
	if len(deps) > 95 {
		t.Errorf("cmd/nv-ipam links %d packages, want at most 95 (it had 325 with grpc-go, 100 with skel)", len(deps))
	}
}

// TestNetNSCheck: the plugin binary refuses a CNI_NETNS that is its own network
// namespace with skel's code and message, but before ADD allocates anything, and
// after DEL released the addresses (as skel does); CNI_NETNS_OVERRIDE turns the
// check off, and another namespace passes it.
func TestNetNSCheck(t *testing.T) {
	socket, m := daemon(t)
	bin := harness.BuildBinary(t, "./cmd/nv-ipam")
	other := harness.NewNetNS(t)
	run := func(cmd, cid, netns string, env ...string) (string, error) {
		c := exec.Command(bin)
		c.Env = append([]string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + cid, "CNI_NETNS=" + netns, "CNI_IFNAME=net1",
			"CNI_PATH=/nonexistent", "CNI_ARGS=" + podArgs}, env...)
		c.Stdin = bytes.NewReader(conf("1.0.0", socket, ""))
		out, err := c.Output()
		return string(out), err
	}
	held := func(cid string) int {
		n := 0
		for _, a := range m.Allocations("net-a")["net-a"] {
			if a.ContainerID == cid {
				n++
			}
		}
		return n
	}
	const refused = "plugin's netns and netns from CNI_NETNS should not be the same"
	own := "/proc/self/ns/net" // the child's own, as it resolves in the child
	out, err := run("ADD", "own", own)
	if err == nil || !strings.Contains(out, refused) || !strings.Contains(out, `"code": 8`) {
		t.Errorf("ADD in the plugin's own netns: %v, printed %s; want code 8 %q", err, out, refused)
	}
	if n := held("own"); n != 0 {
		t.Errorf("a refused ADD left %d allocations", n)
	}
	if out, err := run("ADD", "own", own, "CNI_NETNS_OVERRIDE=1"); err != nil || held("own") != 1 {
		t.Fatalf("ADD with CNI_NETNS_OVERRIDE=1: %v, printed %s, %d allocations", err, out, held("own"))
	}
	out, err = run("DEL", "own", own)
	if err == nil || !strings.Contains(out, refused) {
		t.Errorf("DEL in the plugin's own netns: %v, printed %s; want %q", err, out, refused)
	}
	if n := held("own"); n != 0 {
		t.Errorf("DEL in the plugin's own netns kept %d allocations; skel releases, then refuses", n)
	}
	if out, err := run("ADD", "pod", other.Path); err != nil || held("pod") != 1 {
		t.Errorf("ADD in a pod's netns: %v, printed %s", err, out)
	}
	if out, err := run("DEL", "pod", other.Path); err != nil || held("pod") != 0 {
		t.Errorf("DEL in a pod's netns: %v, printed %s", err, out)
	}
	if out, err := run("DEL", "gone", "/nonexistent/netns"); err != nil {
		t.Errorf("DEL with a netns that is gone: %v, printed %s", err, out)
	}
}
