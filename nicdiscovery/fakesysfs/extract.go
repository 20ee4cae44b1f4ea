package fakesysfs

import (
	"archive/tar"
	"compress/bzip2"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Extract unpacks a .tar.bz2 sysfs capture (such as hwloc-gather-topology's) into
// dir and returns the path of its single top directory, the one holding sys/.
func Extract(archive, dir string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(bzip2.NewReader(f))
	top := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", archive, err)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return "", fmt.Errorf("%s: entry %q leaves the extraction directory", archive, h.Name)
		}
		if first, _, _ := strings.Cut(name, "/"); top == "" {
			top = first
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(dir, filepath.Clean(h.Linkname)), p)
		case tar.TypeReg:
			err = writeEntry(p, tr)
		}
		if err != nil {
			return "", fmt.Errorf("extracting %s from %s: %w", h.Name, archive, err)
		}
	}
	if top == "" {
		return "", fmt.Errorf("%s is empty", archive)
	}
	return filepath.Join(dir, top), nil
}

func writeEntry(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	return errors.Join(err, f.Close())
}
