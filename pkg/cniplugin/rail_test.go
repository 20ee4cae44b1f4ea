package cniplugin_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/pkg/cniplugin"
)

// TestRailConfig: ipam.rail picks the pools by rail, carries the attachment's
// device to the daemon, and is refused with what to do when it cannot work.
func TestRailConfig(t *testing.T) {
	const pod = "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns"
	c, err := cniplugin.LoadConfig([]byte(`{"cniVersion": "1.0.0", "name": "rails", "type": "host-device", "deviceID": "0000:3c:00.1",
		"pciBusID": "0000:3c:00.1", "device": "ens1f0v1", "master": "ens1f0np0",
		"ipam": {"type": "nv-ipam", "rail": "auto", "confDir": "/nonexistent"}}`), pod, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rail != "auto" || len(c.Pools) != 0 || c.DeviceID != "0000:3c:00.1" || c.PCIBusID != "0000:3c:00.1" ||
		c.Device != "ens1f0v1" || c.Master != "ens1f0np0" {
		t.Errorf("rail auto: %+v", c)
	}
	c, err = cniplugin.LoadConfig([]byte(`{"cniVersion": "1.0.0", "name": "rails", "ipam": {"type": "nv-ipam", "rail": "rail-3.a",
		"poolType": "cidrpool", "confDir": "/nonexistent"}}`), pod, true)
	if err != nil || c.Rail != "rail-3.a" || c.PoolType != "cidrpool" || len(c.Pools) != 0 {
		t.Errorf("a named rail, no device needed, poolType kept: %+v %v", c, err)
	}
	for name, tc := range map[string]struct{ conf, want string }{
		"rail and poolName": {`{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:3c:00.1",
			"ipam": {"type": "nv-ipam", "rail": "auto", "poolName": "a"}}`, "remove ipam.poolName"},
		"rail and args.cni.poolNames": {`{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:3c:00.1",
			"ipam": {"type": "nv-ipam", "rail": "auto"}, "args": {"cni": {"poolNames": ["a"]}}}`, "remove ipam.poolName"},
		"auto without a device": {`{"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "nv-ipam", "rail": "auto"}}`,
			"names none: it needs deviceID"},
		"a rail no label carries": {`{"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "nv-ipam", "rail": "rail 3"}}`,
			`ipam.rail "rail 3": want "auto" or a rail name`},
		"a rail too long": {`{"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "nv-ipam", "rail": "` + strings.Repeat("r", 64) + `"}}`,
			"at most 63 characters"},
	} {
		_, err := cniplugin.LoadConfig([]byte(tc.conf), pod, true)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "invalid network configuration") {
			t.Errorf("%s: %v, want a configuration error saying %q", name, err, tc.want)
		}
	}
	// The deviceID capability (runtimeConfig), as Multus passes a network selection
	// element's deviceID; the top-level deviceID wins.
	c, err = cniplugin.LoadConfig([]byte(`{"cniVersion": "1.0.0", "name": "n", "runtimeConfig": {"deviceID": "0000:40:00.0"},
		"ipam": {"type": "nv-ipam", "rail": "auto", "confDir": "/nonexistent"}}`), pod, true)
	if err != nil || c.DeviceID != "0000:40:00.0" {
		t.Errorf("runtimeConfig.deviceID: %+v %v", c, err)
	}
	c, err = cniplugin.LoadConfig([]byte(`{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:18:00.0", "runtimeConfig": {"deviceID": "0000:40:00.0"},
		"ipam": {"type": "nv-ipam", "rail": "auto", "confDir": "/nonexistent"}}`), pod, true)
	if err != nil || c.DeviceID != "0000:18:00.0" {
		t.Errorf("top-level and runtimeConfig deviceID: %+v %v", c, err)
	}
	// nv-ipam.conf's poolName is a default for configs that name no pool: a config
	// with a rail does not take it.
	dir := t.TempDir()
	writeConf(t, dir, `{"poolName": "from-file", "forcePoolName": true}`)
	c, err = cniplugin.LoadConfig([]byte(`{"cniVersion": "1.0.0", "name": "n", "deviceID": "0000:3c:00.1",
		"ipam": {"type": "nv-ipam", "rail": "auto", "confDir": "`+dir+`"}}`), pod, true)
	if err != nil || len(c.Pools) != 0 || c.Rail != "auto" {
		t.Errorf("rail with nv-ipam.conf's poolName and forcePoolName: %+v %v", c, err)
	}
}

// TestRailAutoRefusesWhatIsNoDeviceName: with rail "auto", a device field that
// is not a name of what it can hold is a configuration error naming the field,
// what was wrong and what a valid value looks like; the same values without a
// rail are only recorded (deviceID) or not used, and a DEL is not refused (the
// daemon releases the interface wherever it holds addresses).
func TestRailAutoRefusesWhatIsNoDeviceName(t *testing.T) {
	const pod = "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns"
	for _, v := range []string{"../../../../etc/x", "/etc/passwd", "..", "x\u0000", strings.Repeat("a", 300), "eth0 1"} {
		raw, _ := json.Marshal(v)
		for _, c := range []struct{ top, field string }{
			{`"deviceID": ` + string(raw), "deviceID"},
			{`"runtimeConfig": {"deviceID": ` + string(raw) + `}`, "runtimeConfig.deviceID"},
			{`"pciBusID": ` + string(raw), "pciBusID"},
			{`"master": ` + string(raw), "master"},
			{`"device": ` + string(raw), "device"},
			{`"deviceID": "0000:3c:00.1", "master": ` + string(raw), "master"},
		} {
			conf := func(ipam string) []byte {
				return []byte(`{"cniVersion": "1.0.0", "name": "n", ` + c.top + `, "ipam": {"type": "nv-ipam", "confDir": "/nonexistent"` +
					ipam + `}}`)
			}
			_, err := cniplugin.LoadConfig(conf(`, "rail": "auto"`), pod, true)
			if err == nil || !strings.Contains(err.Error(), "invalid network configuration") ||
				!strings.Contains(err.Error(), c.field+" ") || !strings.Contains(err.Error(), "e.g.") {
				t.Errorf("rail auto, %s %q: %v, want a configuration error naming the field and what a valid one looks like",
					c.field, v, err)
			}
			if _, err := cniplugin.LoadConfig(conf(`, "rail": "auto"`), "", false); err != nil {
				t.Errorf("rail auto, DEL with %s %q: %v, want it sent to the daemon", c.field, v, err)
			}
			if _, err := cniplugin.LoadConfig(conf(`, "poolName": "a"`), pod, true); err != nil {
				t.Errorf("no rail, %s %q: %v, want accepted as before", c.field, v, err)
			}
		}
	}
}

func writeConf(t *testing.T, dir, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, cniplugin.ConfFileName), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
