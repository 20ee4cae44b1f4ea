package realnode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// State is everything a running node put on the host outside its own processes'
// memory: the processes (by PID and start time, so a recycled PID is never killed), the
// links, the iptables rules and the cgroups it made. It is written to state.json in
// the run directory after every change, so that Teardown can undo a node started by
// another process (`make demo-down`) or by a test binary that died.
type State struct {
	Dir       string     `json:"dir"`
	Processes []Process  `json:"processes"`
	Links     []string   `json:"links"`
	IPTables  [][]string `json:"iptables"`
	Cgroups   []string   `json:"cgroups"`
	// CgroupName is the pods' cgroup root (kubelet's cgroupRoot) under every v1
	// hierarchy; whatever runs in it at teardown is killed.
	CgroupName string `json:"cgroupName"`
	// ContainerdSocket identifies this node's runc shims (they outlive containerd).
	ContainerdSocket string `json:"containerdSocket"`
	// Kubeconfig and Kubectl let Teardown delete the pods through the API first, so
	// that kubelet runs CNI DEL for each (libcni keeps a result cache per attachment
	// in /var/lib/cni, outside the run directory).
	Kubeconfig string `json:"kubeconfig"`
	Kubectl    string `json:"kubectl"`
	// KubeletDirs are host directories kubelet creates at fixed paths that did not
	// exist before this node started (/var/lib/kubelet for its device-plugin socket,
	// /var/log/containers); they are removed unless another kubelet runs.
	KubeletDirs []string `json:"kubeletDirs"`
}

// Process is one process the node started.
type Process struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // field 22 of /proc/PID/stat
}

const stateFile = "state.json"

