package cniplugin

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// fast runs an ADD or a DEL, the calls a runtime makes for every pod, without
// encoding/json, whose reflection a process that lives for one call pays in full:
// the network config and nv-ipam.conf are read with a strict JSON reader
// (jsonlite.go), the result is written by hand in the layout of the CNI library,
// and the call is the same add or del as the library's way.
//
// It takes only what it is sure to treat exactly as the library's way would
// (Run has checked the environment as skel does): JSON that encoding/json could
// read differently, a config skel would refuse, or any configuration error is
// left to the library's way (done is false; nothing was sent to the daemon).
// Errors after the call was made are printed as skel prints them.
func (p *Plugin) fast(verb string, args *CmdArgs) (exitCode int, done bool) {
	cfg, err := fastConfig(args.StdinData, args.Args, verb == "ADD")
	if err != nil {
		return 0, false
	}
	s, err := p.connect(cfg, verb)
	if err == nil {
		if verb == "ADD" {
			err = p.add(s, args, printResultLite)
		} else {
			err = p.del(s, args)
		}
	}
	if err != nil {
		return p.printError(err), true
	}
	return 0, true
}

// printError prints err as skel does (a CNI error object, indented by four
// spaces) and returns the exit code 1.
func (p *Plugin) printError(err error) int {
	var e *types.Error
	if !errors.As(err, &e) {
		e = types.NewError(types.ErrInternal, err.Error(), "")
	}
	if data, err := json.MarshalIndent(e, "", "    "); err == nil {
		_, _ = p.Stdout.Write(data)
	}
	return 1
}

// validName is the CNI library's rule for container IDs and network names:
// [a-zA-Z0-9][a-zA-Z0-9_.-]*.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}

// readAll reads fd to its end with plain system calls (an os.File would set up
// the runtime's network poller for it).
func readAll(fd int) ([]byte, error) {
	buf := make([]byte, 0, 4096)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return nil, err
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// readFileLite is os.ReadFile with plain system calls.
func readFileLite(path string) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	return readAll(fd)
}

// fastConfig reads the network config with jsonlite, checks what skel checks
// (a network name, a supported cniVersion), and resolves it as LoadConfig does.
func fastConfig(data []byte, envArgs string, needPod bool) (*Config, error) {
	v, err := parseJSONLite(data)
	if err != nil {
		return nil, err
	}
	var nc netConf
	if err := netConfLite(v, &nc); err != nil {
		return nil, err
	}
	if !validName(nc.Name) || !slices.Contains(SupportedVersions, nc.CNIVersion) {
		return nil, errJSON
	}
	return resolveConfig(&nc, envArgs, needPod, readFileLite, fileConfigLite)
}

// netConfLite fills nc from v as encoding/json would, or refuses (errJSON).
func netConfLite(v *jvalue, nc *netConf) error {
	if v.kind != jObj {
		return errJSON
	}
	m, err := v.members("cniVersion", "name", "ipam", "deviceID", "pciBusID", "master", "device", "runtimeConfig", "args",
		"cni.dev/valid-attachments", "prevResult")
	if err != nil || m[9] != nil { // GC's attachments: the full path's
		return errJSON
	}
	for i, dst := range []*string{&nc.CNIVersion, &nc.Name, nil, &nc.DeviceID, &nc.PCIBusID, &nc.Master, &nc.Device} {
		if dst != nil {
			if err := m[i].str(dst); err != nil {
				return err
			}
		}
	}
	if m[2] != nil && m[2].kind != jNull {
		nc.IPAM = &ipamSection{}
		im, err := m[2].members("type")
		if err != nil || im[0].str(&nc.IPAM.Type) != nil {
			return errJSON
		}
		if err := fileConfigFrom(m[2], &nc.IPAM.FileConfig); err != nil {
			return err
		}
	}
	rc, err := m[7].members("ips", "deviceID")
	if err != nil {
		return err
	}
	if nc.RuntimeConfig.IPs, err = rc[0].strings(); err != nil {
		return err
	}
	if err := rc[1].str(&nc.RuntimeConfig.DeviceID); err != nil {
		return err
	}
	if m[8] != nil && m[8].kind != jNull {
		nc.Args = &struct {
			CNI *cniArgs `json:"cni,omitempty"`
		}{}
		am, err := m[8].members("cni")
		if err != nil {
			return err
		}
		if am[0] != nil && am[0].kind != jNull {
			a := &cniArgs{}
			cm, err := am[0].members("ips", "poolNames", "poolType", "allocateDefaultGateway", "allocateIPWithIndex")
			if err != nil {
				return err
			}
			if a.IPs, err = cm[0].strings(); err != nil {
				return err
			}
			if a.PoolNames, err = cm[1].strings(); err != nil {
				return err
			}
			if err := cm[2].str(&a.PoolType); err != nil {
				return err
			}
			if err := cm[3].boolean(&a.AllocateDefaultGateway); err != nil {
				return err
			}
			n, err := cm[4].integer(32)
			if err != nil {
				return err
			}
			if n != nil {
				i := int32(*n)
				a.AllocateIPWithIndex = &i
			}
			nc.Args.CNI = a
		}
	}
	return nil
}

