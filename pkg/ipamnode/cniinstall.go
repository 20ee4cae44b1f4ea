package ipamnode

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// CNIOptions are nv-ipam's --cni-* flags: where ipam-node installs the plugin
// binary and its nv-ipam.conf at start.
type CNIOptions struct {
	BinDir            string
	ConfDir           string
	DaemonSocket      string
	DaemonCallTimeout int
	LogFile           string
	LogLevel          string
	BinFile           string
	SkipBinaryCopy    bool
	SkipConfig        bool
	ForcePoolName     bool
}

// installCNI copies the plugin into the CNI bin dir and writes nv-ipam.conf, each
// atomically: written to a temporary file in the same directory, synced, then
// renamed over the old one, so a runtime exec'ing the plugin meanwhile runs
// either the old or the new binary, never a partial one.
//
// It returns the sha256 (hex) of the plugin binary it installed and of the
// nv-ipam.conf it wrote, each "" when it installs or writes none.
func installCNI(o *CNIOptions) (pluginSum, confSum string, err error) {
	if !o.SkipBinaryCopy {
		src, err := os.Open(o.BinFile)
		if err != nil {
			return "", "", fmt.Errorf("installing the CNI plugin: %w (set --cni-nv-ipam-bin-file, or --cni-skip-nv-ipam-binary-copy)", err)
		}
		defer src.Close()
		h := sha256.New()
		if err := writeAtomic(filepath.Join(o.BinDir, "nv-ipam"), 0o755, func(w io.Writer) error {
			_, err := io.Copy(io.MultiWriter(w, h), src)
			return err
		}); err != nil {
			return "", "", fmt.Errorf("installing the CNI plugin into --cni-bin-dir %s: %w", o.BinDir, err)
		}
		pluginSum = hex.EncodeToString(h.Sum(nil))
	}
	if !o.SkipConfig {
		conf := map[string]any{
			"daemonSocket":             o.DaemonSocket,
			"daemonCallTimeoutSeconds": o.DaemonCallTimeout,
			"logFile":                  o.LogFile,
			"logLevel":                 o.LogLevel,
			"forcePoolName":            o.ForcePoolName,
		}
		data, err := json.MarshalIndent(conf, "", "  ")
		if err != nil {
			return "", "", fmt.Errorf("encoding nv-ipam.conf: %w", err)
		}
		data = append(data, '\n')
		if err := writeAtomic(filepath.Join(o.ConfDir, "nv-ipam.conf"), 0o644, func(w io.Writer) error {
			_, err := w.Write(data)
			return err
		}); err != nil {
			return "", "", fmt.Errorf("writing nv-ipam.conf into --cni-conf-dir %s: %w", o.ConfDir, err)
		}
		sum := sha256.Sum256(data)
		confSum = hex.EncodeToString(sum[:])
	}
	return pluginSum, confSum, nil
}

func writeAtomic(path string, mode os.FileMode, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename this fails harmlessly
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
