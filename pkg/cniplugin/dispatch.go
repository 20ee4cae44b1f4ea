package cniplugin

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// About is what the plugin prints on standard error when it is run without
// CNI_COMMAND, as a person would.
const About = "hwipam nv-ipam CNI IPAM plugin"

// CmdArgs is one call's arguments: the CNI_* environment and the network config
// read from standard input (the fields of the CNI library's skel.CmdArgs).
type CmdArgs struct {
	ContainerID   string
	Netns         string
	IfName        string
	Args          string
	Path          string
	NetnsOverride string
	StdinData     []byte
}

// Run is the plugin's main: one CNI call, its environment read with getenv and
// its network config from stdin, the result or the error object printed on
// p.Stdout; it returns the exit code. It dispatches as the CNI library's skel
// does, with skel's checks, error codes and messages (TestRunMatchesSkel holds it
// to that), but without linking skel: skel's package graph (a regular expression
// compiled at start-up among it) costs a process that lives for one call about
// 0.1 ms before main runs. ADD and DEL take the short way (fast.go) when the
// config reads exactly; everything else goes the library's way.
func (p *Plugin) Run(getenv func(string) string, stdin io.Reader) int {
	verb, args, err := cmdArgsFromEnv(getenv)
	if err != nil {
		if err.Code == types.ErrInvalidEnvironmentVariables && getenv("CNI_COMMAND") == "" {
			if p.Stderr != nil {
				_, _ = io.WriteString(p.Stderr, About+"\nCNI protocol versions supported: "+strings.Join(SupportedVersions, ", ")+"\n")
			}
			return 0
		}
		return p.printError(err)
	}
	// skel's own-netns check after ADD and DEL, unless the runtime overrides it;
	// add and del make it themselves (see checkNetNS).
	p.CheckNetNS = strings.ToUpper(args.NetnsOverride) != "TRUE" && args.NetnsOverride != "1" //nolint:gocritic // skel's own comparison, kept as skel makes it
	if verb != "VERSION" {
		data, rerr := readStdin(stdin)
		if rerr != nil {
			return p.printError(types.NewError(types.ErrIOFailure, "error reading from stdin: "+rerr.Error(), ""))
		}
		args.StdinData = data
		if verb == "ADD" || verb == "DEL" {
			if code, done := p.fast(verb, args); done {
				return code
			}
		}
		if err := validateNetworkConfig(args.StdinData); err != nil {
			return p.printError(err)
		}
	}
	if err := p.dispatch(verb, args); err != nil {
		return p.printError(err)
	}
	return 0
}

// readStdin reads standard input with plain system calls when it is the
// process's own (an os.File would set up the runtime's network poller for it).
func readStdin(r io.Reader) ([]byte, error) {
	if f, ok := r.(*os.File); ok && f == os.Stdin {
		return readAll(int(f.Fd()))
	}
	return io.ReadAll(r)
}

