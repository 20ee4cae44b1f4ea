package cniplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// logFile comes from the network config, which whoever may create a
// NetworkAttachmentDefinition writes, and the plugin runs as root on the host. So
// openLogFile accepts only what a log file can sensibly be:
//
//   - an absolute path, not in /proc or /sys, whose directory does not resolve
//     into them either and is on no kernel pseudo filesystem (procfs, sysfs,
//     cgroupfs, debugfs, ... wherever mounted);
//   - whose last component is not a symbolic link (O_NOFOLLOW);
//   - that is a regular file (checked before opening, so that a device, FIFO or
//     socket is never even opened, and again on the open file), or does not exist,
//     and is then created with mode 0600.
//
// The directory is opened once and the file opened relative to it, so the
// directory checked is the directory written in.
func openLogFile(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, errors.New("not an absolute path")
	}
	if strings.HasSuffix(path, "/") {
		return nil, errors.New("names a directory, not a file")
	}
	clean := filepath.Clean(path)
	if underPseudoRoot(clean) {
		return nil, errors.New("inside /proc or /sys")
	}
	dir, base := filepath.Split(clean) // base is a name: clean has no trailing "/", ".", ".."
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("directory: %w", err)
	}
	if underPseudoRoot(resolved) {
		return nil, fmt.Errorf("directory %s resolves to %s, inside /proc or /sys", dir, resolved)
	}
	dfd, err := unix.Open(resolved, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("directory %s: %w", resolved, err)
	}
	defer unix.Close(dfd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(dfd, &fs); err != nil {
		return nil, fmt.Errorf("directory %s: %w", resolved, err)
	}
	if name := pseudoFS(int64(fs.Type)); name != "" { //nolint:unconvert // Statfs_t.Type is not int64 on every architecture
		return nil, fmt.Errorf("directory %s is on %s, not a place for a log file", resolved, name)
	}
	// Two tries: another plugin instance may create the file between our stat and
	// our O_EXCL create.
	for range 2 {
		var st unix.Stat_t
		err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		flags := unix.O_WRONLY | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY
		switch {
		case errors.Is(err, unix.ENOENT):
			flags |= unix.O_CREAT | unix.O_EXCL
		case err != nil:
			return nil, err
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return nil, errors.New("is a symbolic link")
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			return nil, fmt.Errorf("is not a regular file (%s)", fileType(st.Mode))
		}
		fd, err := unix.Openat(dfd, base, flags, 0o600)
		switch {
		case errors.Is(err, unix.EEXIST):
			continue
		case errors.Is(err, unix.ELOOP):
			return nil, errors.New("is a symbolic link")
		case err != nil:
			return nil, err
		}
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			_ = unix.Close(fd)
			return nil, errors.New("is not a regular file")
		}
		if flags&unix.O_CREAT != 0 {
			_ = unix.Fchmod(fd, 0o600) // exactly 0600, whatever the umask
		}
		// O_NONBLOCK was for the open alone (a FIFO put in its place must not
		// block it). Left set, os.NewFile would register the file with the
		// runtime's network poller, whose set-up costs the plugin's call more than
		// its log line.
		if err := unix.SetNonblock(fd, false); err != nil {
			_ = unix.Close(fd)
			return nil, err
		}
		return os.NewFile(uintptr(fd), clean), nil
	}
	return nil, errors.New("created and removed concurrently; giving up")
}

func underPseudoRoot(p string) bool {
	for _, root := range []string{"/proc", "/sys"} {
		if p == root || strings.HasPrefix(p, root+"/") {
			return true
		}
	}
	return false
}

// configfsMagic is CONFIGFS_MAGIC of linux/magic.h, which x/sys/unix lacks.
const configfsMagic = 0x62656570

// pseudoFS names the kernel pseudo filesystem of a statfs type, "" for others.
func pseudoFS(t int64) string {
	switch t {
	case unix.PROC_SUPER_MAGIC:
		return "procfs"
	case unix.SYSFS_MAGIC:
		return "sysfs"
	case unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return "cgroupfs"
	case unix.DEBUGFS_MAGIC:
		return "debugfs"
	case unix.TRACEFS_MAGIC:
		return "tracefs"
	case unix.SECURITYFS_MAGIC:
		return "securityfs"
	case unix.BPF_FS_MAGIC:
		return "bpffs"
	case unix.EFIVARFS_MAGIC:
		return "efivarfs"
	case unix.PSTOREFS_MAGIC:
		return "pstore"
	case unix.DEVPTS_SUPER_MAGIC:
		return "devpts"
	case configfsMagic:
		return "configfs"
	}
	return ""
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
}
