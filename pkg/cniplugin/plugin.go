package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/hwipam/hwipam/pkg/ipamwire"
)

// Plugin implements the CNI verbs. Stdout receives the result; nothing else is
// written there. Stderr, when set, receives a one-line warning when logFile is
// refused (the runtime logs a plugin's stderr); the call itself goes on.
type Plugin struct {
	Stdout io.Writer
	Stderr io.Writer
	// CheckNetNS makes the plugin refuse a CNI_NETNS that is its own network
	// namespace, as skel does after ADD and DEL; Run sets it unless the runtime
	// set CNI_NETNS_OVERRIDE.
	CheckNetNS bool
}

// checkNetNS is skel's check that netns is not the plugin's own network namespace,
// with its codes and messages: a path that cannot be read is left to the verb.
func (p *Plugin) checkNetNS(netns string) error {
	if !p.CheckNetNS || netns == "" {
		return nil
	}
	var target, own syscall.Stat_t
	if syscall.Stat(netns, &target) != nil {
		return nil
	}
	if syscall.Stat("/proc/thread-self/ns/net", &own) != nil {
		return types.NewError(types.ErrInvalidNetNS, "get plugin's netns failed", "")
	}
	if target.Dev == own.Dev && target.Ino == own.Ino {
		return types.NewError(types.ErrInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", "")
	}
	return nil
}

type session struct {
	cfg    *Config
	client *ipamwire.Client
	ctx    context.Context
	done   func()
	log    *logger
}

// open reads the configuration and connects to the daemon: its compact endpoint,
// or its gRPC socket when it has none (see ipamwire.Dial). A daemon that cannot be
// reached is reported as the call's error, with code 11 (try again later).
func (p *Plugin) open(args *CmdArgs, verb string, needPod bool) (*session, error) {
	cfg, err := LoadConfig(args.StdinData, args.Args, needPod)
	if err != nil {
		return nil, toCNIError(err)
	}
	return p.connect(cfg, verb)
}

// connect opens the session of a call whose configuration is cfg.
func (p *Plugin) connect(cfg *Config, verb string) (*session, error) {
	var err error
	// The call's time limit is the connection's deadline, which the client keeps
	// for every call it makes; a context with a timeout would start a runtime
	// timer, and with it the network poller and a thread to wait on it, which a
	// plugin that lives for one call pays for in full.
	s := &session{cfg: cfg, ctx: context.Background(), log: newLogger(cfg, p.Stderr)}
	s.client, err = ipamwire.Dial(cfg.DaemonSocket, time.Now().Add(cfg.Timeout))
	if err != nil {
		s.log.close()
		if ipamwire.CodeOf(err) == ipamwire.InvalidArgument {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid daemonSocket", fmt.Sprintf("%s: %s", cfg.DaemonSocket, ipamwire.MessageOf(err)))
		}
		if verb == "STATUS" {
			return nil, types.NewError(types.ErrPluginNotAvailable, "ipam-node is not reachable",
				fmt.Sprintf("%s: %s", cfg.DaemonSocket, ipamwire.MessageOf(err)))
		}
		return nil, s.grpcError(verb, err)
	}
	s.done = func() { _ = s.client.Close(); s.log.close() }
	return s, nil
}

// poolType is the configured pool type on the wire.
func (s *session) poolType() ipamwire.PoolType {
	if s.cfg.PoolType == "cidrpool" {
		return ipamwire.PoolTypeCIDRPool
	}
	return ipamwire.PoolTypeIPPool
}

func (s *session) params(args *CmdArgs) *ipamwire.Params {
	prm := &ipamwire.Params{Pools: s.cfg.Pools, ContainerID: args.ContainerID, IfName: args.IfName, PoolType: s.poolType(),
		NetworkName: s.cfg.Network, PodName: s.cfg.PodName, PodNamespace: s.cfg.PodNamespace,
		PodUID: s.cfg.PodUID, DeviceID: s.cfg.DeviceID, AllocateDefaultGateway: s.cfg.Gateway, AllocateIPWithIndex: s.cfg.Index,
		Rail: s.cfg.Rail, PCIBusID: s.cfg.PCIBusID, Master: s.cfg.Master, Device: s.cfg.Device}
	for _, a := range s.cfg.RequestedIPs {
		prm.RequestedIPs = append(prm.RequestedIPs, a.String())
	}
	return prm
}

// Add allocates and prints the result.
func (p *Plugin) Add(args *CmdArgs) error {
	s, err := p.open(args, "ADD", true)
	if err != nil {
		return err
	}
	return p.add(s, args, printResult)
}

// add makes the Allocate call of an ADD and prints its result with write. The
// network namespace is checked first: the failures skel reports before its own
// check (configuration, daemon unreachable) come first as they do with skel, but
// an ADD into the plugin's own namespace allocates nothing.
func (p *Plugin) add(s *session, args *CmdArgs, write func(w io.Writer, res *current.Result, cniVersion string) error) error {
	defer s.done()
	if err := p.checkNetNS(args.Netns); err != nil {
		return err
	}
	allocs, err := s.client.Allocate(s.ctx, s.params(args))
	if err != nil {
		s.log.printf("ADD %s/%s %s: %v", args.ContainerID, args.IfName, s.poolsForLog(nil), err)
		return s.grpcError("ADD", err)
	}
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	for _, a := range allocs {
		pfx, err := netip.ParsePrefix(a.IP)
		if err != nil {
			return types.NewError(types.ErrInternal, "the daemon returned an invalid address", a.IP)
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}}
		var gw net.IP
		if g, err := netip.ParseAddr(a.Gateway); err == nil {
			gw = g.AsSlice()
			ipc.Gateway = gw
		}
		res.IPs = append(res.IPs, ipc)
		for _, r := range a.Routes {
			dst, err := netip.ParsePrefix(r)
			if err != nil {
				continue
			}
			res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: dst.Addr().AsSlice(),
				Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}, GW: gw})
		}
	}
	if s.log.f != nil { // the addresses are formatted only for a log that is kept
		s.log.line("ADD " + args.ContainerID + "/" + args.IfName + " " + s.poolsForLog(allocs) + ": " + ips(res))
	}
	return write(p.Stdout, res, s.cfg.CNIVersion)
}