// cniEnv is one CNI_* variable: the verbs that require it, and whether its value
// is checked (only for a verb that requires it).
var cniEnv = []struct {
	name     string
	required []string
	validate func(string) *types.Error
}{
	{"CNI_COMMAND", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_CONTAINERID", []string{"ADD", "CHECK", "DEL"}, validateContainerID},
	{"CNI_NETNS", []string{"ADD", "CHECK"}, nil},
	{"CNI_IFNAME", []string{"ADD", "CHECK", "DEL"}, validateIfName},
	{"CNI_ARGS", nil, nil},
	{"CNI_PATH", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_NETNS_OVERRIDE", nil, nil},
}

// cmdArgsFromEnv reads the environment as skel does: a value a verb requires is
// checked in the order above, the first bad one is the error; every missing one
// is named in one error after that.
func cmdArgsFromEnv(getenv func(string) string) (string, *CmdArgs, *types.Error) {
	verb := getenv("CNI_COMMAND")
	vals := make([]string, len(cniEnv))
	var missing []string
	for i, v := range cniEnv {
		vals[i] = getenv(v.name)
		required := false
		for _, c := range v.required {
			required = required || c == verb
		}
		switch {
		case vals[i] == "":
			if required || v.name == "CNI_COMMAND" {
				missing = append(missing, v.name)
			}
		case required && v.validate != nil:
			if err := v.validate(vals[i]); err != nil {
				return "", nil, err
			}
		}
	}
	if len(missing) > 0 {
		return "", nil, types.NewError(types.ErrInvalidEnvironmentVariables, "required env variables ["+strings.Join(missing, ",")+"] missing", "")
	}
	return verb, &CmdArgs{ContainerID: vals[1], Netns: vals[2], IfName: vals[3], Args: vals[4], Path: vals[5], NetnsOverride: vals[6]}, nil
}

// validateContainerID is the CNI library's check of a container ID.
func validateContainerID(id string) *types.Error {
	if !validName(id) {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "invalid characters in containerID", id)
	}
	return nil
}

// validateIfName is the CNI library's check of an interface name: at most 15
// bytes, not "." or "..", no '/', ':' or white space (bytes that are not UTF-8
// count as U+FFFD).
func validateIfName(name string) *types.Error {
	switch {
	case len(name) > 15:
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is too long", "interface name should be less than 16 characters")
	case name == "." || name == "..":
		return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name is . or ..", "")
	}
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return types.NewError(types.ErrInvalidEnvironmentVariables, "interface name contains / or : or whitespace characters", "")
		}
		i += n
	}
	return nil
}

// validateNetworkConfig is skel's check of the network config before any verb
// but VERSION: JSON with a valid network name.
func validateNetworkConfig(data []byte) *types.Error {
	var conf struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "error unmarshall network config: "+err.Error(), "")
	}
	if conf.Name == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "missing network name", "")
	}
	if !validName(conf.Name) {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid characters found in network name", conf.Name)
	}
	return nil
}

// dispatch runs verb, after the CNI library's version checks for it: the config's
// cniVersion must be one the plugin supports, and at least 0.4.0 for CHECK and
// 1.1.0 for GC and STATUS.
func (p *Plugin) dispatch(verb string, args *CmdArgs) error {
	info := version.PluginSupports(SupportedVersions...)
	var call func(*CmdArgs) error
	minimum := ""
	switch verb {
	case "ADD":
		call = p.Add
	case "DEL":
		call = p.Del
	case "CHECK":
		call, minimum = p.Check, "0.4.0"
	case "GC":
		call, minimum = p.GC, "1.1.0"
	case "STATUS":
		call, minimum = p.Status, "1.1.0"
	case "VERSION":
		if err := info.Encode(p.Stdout); err != nil {
			return types.NewError(types.ErrIOFailure, err.Error(), "")
		}
		return nil
	default:
		return types.NewError(types.ErrInvalidEnvironmentVariables, "unknown CNI_COMMAND: "+verb, "")
	}
	configVersion, err := (&version.ConfigDecoder{}).Decode(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if minimum != "" {
		ok, err := version.GreaterThanOrEqualTo(configVersion, minimum)
		switch {
		case err != nil:
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		case !ok:
			return types.NewError(types.ErrIncompatibleCNIVersion, "config version does not allow "+verb, "")
		}
		supported := false
		for _, v := range info.SupportedVersions() {
			ok, err := version.GreaterThanOrEqualTo(v, configVersion)
			if err != nil {
				return types.NewError(types.ErrDecodingFailure, err.Error(), "")
			}
			if ok {
				supported = true
				break
			}
		}
		if !supported {
			return types.NewError(types.ErrIncompatibleCNIVersion, "plugin version does not allow "+verb, "")
		}
	}
	if verr := (&version.Reconciler{}).Check(configVersion, info); verr != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "incompatible CNI versions", verr.Details())
	}
	if err := call(args); err != nil {
		var e *types.Error
		if errors.As(err, &e) {
			return e
		}
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return nil
}
