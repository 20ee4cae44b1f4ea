// Package ociimage reads the image `make image` writes — an OCI image layout
// tarball whose index.json names one image index, one single-layer image per
// platform — with the standard library only, so that tests check it
// independently of the tool that wrote it (hack/image, go-containerregistry).
// Every blob's digest is verified.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Platform is an image's OS and architecture, as the index and its config name it.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
}

func (p Platform) String() string { return p.OS + "/" + p.Architecture }

// Config is what the tests read of an image's configuration.
type Config struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
	} `json:"config"`
}

// File is one path of an image's layer.
type File struct {
	Mode int64
	Type byte
	// ELF is set for an ELF file, with its machine and whether it names a
	// program interpreter (a dynamically linked executable does).
	ELF         bool
	Machine     elf.Machine
	Interpreter bool
}

// Image is one platform's image of the index.
type Image struct {
	// Platform is what the index's descriptor says.
	Platform Platform
	Config   Config
	Files    map[string]File
}

// Layout is the tarball: the reference its index.json names, and the images.
type Layout struct {
	RefName   string
	IndexType string
	Images    []Image
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type index struct {
	MediaType string       `json:"mediaType"`
	Manifests []descriptor `json:"manifests"`
}

type manifest struct {
	Config descriptor   `json:"config"`
	Layers []descriptor `json:"layers"`
}

// small is the size up to which a blob is kept in memory on the first pass.
const small = 1 << 20

// Read reads the layout tarball at path.
func Read(path string) (*Layout, error) {
	blobs := map[string][]byte{} // digest → content, for small blobs
	var top []byte
	isLayout := false
	if err := eachEntry(path, func(name string, size int64, r io.Reader) error {
		switch {
		case name == "oci-layout":
			isLayout = true
		case name == "index.json":
			b, err := io.ReadAll(r)
			top = b
			return err
		case strings.HasPrefix(name, "blobs/sha256/") && size <= small:
			b, err := io.ReadAll(r)
			if err != nil {
				return err
			}
			d := "sha256:" + strings.TrimPrefix(name, "blobs/sha256/")
			if got := digestOf(b); got != d {
				return fmt.Errorf("blob %s has digest %s", name, got)
			}
			blobs[d] = b
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if !isLayout || top == nil {
		return nil, fmt.Errorf("%s is not an OCI image layout (no oci-layout or index.json)", path)
	}
	var ti index
	if err := json.Unmarshal(top, &ti); err != nil {
		return nil, fmt.Errorf("index.json: %w", err)
	}
	if len(ti.Manifests) != 1 {
		return nil, fmt.Errorf("index.json names %d manifests, want one image index", len(ti.Manifests))
	}
	out := &Layout{RefName: ti.Manifests[0].Annotations["org.opencontainers.image.ref.name"], IndexType: ti.Manifests[0].MediaType}
	var idx index
	if err := decodeBlob(blobs, ti.Manifests[0], &idx); err != nil {
		return nil, fmt.Errorf("the image index: %w", err)
	}
	layerOf := map[string]int{} // layer digest → image
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			return nil, fmt.Errorf("manifest %s in the index names no platform", d.Digest)
		}
		var m manifest
		if err := decodeBlob(blobs, d, &m); err != nil {
			return nil, fmt.Errorf("manifest for %s: %w", d.Platform, err)
		}
		img := Image{Platform: *d.Platform, Files: map[string]File{}}
		if err := decodeBlob(blobs, m.Config, &img.Config); err != nil {
			return nil, fmt.Errorf("config for %s: %w", d.Platform, err)
		}
		if len(m.Layers) != 1 {
			return nil, fmt.Errorf("%s has %d layers, want 1", d.Platform, len(m.Layers))
		}
		layerOf[m.Layers[0].Digest] = len(out.Images)
		out.Images = append(out.Images, img)
	}
	// Second pass: the layers, streamed.
	seen := map[string]bool{}
	if err := eachEntry(path, func(name string, _ int64, r io.Reader) error {
		d := "sha256:" + strings.TrimPrefix(name, "blobs/sha256/")
		i, ok := layerOf[d]
		if !ok || seen[d] {
			return nil
		}
		seen[d] = true
		h := sha256.New()
		if err := readLayer(io.TeeReader(r, h), out.Images[i].Files); err != nil {
			return fmt.Errorf("layer of %s: %w", out.Images[i].Platform, err)
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d {
			return fmt.Errorf("layer %s has digest %s", d, got)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(seen) != len(layerOf) {
		return nil, errors.New("a layer the manifests name is not in the tarball")
	}
	return out, nil
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func decodeBlob(blobs map[string][]byte, d descriptor, v any) error {
	b, ok := blobs[d.Digest]
	if !ok {
		return fmt.Errorf("blob %s is not in the tarball", d.Digest)
	}
	if int64(len(b)) != d.Size {
		return fmt.Errorf("blob %s has %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	return json.Unmarshal(b, v)
}

func eachEntry(path string, fn func(name string, size int64, r io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := fn(h.Name, h.Size, tr); err != nil {
			return err
		}
	}
}

// readLayer reads a gzipped layer: every path with its mode, and what each ELF
// file is built for.
func readLayer(r io.Reader, files map[string]File) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		f := File{Mode: h.Mode, Type: h.Typeflag}
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
				ef, err := elf.NewFile(bytes.NewReader(data))
				if err != nil {
					return fmt.Errorf("%s: %w", h.Name, err)
				}
				f.ELF, f.Machine = true, ef.Machine
				for _, p := range ef.Progs {
					f.Interpreter = f.Interpreter || p.Type == elf.PT_INTERP
				}
			}
		}
		files["/"+strings.TrimSuffix(h.Name, "/")] = f
	}
	// Read to the end, so that the caller's digest covers the whole blob.
	_, err = io.Copy(io.Discard, r)
	return err
}