// printResult writes res in the config's CNI version, with the CNI library.
func printResult(w io.Writer, res *current.Result, cniVersion string) error {
	out, err := res.GetAsVersion(cniVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, "cannot express the result in the requested version", err.Error())
	}
	if err := out.PrintTo(w); err != nil {
		return types.NewError(types.ErrIOFailure, "writing the result", err.Error())
	}
	return nil
}

func ips(r *current.Result) string {
	var out []string
	for _, ip := range r.IPs {
		out = append(out, ip.Address.String())
	}
	return strings.Join(out, ",")
}

// Del releases the interface's addresses; releasing nothing succeeds.
func (p *Plugin) Del(args *CmdArgs) error {
	s, err := p.open(args, "DEL", false)
	if err != nil {
		return err
	}
	return p.del(s, args)
}

// del makes the Deallocate call of a DEL.
func (p *Plugin) del(s *session, args *CmdArgs) error {
	defer s.done()
	if err := s.client.Deallocate(s.ctx, s.params(args)); err != nil {
		s.log.printf("DEL %s/%s: %v", args.ContainerID, args.IfName, err)
		return s.grpcError("DEL", err)
	}
	s.log.line("DEL " + args.ContainerID + "/" + args.IfName + " " + s.poolsForLog(nil))
	return p.checkNetNS(args.Netns)
}

// Check verifies that the daemon holds the addresses of prevResult for the
// interface.
func (p *Plugin) Check(args *CmdArgs) error {
	s, err := p.open(args, "CHECK", false)
	if err != nil {
		return err
	}
	defer s.done()
	if err := s.client.IsAllocated(s.ctx, s.params(args)); err != nil {
		return s.grpcError("CHECK", err)
	}
	if len(s.cfg.PrevResult) == 0 {
		return nil
	}
	prev, err := parsePrev(s.cfg.CNIVersion, s.cfg.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "prevResult cannot be read", err.Error())
	}
	held := map[string]bool{}
	for _, key := range s.listKeys() {
		list, err := s.client.ListAllocations(s.ctx, key)
		if err != nil {
			return s.grpcError("CHECK", err)
		}
		for _, a := range list {
			if a.ContainerID == args.ContainerID && a.IfName == args.IfName {
				held[a.IP] = true
			}
		}
	}
	for _, ip := range prev.IPs {
		if !held[ip.Address.IP.String()] {
			return types.NewError(types.ErrInternal, "address not allocated",
				fmt.Sprintf("prevResult has %s, which the daemon does not hold for %s/%s", ip.Address.String(), args.ContainerID, args.IfName))
		}
	}
	return nil
}

func parsePrev(cniVersion string, raw json.RawMessage) (*current.Result, error) {
	var prev map[string]any
	if err := json.Unmarshal(raw, &prev); err != nil {
		return nil, err
	}
	nc := types.NetConf{CNIVersion: cniVersion, RawPrevResult: prev}
	if err := version.ParsePrevResult(&nc); err != nil {
		return nil, err
	}
	return current.NewResultFromResult(nc.PrevResult)
}

// listKeys are the store keys of the pools CHECK and GC look at: the network's
// pools, or every pool when they are picked by rail (one network's interfaces
// are then spread over the rails' pools).
func (s *session) listKeys() []string {
	if s.cfg.Rail != "" {
		return []string{""}
	}
	keys := make([]string, len(s.cfg.Pools))
	for i, pool := range s.cfg.Pools {
		keys[i] = s.storeKey(pool)
	}
	return keys
}

