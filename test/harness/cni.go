package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ErrNoCNIPlugins is returned when HWIPAM_CNI_BIN_DIR does not hold the reference
// plugins that `make test-assets` builds.
var ErrNoCNIPlugins = errors.New("CNI reference plugins not found: run `make test`, " +
	"or `eval \"$(hack/test-assets.sh env)\"` before `go test`")

// CNIBinDir returns the directory holding the reference plugins (macvlan, host-device,
// bridge, host-local), cnitool and noop, failing the test when it is missing.
func CNIBinDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("HWIPAM_CNI_BIN_DIR")
	if dir == "" {
		tb.Fatal(ErrNoCNIPlugins)
	}
	if _, err := os.Stat(filepath.Join(dir, "macvlan")); err != nil {
		tb.Fatalf("%v (HWIPAM_CNI_BIN_DIR=%s: %v)", ErrNoCNIPlugins, dir, err)
	}
	return dir
}

// CNICall is one invocation of a CNI plugin binary, as a container runtime makes it.
type CNICall struct {
	// Plugin is the path of the plugin binary.
	Plugin string
	// Command is CNI_COMMAND: ADD, DEL, CHECK, GC, STATUS or VERSION.
	Command string
	// ContainerID, NetNS and IfName fill CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME.
	ContainerID string
	NetNS       string
	IfName      string
	// Args fills CNI_ARGS ("K=V;K2=V2").
	Args string
	// Path fills CNI_PATH, where a main plugin finds its IPAM plugin.
	Path []string
	// Config is the network configuration written to the plugin's stdin.
	Config []byte
	// RunIn, when set, runs the plugin inside this namespace (`ip netns exec`), as if
	// it were the node's namespace: a macvlan master must be found there.
	RunIn *NetNS
	// Env holds extra environment variables.
	Env []string
}

// CNIError is the error object a plugin prints on failure (CNI spec, "Error").
type CNIError struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Code       uint   `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details,omitempty"`
	// Stderr is what the plugin wrote to its stderr.
	Stderr string `json:"-"`
}

func (e *CNIError) Error() string {
	return fmt.Sprintf("CNI error %d: %s (%s)", e.Code, e.Msg, e.Details)
}

// Run executes the call. On success it returns the plugin's stdout. When the plugin
// exits non-zero it returns a *CNIError decoded from stdout, or a plain error when the
// output is not an error object.
func (c CNICall) Run() ([]byte, error) {
	var cmd *exec.Cmd
	if c.RunIn != nil {
		cmd = exec.Command("ip", "netns", "exec", c.RunIn.Name, c.Plugin)
	} else {
		cmd = exec.Command(c.Plugin)
	}
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+c.Command,
		"CNI_CONTAINERID="+c.ContainerID,
		"CNI_NETNS="+c.NetNS,
		"CNI_IFNAME="+c.IfName,
		"CNI_ARGS="+c.Args,
		"CNI_PATH="+strings.Join(c.Path, string(os.PathListSeparator)),
	)
	cmd.Env = append(cmd.Env, c.Env...)
	cmd.Stdin = bytes.NewReader(c.Config)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return nil, fmt.Errorf("running %s %s: %w", c.Plugin, c.Command, err)
	}
	cniErr := &CNIError{Stderr: stderr.String()}
	if jerr := json.Unmarshal(stdout.Bytes(), cniErr); jerr != nil || cniErr.Msg == "" {
		return stdout.Bytes(), fmt.Errorf("%s %s exited %d without a CNI error object: stdout %q, stderr %q",
			c.Plugin, c.Command, exitErr.ExitCode(), stdout.String(), stderr.String())
	}
	return stdout.Bytes(), cniErr
}

// MustRun runs the call and fails the test when it does not succeed.
func (c CNICall) MustRun(tb testing.TB) []byte {
	tb.Helper()
	out, err := c.Run()
	if err != nil {
		tb.Fatalf("CNI %s with %s: %v", c.Command, filepath.Base(c.Plugin), err)
	}
	return out
}
