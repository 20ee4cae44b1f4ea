package cniplugin_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/hwipam/hwipam/pkg/cniplugin"
	"github.com/hwipam/hwipam/pkg/nodealloc"
)

// netConf is a network named name whose addresses come from the pool net-a.
func netConf(socket, name, extra string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "macvlan" %s,
		"ipam": {"type": "nv-ipam", "poolName": "net-a", "daemonSocket": %q, "confDir": "/nonexistent", "logLevel": "panic"}}`, name, extra, socket))
}

func held(m *nodealloc.Manager) []string {
	var out []string
	for _, a := range m.Allocations("net-a")["net-a"] {
		out = append(out, a.ContainerID+"@"+a.Network)
	}
	return out
}

// TestGCReleasesOnlyItsOwnNetwork: networks red and blue share the pool net-a.
// GC of red, whose valid attachments name only red's, must not release blue's
// allocations, nor those whose network is not known (nv-ipam's plugin, records
// from before the network was recorded).
func TestGCReleasesOnlyItsOwnNetwork(t *testing.T) {
	socket, m := daemon(t)
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}}
	for _, a := range []struct{ cid, network string }{{"red-1", "red"}, {"red-2", "red"}, {"blue-1", "blue"}} {
		if err := p.Add(&cniplugin.CmdArgs{ContainerID: a.cid, IfName: "net1", Args: podArgs, StdinData: netConf(socket, a.network, "")}); err != nil {
			t.Fatal(err)
		}
	}
	// As nv-ipam's plugin allocates: no network name on the wire.
	if _, err := m.Allocate(t.Context(), &nodealloc.Request{Pools: []string{"net-a"}, ContainerID: "legacy-1", IfName: "net1",
		Meta: nodealloc.Metadata{PodName: "p", PodNamespace: "ns"}}); err != nil {
		t.Fatal(err)
	}
	if got := held(m); !slices.Equal(got, []string{"blue-1@blue", "legacy-1@", "red-1@red", "red-2@red"}) {
		t.Fatalf("allocations = %v, want each with its network recorded", got)
	}

	gc := func(network, valid string) error {
		return p.GC(&cniplugin.CmdArgs{StdinData: netConf(socket, network, `, "cni.dev/valid-attachments": [`+valid+`]`)})
	}
	if err := gc("red", `{"containerID": "red-1", "ifname": "net1"}`); err != nil {
		t.Fatal(err)
	}
	if got := held(m); !slices.Equal(got, []string{"blue-1@blue", "legacy-1@", "red-1@red"}) {
		t.Errorf("after GC of red = %v, want only red-2 released", got)
	}
	if err := gc("blue", ""); err != nil {
		t.Fatal(err)
	}
	if got := held(m); !slices.Equal(got, []string{"legacy-1@", "red-1@red"}) {
		t.Errorf("after GC of blue = %v, want only blue-1 released", got)
	}

	// Without a network name GC cannot tell its allocations: a config error.
	err := p.GC(&cniplugin.CmdArgs{StdinData: []byte(fmt.Sprintf(`{"cniVersion": "1.1.0", "type": "macvlan",
		"ipam": {"type": "nv-ipam", "poolName": "net-a", "daemonSocket": %q, "confDir": "/nonexistent"}}`, socket))})
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrInvalidNetworkConfig {
		t.Errorf("GC without a network name = %v, want CNI code 7", err)
	}
	if got := held(m); !slices.Equal(got, []string{"legacy-1@", "red-1@red"}) {
		t.Errorf("after a refused GC = %v, want nothing released", got)
	}
}

// TestTheDRANetworkNameIsRefused: a network named nic.hwipam.io (the name the
// DRA driver's allocations carry) is refused at ADD, by the fast way and by the
// library's, with a configuration error that says to rename it, and nothing is
// allocated; its GC is refused too, so that it cannot release the driver's
// allocations. A DEL goes through (an attachment made before is released).
func TestTheDRANetworkNameIsRefused(t *testing.T) {
	socket, m := daemon(t)
	conf := netConf(socket, "nic.hwipam.io", "")
	for _, verb := range []string{"ADD", "GC"} {
		env := map[string]string{"CNI_COMMAND": verb, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/nonexistent", "CNI_IFNAME": "net1",
			"CNI_ARGS": podArgs, "CNI_PATH": "/opt/cni/bin"}
		var out bytes.Buffer
		p := &cniplugin.Plugin{Stdout: &out, Stderr: &bytes.Buffer{}}
		code := p.Run(func(k string) string { return env[k] }, bytes.NewReader(conf))
		if code == 0 || !bytes.Contains(out.Bytes(), []byte("reserved for hwipam's DRA driver")) ||
			!bytes.Contains(out.Bytes(), []byte("rename the network")) || !bytes.Contains(out.Bytes(), []byte(`"code": 7`)) {
			t.Errorf("%s of network nic.hwipam.io: exit %d, %s; want CNI error 7 saying to rename the network", verb, code, out.String())
		}
	}
	if got := held(m); len(got) != 0 {
		t.Errorf("allocations after the refused ADD: %v", got)
	}
	p := &cniplugin.Plugin{Stdout: &bytes.Buffer{}}
	if err := p.Del(&cniplugin.CmdArgs{ContainerID: "c1", IfName: "net1", Args: podArgs, StdinData: conf}); err != nil {
		t.Errorf("DEL of network nic.hwipam.io: %v, want it to go through", err)
	}
}