// splitStoreKey is storeKey's inverse: a pool's name and type.
func splitStoreKey(key string) (string, ipamwire.PoolType) {
	if name, ok := strings.CutPrefix(key, "cidrpool/"); ok {
		return name, ipamwire.PoolTypeCIDRPool
	}
	return key, ipamwire.PoolTypeIPPool
}

// storeKey is v1alpha1.PoolKey, written out here because importing the API package
// would pull the Kubernetes libraries into a binary that is exec'd per CNI call.
func (s *session) storeKey(pool string) string {
	if s.cfg.PoolType == "cidrpool" {
		return "cidrpool/" + pool
	}
	return pool
}

// GC releases the allocations this network made in its pools whose attachment
// is not in cni.dev/valid-attachments. That list names only this network's
// attachments, and a pool may serve many networks, so allocations recorded for
// another network are left alone, and so are those whose network is not known
// (made before hwipam recorded it, imported from nv-ipam, or by a client that
// does not send it).
func (p *Plugin) GC(args *CmdArgs) error {
	s, err := p.open(args, "GC", false)
	if err != nil {
		return err
	}
	defer s.done()
	if s.cfg.Network == "" {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration",
			"GC needs the network's \"name\": it releases only allocations made by that network")
	}
	if s.cfg.Network == ipamwire.ReservedNetworkName {
		// Its allocations are the DRA driver's: none is this network's to collect.
		return toCNIError(errReservedName())
	}
	valid := map[string]bool{}
	for _, a := range s.cfg.ValidAttachments {
		valid[a.ContainerID+"/"+a.IfName] = true
	}
	var errs []error
	for _, key := range s.listKeys() {
		list, err := s.client.ListAllocations(s.ctx, key)
		if err != nil {
			return s.grpcError("GC", err)
		}
		for _, a := range list {
			if a.Network != s.cfg.Network || valid[a.ContainerID+"/"+a.IfName] {
				continue
			}
			pool, poolType := splitStoreKey(a.Pool)
			prm := s.params(&CmdArgs{ContainerID: a.ContainerID, IfName: a.IfName})
			prm.Pools, prm.PoolType, prm.Rail = []string{pool}, poolType, ""
			if err := s.client.Deallocate(s.ctx, prm); err != nil {
				errs = append(errs, err)
				continue
			}
			s.log.printf("GC released %s (%s/%s) in pool %s", a.IP, a.ContainerID, a.IfName, pool)
		}
	}
	if len(errs) > 0 {
		return s.grpcError("GC", errors.Join(errs...))
	}
	return nil
}

// Status reports whether ADD can succeed: the daemon answers and every pool has
// an active block on this node (CNI code 50 otherwise).
func (p *Plugin) Status(args *CmdArgs) error {
	s, err := p.open(args, "STATUS", false)
	if err != nil {
		return err
	}
	defer s.done()
	pools, err := s.client.ListPools(s.ctx)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "ipam-node is not reachable",
			fmt.Sprintf("%s: %v", s.cfg.DaemonSocket, err))
	}
	active := map[string]bool{}
	railActive := false
	for _, pl := range pools {
		active[pl.Key] = pl.Active
		if _, pt := splitStoreKey(pl.Key); pl.Active && pl.Rail != "" && (s.cfg.Rail == "auto" || pl.Rail == s.cfg.Rail) &&
			pt == s.poolType() {
			railActive = true
		}
	}
	if s.cfg.Rail != "" && !railActive {
		which := fmt.Sprintf("rail %q", s.cfg.Rail)
		if s.cfg.Rail == "auto" {
			which = "any rail"
		}
		return types.NewError(types.ErrPluginNotAvailable, "no pool of the rail has a block on this node",
			fmt.Sprintf("no %s labelled nic.hwipam.io/rail for %s has an active block on this node yet", s.cfg.PoolType, which))
	}
	for _, pool := range s.cfg.Pools {
		if !active[s.storeKey(pool)] {
			return types.NewError(types.ErrPluginNotAvailable, "pool has no block on this node",
				fmt.Sprintf("%s %q: no active block on this node yet (check the pool's nodeSelector and status)", s.cfg.PoolType, pool))
		}
	}
	return nil
}