func (s *State) save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(s.Dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("saving node state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(s.Dir, stateFile))
}

// LoadState reads the state of the node whose run directory is dir.
func LoadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, fmt.Errorf("reading the node's state: %w", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	s.Dir = dir
	return &s, nil
}

// procStart returns the start time of pid (clock ticks since boot), 0 when it is gone
// or has exited and waits to be reaped.
func procStart(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields count from the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" { // a zombie has exited
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

func (p Process) alive() bool { return p.PID > 0 && procStart(p.PID) == p.Start && p.Start != 0 }

// stop sends SIGTERM, waits up to grace, then SIGKILLs and waits for the process to go.
func (p Process) stop(grace time.Duration) {
	if !p.alive() {
		return
	}
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for p.alive() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if p.alive() {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
		for i := 0; p.alive() && i < 100; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Running says whether any of the node's processes is still alive.
func (s *State) Running() bool {
	return slices.ContainsFunc(s.Processes, Process.alive)
}

// Teardown stops everything the node in s started and removes what it made on the host:
// processes, containers and their shims, mounts under the run directory, links,
// iptables rules and cgroups. It keeps going past failures and returns them all.
// With keepDir the run directory (logs) stays; otherwise it is removed.
func (s *State) Teardown(keepDir bool) error {
	var errs []error
	if keepDir {
		// kubelet removes a deleted pod's container logs: keep a copy first.
		if podLogs := filepath.Join(s.Dir, "pod-logs"); isDir(podLogs) {
			_ = os.CopyFS(filepath.Join(s.Dir, "logs", "pods"), os.DirFS(podLogs))
		}
	}
	s.deletePods()
	// kubelet first, so that it does not restart what is killed next.
	for _, p := range s.Processes {
		if p.Name == "kubelet" {
			p.stop(10 * time.Second)
		}
	}
	// Every container of this node: whatever runs in the pods' cgroup root.
	if s.CgroupName != "" {
		killCgroup(s.CgroupName)
	}
	// runc shims outlive containerd; they are ours when they talk to our socket.
	if s.ContainerdSocket != "" {
		for _, pid := range pidsWithArg(s.ContainerdSocket) {
			if start := procStart(pid); start != 0 {
				(Process{Name: "shim", PID: pid, Start: start}).stop(2 * time.Second)
			}
		}
	}
	for _, p := range slices.Backward(s.Processes) {
		p.stop(10 * time.Second)
	}
	for _, p := range s.Processes {
		if p.alive() {
			errs = append(errs, fmt.Errorf("%s (pid %d) did not stop", p.Name, p.PID))
		}
	}
	errs = append(errs, unmountUnder(s.Dir))
	// kubelet links every container's log into /var/log/containers (a fixed path);
	// the logs themselves are under the run directory.
	if links, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, l := range links {
			p := "/var/log/containers/" + l.Name()
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, s.Dir+"/") {
				_ = os.Remove(p)
			}
		}
	}
	if len(s.KubeletDirs) > 0 && !kubeletRunning() {
		for _, d := range s.KubeletDirs {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, rule := range s.IPTables {
		del := append([]string{"-t", "nat", "-D"}, rule...)
		if out, err := exec.Command("iptables", del...).CombinedOutput(); err != nil && !strings.Contains(string(out), "does a matching rule exist") {
			errs = append(errs, fmt.Errorf("iptables %s: %w: %s", strings.Join(del, " "), err, out))
		}
	}
	for _, l := range s.Links {
		if out, err := exec.Command("ip", "link", "del", l).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", l, err, out))
		}
	}
	for _, c := range slices.Backward(s.Cgroups) {
		if err := removeCgroupTree(c); err != nil {
			errs = append(errs, err)
		}
	}
	if !keepDir {
		if err := os.RemoveAll(s.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", s.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// deletePods deletes every pod through the API while kubelet runs, workloads before
// kube-system (ipam-node must answer their CNI DEL), with kube-controller-manager
// stopped first so that nothing is re-created. Best effort, bounded in time: whatever
// is left is killed next.
func (s *State) deletePods() {
	if s.Kubeconfig == "" || s.Kubectl == "" || !slices.ContainsFunc(s.Processes, func(p Process) bool {
		return p.Name == "kubelet" && p.alive()
	}) {
		return
	}
	for _, p := range s.Processes {
		if p.Name == "kube-controller-manager" {
			p.stop(5 * time.Second)
		}
	}
	for _, scope := range [][]string{{"-A", "--field-selector=metadata.namespace!=kube-system"}, {"-n", "kube-system", "--all"}} {
		args := append([]string{"--kubeconfig", s.Kubeconfig, "delete", "pods", "--grace-period=1", "--wait", "--timeout=30s",
			"--request-timeout=5s"}, scope...)
		_ = exec.Command(s.Kubectl, args...).Run()
	}
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// kubeletRunning says whether any kubelet process runs on this host.
func kubeletRunning() bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if comm, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(comm)) == "kubelet" {
			return true
		}
	}
	return false
}

// pidsWithArg lists the processes that have arg as one of their arguments.
func pidsWithArg(arg string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if string(a) == arg || string(a) == "unix://"+arg {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// killCgroup SIGKILLs every process in the v1 cgroup tree name (in the pids
// hierarchy, which every process is in) until none is left or 5 s have passed.
func killCgroup(name string) {
	root := "/sys/fs/cgroup/pids/" + name
	for try := 0; try < 50; try++ {
		found := false
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil // a cgroup that went away meanwhile is fine
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					found = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeCgroupTree removes a cgroup directory and its children, deepest first.
func removeCgroupTree(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	var last error
	for _, d := range slices.Backward(dirs) {
		for try := 0; try < 20; try++ {
			if last = syscall.Rmdir(d); last == nil || errors.Is(last, syscall.ENOENT) {
				last = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if last != nil {
			return fmt.Errorf("removing cgroup %s: %w", d, last)
		}
	}
	return nil
}

// unmountUnder lazily unmounts every mount point at or under dir, deepest first
// (kubelet bind-mounts its root dir onto itself and mounts pods' volumes under it;
// containerd keeps sandboxes' network namespaces and rootfs mounts under its state).
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	var errs []error
	for _, mp := range slices.Backward(points) {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