// fileConfigLite decodes nv-ipam.conf as encoding/json would, or refuses.
func fileConfigLite(data []byte, fc *FileConfig) error {
	v, err := parseJSONLite(data)
	if err != nil {
		return err
	}
	if v.kind != jObj {
		return errJSON
	}
	return fileConfigFrom(v, fc)
}

func fileConfigFrom(v *jvalue, fc *FileConfig) error {
	m, err := v.members("daemonSocket", "daemonCallTimeoutSeconds", "logFile", "logLevel", "confDir", "poolName", "poolType",
		"rail", "forcePoolName")
	if err != nil {
		return err
	}
	for i, dst := range []*string{&fc.DaemonSocket, nil, &fc.LogFile, &fc.LogLevel, &fc.ConfDir, &fc.PoolName, &fc.PoolType, &fc.Rail} {
		if dst != nil {
			if err := m[i].str(dst); err != nil {
				return err
			}
		}
	}
	n, err := m[1].integer(strconv.IntSize)
	if err != nil {
		return err
	}
	if n != nil {
		t := int(*n)
		fc.DaemonCallTimeoutSeconds = &t
	}
	if m[8] != nil && m[8].kind != jNull {
		var b bool
		if err := m[8].boolean(&b); err != nil {
			return err
		}
		fc.ForcePoolName = &b
	}
	return nil
}

// printResultLite writes res as printResult does, byte for byte (the layout of
// json.MarshalIndent with four spaces of the CNI library's result types), without
// encoding/json: 1.x results as they are; 0.3.x and 0.4.0 with each address's IP
// version and an empty "dns".
func printResultLite(w io.Writer, res *current.Result, cniVersion string) error {
	old := !strings.HasPrefix(cniVersion, "1.")
	var b strings.Builder
	b.WriteString("{\n    \"cniVersion\": \"" + cniVersion + "\"")
	if len(res.IPs) > 0 {
		b.WriteString(",\n    \"ips\": [")
		for i, ip := range res.IPs {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n        {")
			sep := "\n"
			if old {
				family := "6"
				if ip.Address.IP.To4() != nil {
					family = "4"
				}
				b.WriteString("\n            \"version\": \"" + family + "\"")
				sep = ",\n"
			}
			b.WriteString(sep + "            \"address\": \"" + ip.Address.String() + "\"")
			if ip.Gateway != nil {
				b.WriteString(",\n            \"gateway\": \"" + ip.Gateway.String() + "\"")
			}
			b.WriteString("\n        }")
		}
		b.WriteString("\n    ]")
	}
	if len(res.Routes) > 0 {
		b.WriteString(",\n    \"routes\": [")
		for i, r := range res.Routes {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n        {\n            \"dst\": \"" + r.Dst.String() + "\"")
			if r.GW != nil {
				b.WriteString(",\n            \"gw\": \"" + r.GW.String() + "\"")
			}
			b.WriteString("\n        }")
		}
		b.WriteString("\n    ]")
	}
	if old {
		b.WriteString(",\n    \"dns\": {}")
	}
	b.WriteString("\n}")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return types.NewError(types.ErrIOFailure, "writing the result", err.Error())
	}
	return nil
}