// grpcError maps a daemon error to a CNI error object; this is the one place
// where gRPC codes become CNI codes. NotFound means "the pool has no block on this
// node" from Allocate (hwipam's and nv-ipam's daemons alike) and "nothing
// allocated" from IsAllocated.
func (s *session) grpcError(verb string, err error) error {
	msg := ipamwire.MessageOf(err)
	switch ipamwire.CodeOf(err) {
	case ipamwire.Unavailable, ipamwire.DeadlineExceeded, ipamwire.Canceled:
		return types.NewError(types.ErrTryAgainLater, "ipam-node is not reachable; try again later",
			fmt.Sprintf("%s %s within %s: %s", verb, s.cfg.DaemonSocket, s.cfg.Timeout, msg))
	case ipamwire.InvalidArgument:
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid request", msg)
	case ipamwire.NotFound:
		if verb == "ADD" {
			// Usually transient (a new node before ipam-controller gave it a block, a
			// daemon that has not listed the pools yet), so 11: the runtime retries,
			// and the details say what to check when it is not.
			if s.cfg.Rail != "" && strings.Contains(msg, " is labelled nic.hwipam.io/rail") {
				return types.NewError(types.ErrTryAgainLater, "no pool is labelled for the rail", msg)
			}
			return types.NewError(types.ErrTryAgainLater, "pool has no block on this node", msg)
		}
		return types.NewError(types.ErrUnknownContainer, "not found", msg)
	case ipamwire.ResourceExhausted:
		return types.NewError(types.ErrInternal, "pool exhausted", msg)
	}
	return types.NewError(types.ErrInternal, verb+" failed", msg)
}

func toCNIError(err error) error {
	if errors.Is(err, errConfig) {
		return types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration", err.Error())
	}
	return types.NewError(types.ErrInternal, "nv-ipam failed", err.Error())
}

// logger appends to logFile; nothing is written to stdout.
type logger struct {
	f     *os.File
	quiet bool
}

// newLogger opens the log file (see openLogFile). A refused or unopenable file
// turns logging off for the call, with one line on stderr saying why: a log file
// must never fail an allocation.
func newLogger(c *Config, stderr io.Writer) *logger {
	l := &logger{quiet: c.LogFile == "" || strings.EqualFold(c.LogLevel, "panic") || strings.EqualFold(c.LogLevel, "error")}
	if l.quiet {
		return l
	}
	f, err := openLogFile(c.LogFile)
	if err != nil {
		if stderr != nil {
			fmt.Fprintf(stderr, "nv-ipam: warning: logFile %q refused, not logging this call: %s\n", c.LogFile, escapeLine(err.Error()))
		}
		return l
	}
	l.f = f
	return l
}

// printf writes one line. The values logged come in part from the network
// config (pool names) and the pod (interface name), and the file is one root
// appends to, so the line is made inert: control characters (newlines among them)
// and the characters a shell acts on are escaped (see escapeLine).
func (l *logger) printf(format string, a ...any) {
	if l.f != nil {
		l.line(fmt.Sprintf(format, a...))
	}
}

// line writes msg as printf does, in one write. The lines of every ADD and DEL
// are built without fmt: its first use in a process that lives for one call
// cost the call about 30 microseconds (a third of what the daemon takes to
// allocate), for a log line nobody waits for.
func (l *logger) line(msg string) {
	if l.f == nil {
		return
	}
	b := make([]byte, 0, len(time.RFC3339Nano)+len(" nv-ipam: \n")+len(msg))
	b = time.Now().UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, " nv-ipam: "...)
	b = append(b, escapeLine(msg)...)
	b = append(b, '\n')
	_, _ = l.f.Write(b)
}

// list is a list of names as printf's %v prints it: [a b].
// poolsForLog names a call's pools in its log line: "pools [a b]" for pools
// named in the config; for a rail, "rail <rail>" and the pools ipam-node chose
// (allocs), when the call has them.
func (s *session) poolsForLog(allocs []ipamwire.Allocation) string {
	if s.cfg.Rail == "" {
		return "pools " + list(s.cfg.Pools)
	}
	if len(allocs) == 0 {
		return "rail " + s.cfg.Rail
	}
	chosen := make([]string, 0, len(allocs))
	for _, a := range allocs {
		if !slices.Contains(chosen, a.Pool) {
			chosen = append(chosen, a.Pool)
		}
	}
	return "rail " + s.cfg.Rail + " pools " + list(chosen)
}

func list(names []string) string {
	return "[" + strings.Join(names, " ") + "]"
}

// shellActive are the characters that make a shell do more than pass words to
// the first one: separate commands, pipe, redirect, substitute, quote, escape.
const shellActive = ";|&<>$`'\\"

// escapeLine replaces ASCII and Unicode control characters, and the characters of
// shellActive, with Go escapes (\n, \x3b, ...). The daemon's messages avoid
// those characters, so in practice only injected values are changed.
func escapeLine(s string) string {
	unsafe := func(r rune) bool { return unicode.IsControl(r) || strings.ContainsRune(shellActive, r) }
	if !strings.ContainsFunc(s, unsafe) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		case strings.ContainsRune(shellActive, r):
			fmt.Fprintf(&b, "\\x%02x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (l *logger) close() {
	if l.f != nil {
		_ = l.f.Close()
	}
}
