package ipamctl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	infov1 "github.com/hwipam/hwipam/api/grpc/hwipam/node/v1"
	"github.com/hwipam/hwipam/nicdiscovery"
)

// Where a setting of a NICView comes from.
const (
	FromFlag    = "flag"
	FromDaemon  = "daemon"
	FromDefault = "default"
)

// NICView is where a command reads this node's NICs from and which rail map it
// applies: what the running daemon reads and applies (GetInfo), unless a flag
// says otherwise, else the defaults. A command that sees what the daemon sees
// does not report a NIC missing that the daemon labels.
type NICView struct {
	// SysfsRoot is the directory holding the sys/ tree the NICs are read from.
	SysfsRoot     string `json:"sysfsRoot"`
	SysfsRootFrom string `json:"sysfsRootFrom"`
	// RailConfig names the rail map ("" for none); RailConfigFrom is flag (a file
	// here), daemon (the content the daemon loaded) or default (no rail map).
	RailConfig     string `json:"railConfig,omitempty"`
	RailConfigFrom string `json:"railConfigFrom"`
	// NICLabels is the daemon's --nic-labels ("" when the daemon did not say).
	NICLabels string `json:"nicLabels,omitempty"`
	// Note says why a daemon setting was not taken (no daemon answered, its
	// sysfs root does not exist here).
	Note string `json:"note,omitempty"`

	rails nicdiscovery.Rails
}

// newNICView resolves the view from the flags (rootFlag, railFlag: "" when not
// given) and what the daemon said (info nil when it did not answer, daemonErr
// then says why).
func newNICView(info *infov1.GetInfoResponse, daemonErr error, rootFlag, railFlag string) (*NICView, error) {
	v := &NICView{SysfsRoot: "/", SysfsRootFrom: FromDefault, RailConfigFrom: FromDefault, NICLabels: info.GetNicLabels()}
	var notes []string
	switch {
	case info == nil && daemonErr != nil:
		// Why is the daemon's own finding (check) or not ipamctl's business (nics).
		notes = append(notes, "no daemon answered: the defaults stand")
	case info != nil && info.GetSysfsRoot() == "":
		notes = append(notes, "the daemon does not say where it reads the NICs (a version before it did): the defaults stand")
	}
	switch root := info.GetSysfsRoot(); {
	case rootFlag != "":
		v.SysfsRoot, v.SysfsRootFrom = rootFlag, FromFlag
	case root == "":
	case hasSys(root):
		v.SysfsRoot, v.SysfsRootFrom = root, FromDaemon
	default:
		notes = append(notes, fmt.Sprintf("the daemon's --sysfs-root %s has no sys/ here (ipamctl runs outside the daemon's pod?): "+
			"reading /; give --sysfs-root", root))
	}
	var err error
	switch {
	case railFlag != "":
		v.RailConfig, v.RailConfigFrom = railFlag, FromFlag
		v.rails, err = nicdiscovery.LoadRails(railFlag)
	case info.GetRailConfigContent() != "":
		v.RailConfig, v.RailConfigFrom = info.GetRailConfig(), FromDaemon
		v.rails, err = nicdiscovery.ParseRails([]byte(info.GetRailConfigContent()), "of the daemon ("+info.GetRailConfig()+")")
	case info.GetRailConfig() != "":
		// A daemon that names its map but does not send it: read the path, valid
		// in the daemon's own pod.
		v.RailConfig, v.RailConfigFrom = info.GetRailConfig(), FromDaemon
		v.rails, err = nicdiscovery.LoadRails(info.GetRailConfig())
	}
	v.Note = strings.Join(notes, "; ")
	return v, err
}

// hasSys tells whether root holds a sys/ directory.
func hasSys(root string) bool {
	fi, err := os.Stat(filepath.Join(root, "sys"))
	return err == nil && fi.IsDir()
}

// String says the view in one line, for a report.
func (v *NICView) String() string {
	from := func(f, flag string) string {
		switch f {
		case FromFlag:
			return "from " + flag
		case FromDaemon:
			return "the daemon's"
		}
		return "the default"
	}
	parts := []string{fmt.Sprintf("NICs read from %s (%s)", v.SysfsRoot, from(v.SysfsRootFrom, "--sysfs-root"))}
	if v.RailConfigFrom == FromDefault {
		parts = append(parts, "no rail map")
	} else {
		parts = append(parts, fmt.Sprintf("rail map %s (%s, %d rail(s))", v.RailConfig, from(v.RailConfigFrom, "--rail-config"), len(v.rails)))
	}
	if v.NICLabels != "" {
		parts = append(parts, "the daemon's --nic-labels="+v.NICLabels)
	}
	s := strings.Join(parts, ", ")
	if v.Note != "" {
		s += "; " + v.Note
	}
	return s
}

// daemonInfo asks the daemon at socket what it runs as.
func daemonInfo(ctx context.Context, socket string, timeout time.Duration) (*infov1.GetInfoResponse, error) {
	var info *infov1.GetInfoResponse
	f := nodeFlags{socket: socket, output: "table", timeout: timeout}
	err := f.call(ctx, func(ctx context.Context, cl infov1.NodeInfoServiceClient) error {
		var err error
		info, err = cl.GetInfo(ctx, &infov1.GetInfoRequest{})
		return err
	})
	return info, err
}

// daemonNICs asks the daemon for its NIC inventory; nil when the daemon is of a
// version without ListNICs, or keeps no inventory.
func daemonNICs(ctx context.Context, cl infov1.NodeInfoServiceClient) (*infov1.ListNICsResponse, error) {
	resp, err := cl.ListNICs(ctx, &infov1.ListNICsRequest{})
	if status.Code(err) == codes.Unimplemented {
		return nil, nil
	}
	return resp, err
}

// view resolves the NIC view of nics and labels: it asks the daemon at --socket
// unless both --sysfs-root and --rail-config are given, and says on stderr which
// view it used.
func (f *scanFlags) view(cmd *cobra.Command, railFlag string) (*NICView, error) {
	var info *infov1.GetInfoResponse
	var err error
	if f.root == "" || railFlag == "" {
		info, err = daemonInfo(cmd.Context(), f.socket, f.timeout)
	}
	v, verr := newNICView(info, err, f.root, railFlag)
	if verr != nil {
		return nil, verr
	}
	fmt.Fprintln(cmd.ErrOrStderr(), "ipamctl: "+v.String())
	return v, nil
}
