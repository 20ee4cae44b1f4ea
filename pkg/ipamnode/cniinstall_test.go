package ipamnode

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestInstallCNIIsAtomicAndWritesConf(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "nv-ipam-src")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho v1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	o := NewOptions().CNI
	o.BinDir, o.ConfDir, o.BinFile = filepath.Join(dir, "bin"), filepath.Join(dir, "conf"), src
	o.DaemonSocket, o.ForcePoolName = "unix:///run/x.sock", true
	pluginSum, confSum, err := installCNI(&o)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{filepath.Join(o.BinDir, "nv-ipam"): pluginSum, filepath.Join(o.ConfDir, "nv-ipam.conf"): confSum} {
		if b, err := os.ReadFile(path); err != nil || fmt.Sprintf("%x", sha256.Sum256(b)) != want {
			t.Errorf("installCNI's sha256 of %s: %s, the file's: %x (%v)", path, want, sha256.Sum256(b), err)
		}
	}
	dst := filepath.Join(o.BinDir, "nv-ipam")
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed plugin: %v %v, want mode 0755", st, err)
	}
	// A runtime holding the old binary open (as an exec in progress does) keeps
	// seeing it whole after a reinstall: the new one replaces it by rename.
	old, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var oldIno uint64
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		oldIno = s.Ino
	}
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho v2\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := installCNI(&o); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := old.ReadAt(buf, 0)
	if !bytes.Contains(buf[:n], []byte("v1")) {
		t.Errorf("the old binary changed under an open handle: %q", buf[:n])
	}
	st2, _ := os.Stat(dst)
	if s, ok := st2.Sys().(*syscall.Stat_t); ok && s.Ino == oldIno {
		t.Error("the plugin was rewritten in place, not replaced")
	}
	if data, _ := os.ReadFile(dst); !strings.Contains(string(data), "v2") {
		t.Errorf("the new binary was not installed: %q", data)
	}
	var conf map[string]any
	data, err := os.ReadFile(filepath.Join(o.ConfDir, "nv-ipam.conf"))
	if err != nil || json.Unmarshal(data, &conf) != nil {
		t.Fatalf("nv-ipam.conf: %v %s", err, data)
	}
	if conf["daemonSocket"] != "unix:///run/x.sock" || conf["daemonCallTimeoutSeconds"] != float64(5) ||
		conf["logFile"] != "/var/log/nv-ipam-cni.log" || conf["logLevel"] != "info" || conf["forcePoolName"] != true {
		t.Errorf("nv-ipam.conf = %v", conf)
	}
	leftovers, _ := filepath.Glob(filepath.Join(o.BinDir, ".nv-ipam.tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
	o.BinFile = filepath.Join(dir, "missing")
	if _, _, err := installCNI(&o); err == nil || !strings.Contains(err.Error(), "--cni-skip-nv-ipam-binary-copy") {
		t.Errorf("a missing plugin binary: %v, want an error naming the flags", err)
	}
}
