// Command hwipam-image builds OCI images from files on disk, pushes them and serves a
// registry, with go-containerregistry and without a Docker engine. It backs
// `make image`, `make image-push` and the real-node harness (which also uses it for the
// pause and workload images).
//
//	hwipam-image build -o OUT.tar [--tag REF] [--user UID:GID] [--entrypoint PATH]
//	                   [--platform OS/ARCH]... [--dir PATH[:MODE]]... [--link PATH=TARGET]...
//	                   PATH=SRC[:MODE]...
//	hwipam-image push [--insecure] OUT.tar REF
//	hwipam-image serve [--addr 127.0.0.1:0] [--addr-file FILE] [--blob-dir DIR]
//
// Without --platform, build writes one image as a `docker save` tarball; its
// configuration names the architecture of the ELF binaries it holds (the build
// machine's when it holds none). With --platform (repeatable), it writes an OCI
// image layout tarball whose index lists one image per platform, each SRC read with
// {os} and {arch} replaced by the platform's; every ELF file must be built for its
// platform's machine. push pushes either kind (an index as an index).
//
// Every file is written with a fixed modification time, owner 0:0 and the given mode
// (default 0755), so the same inputs give the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const usage = `usage:
  hwipam-image build -o OUT.tar [--tag REF] [--user UID:GID] [--entrypoint PATH]
                     [--platform OS/ARCH]... [--dir PATH[:MODE]]... [--link PATH=TARGET]...
                     PATH=SRC[:MODE]...
  hwipam-image push [--insecure] OUT.tar REF
  hwipam-image serve [--addr 127.0.0.1:0] [--addr-file FILE] [--blob-dir DIR]
`

// epoch is the modification time of every file in a layer and the image's creation
// time: reproducible images.
var epoch = time.Unix(0, 0).UTC()

func main() {
	log.SetFlags(0)
	log.SetPrefix("hwipam-image: ")
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	case "serve":
		err = serve(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// entry is one thing in the image's single layer.
type entry struct {
	path   string // absolute, in the image
	src    string // file on disk; empty for directories and links
	target string // symlink target
	mode   int64
	typ    byte
}

// parseMode reads "PATH[:MODE]" (octal mode) with def as the default mode.
func parseMode(s string, def int64) (string, int64, error) {
	p, m, ok := strings.Cut(s, ":")
	if !ok {
		return s, def, nil
	}
	mode, err := strconv.ParseInt(m, 8, 64)
	if err != nil || mode < 0 || mode > 0o7777 {
		return "", 0, fmt.Errorf("%q: mode %q is not an octal file mode", s, m)
	}
	return p, mode, nil
}

func imagePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("image path %q must be absolute", p)
	}
	return path.Clean(p), nil
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	out := fs.String("o", "", "output: image tarball (docker save format, or an OCI image layout with --platform)")
	tag := fs.String("tag", "hwipam:dev", "the image reference recorded in the tarball")
	user := fs.String("user", "", "the image's default user, UID:GID (empty: root)")
	entrypoint := fs.String("entrypoint", "", "the image's entrypoint (empty: none; the pod gives the command)")
	var dirs, links, platforms multi
	fs.Var(&dirs, "dir", "a directory PATH[:MODE] to create (repeatable)")
	fs.Var(&links, "link", "a symlink PATH=TARGET (repeatable)")
	fs.Var(&platforms, "platform", "build for OS/ARCH, e.g. linux/arm64 (repeatable): an image index; SRC may use {os} and {arch}")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("build: -o OUT.tar is required")
	}
	var entries []entry
	for _, d := range dirs {
		p, mode, err := parseMode(d, 0o755)
		if err != nil {
			return fmt.Errorf("--dir %w", err)
		}
		if p, err = imagePath(p); err != nil {
			return fmt.Errorf("--dir: %w", err)
		}
		entries = append(entries, entry{path: p, mode: mode, typ: tar.TypeDir})
	}
	for _, l := range links {
		p, target, ok := strings.Cut(l, "=")
		if !ok || target == "" {
			return fmt.Errorf("--link %q: want PATH=TARGET", l)
		}
		p, err := imagePath(p)
		if err != nil {
			return fmt.Errorf("--link: %w", err)
		}
		entries = append(entries, entry{path: p, target: target, mode: 0o777, typ: tar.TypeSymlink})
	}
	for _, f := range fs.Args() {
		p, src, ok := strings.Cut(f, "=")
		if !ok || src == "" {
			return fmt.Errorf("file %q: want PATH=SRC[:MODE]", f)
		}
		src, mode, err := parseMode(src, 0o755)
		if err != nil {
			return fmt.Errorf("file %w", err)
		}
		if p, err = imagePath(p); err != nil {
			return err
		}
		entries = append(entries, entry{path: p, src: src, mode: mode, typ: tar.TypeReg})
	}
	if len(entries) == 0 {
		return errors.New("build: nothing to put in the image (give PATH=SRC files)")
	}
	ref, err := name.ParseReference(*tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *tag, err)
	}
	if len(platforms) == 0 {
		arch, err := elfArch(entries)
		if err != nil {
			return err
		}
		img, err := buildImage(entries, v1.Platform{OS: "linux", Architecture: arch}, *user, *entrypoint)
		if err != nil {
			return err
		}
		if err := tarball.WriteToFile(*out, ref, img); err != nil {
			return fmt.Errorf("writing %s: %w", *out, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "%s %s %s\n", *out, ref, digest)
		return nil
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pl := range platforms {
		osName, arch, ok := strings.Cut(pl, "/")
		if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
			return fmt.Errorf("--platform %q: want OS/ARCH, e.g. linux/arm64", pl)
		}
		platform := v1.Platform{OS: osName, Architecture: arch}
		own := make([]entry, len(entries))
		for i, e := range entries {
			e.src = strings.NewReplacer("{os}", osName, "{arch}", arch).Replace(e.src)
			own[i] = e
		}
		if err := checkMachine(own, arch); err != nil {
			return fmt.Errorf("--platform %s: %w", pl, err)
		}
		img, err := buildImage(own, platform, *user, *entrypoint)
		if err != nil {
			return fmt.Errorf("--platform %s: %w", pl, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	if err := writeLayout(*out, ref, idx); err != nil {
		return fmt.Errorf("writing %s: %w", *out, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "%s %s %s (%s)\n", *out, ref, digest, strings.Join(platforms, ", "))
	return nil
}

// buildImage makes the one-layer image of entries for platform.
func buildImage(entries []entry, platform v1.Platform, user, entrypoint string) (v1.Image, error) {
	for _, e := range entries {
		if e.typ != tar.TypeReg {
			continue
		}
		st, err := os.Stat(e.src)
		if err != nil {
			return nil, fmt.Errorf("file for %s: %w", e.path, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("file for %s: %s is not a regular file", e.path, e.src)
		}
	}
	layerData, err := layerTar(entries)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = platform.OS
	cfg.Architecture = platform.Architecture
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = user
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if entrypoint != "" {
		cfg.Config.Entrypoint = []string{entrypoint}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// machines are the ELF machines of the Go architectures the image is built for.
var machines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "arm": elf.EM_ARM,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
}

// fileMachine is the ELF machine of the file at path, ok false when it is not ELF.
func fileMachine(file string) (m elf.Machine, ok bool, err error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if n, _ := io.ReadFull(f, magic); n < 4 || string(magic) != elf.ELFMAG {
		return 0, false, nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", file, err)
	}
	return ef.Machine, true, nil
}

// checkMachine refuses an ELF file among entries that is not built for arch.
func checkMachine(entries []entry, arch string) error {
	want, known := machines[arch]
	for _, e := range entries {
		if e.typ != tar.TypeReg {
			continue
		}
		m, isELF, err := fileMachine(e.src)
		if err != nil {
			return fmt.Errorf("file for %s: %w", e.path, err)
		}
		if isELF && known && m != want {
			return fmt.Errorf("%s (for %s) is an ELF for %s, not %s: build it with GOARCH=%s", e.src, e.path, m, want, arch)
		}
	}
	return nil
}

// elfArch is the Go architecture of the ELF files among entries, which must agree;
// the build machine's when there are none.
func elfArch(entries []entry) (string, error) {
	arch, from := "", ""
	for _, e := range entries {
		if e.typ != tar.TypeReg {
			continue
		}
		m, isELF, err := fileMachine(e.src)
		if err != nil {
			return "", fmt.Errorf("file for %s: %w", e.path, err)
		}
		if !isELF {
			continue
		}
		a := ""
		for goarch, em := range machines {
			if em == m {
				a = goarch
			}
		}
		if a == "" {
			return "", fmt.Errorf("%s is an ELF for %s, which this tool does not know", e.src, m)
		}
		if arch != "" && a != arch {
			return "", fmt.Errorf("%s is built for %s but %s for %s: one image holds one architecture (use --platform)", e.src, a, from, arch)
		}
		arch, from = a, e.src
	}
	if arch == "" {
		arch = runtime.GOARCH
	}
	return arch, nil
}

// writeLayout writes idx as an OCI image layout tarball: oci-layout, index.json
// naming the index as ref, and every blob. ctr images import, docker load and
// push read it.
func writeLayout(out string, ref name.Reference, idx v1.ImageIndex) error {
	blobs := map[v1.Hash]func() (io.ReadCloser, error){}
	addRaw := func(raw []byte) v1.Hash {
		h, _, _ := v1.SHA256(bytes.NewReader(raw))
		blobs[h] = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
		return h
	}
	rawIdx, err := idx.RawManifest()
	if err != nil {
		return err
	}
	idxDigest := addRaw(rawIdx)
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		raw, err := img.RawManifest()
		if err != nil {
			return err
		}
		addRaw(raw)
		if raw, err = img.RawConfigFile(); err != nil {
			return err
		}
		addRaw(raw)
		layers, err := img.Layers()
		if err != nil {
			return err
		}
		for _, l := range layers {
			h, err := l.Digest()
			if err != nil {
				return err
			}
			blobs[h] = l.Compressed
		}
	}
	mt, err := idx.MediaType()
	if err != nil {
		return err
	}
	top := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{{
		MediaType: mt, Size: int64(len(rawIdx)), Digest: idxDigest,
		Annotations: map[string]string{
			"org.opencontainers.image.ref.name": ref.Identifier(),
			"io.containerd.image.name":          ref.String(),
		},
	}}}
	topRaw, err := json.Marshal(top)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	put := func(name string, size int64, body io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, ModTime: epoch, Typeflag: tar.TypeReg,
			Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := io.Copy(tw, body)
		return err
	}
	if err := put("oci-layout", int64(len(`{"imageLayoutVersion":"1.0.0"}`)), strings.NewReader(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", int64(len(topRaw)), bytes.NewReader(topRaw)); err != nil {
		return err
	}
	hashes := make([]v1.Hash, 0, len(blobs))
	for h := range blobs {
		hashes = append(hashes, h)
	}
	sort.Slice(hashes, func(i, j int) bool { return hashes[i].String() < hashes[j].String() })
	for _, h := range hashes {
		data, err := readAll(blobs[h])
		if err != nil {
			return err
		}
		if err := put("blobs/"+h.Algorithm+"/"+h.Hex, int64(len(data)), bytes.NewReader(data)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func readAll(open func() (io.ReadCloser, error)) ([]byte, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// layerTar writes the entries, with every parent directory, into one tar stream.
func layerTar(entries []entry) ([]byte, error) {
	all := map[string]entry{}
	for _, e := range entries {
		if old, dup := all[e.path]; dup && (old.typ != tar.TypeDir || e.typ != tar.TypeDir) {
			return nil, fmt.Errorf("%s is given twice", e.path)
		}
		all[e.path] = e
		for d := path.Dir(e.path); d != "/"; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = entry{path: d, mode: 0o755, typ: tar.TypeDir}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	sort.Strings(paths) // parents before children
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := all[p]
		hdr := &tar.Header{
			Name: strings.TrimPrefix(p, "/"), Mode: e.mode, Typeflag: e.typ, ModTime: epoch,
			Uname: "root", Gname: "root", Format: tar.FormatPAX,
		}
		switch e.typ {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeSymlink:
			hdr.Linkname = e.target
		case tar.TypeReg:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", e.src, err)
			}
			hdr.Size = int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	insecure := fs.Bool("insecure", false, "plain HTTP (a registry on loopback needs it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("push: want OUT.tar REF, e.g. push bin/hwipam-image.tar registry.example:5000/hwipam:v1")
	}
	var opts []name.Option
	if *insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(fs.Arg(1), opts...)
	if err != nil {
		return fmt.Errorf("push: reference %q: %w", fs.Arg(1), err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var digest v1.Hash
	if idx, cleanup, err := readLayout(fs.Arg(0)); err != nil {
		return fmt.Errorf("push: reading %s: %w", fs.Arg(0), err)
	} else if idx != nil {
		defer cleanup()
		if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		if digest, err = idx.Digest(); err != nil {
			return err
		}
	} else {
		img, err := tarball.ImageFromPath(fs.Arg(0), nil)
		if err != nil {
			return fmt.Errorf("push: reading %s: %w", fs.Arg(0), err)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		if digest, err = img.Digest(); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stdout, "%s@%s\n", ref, digest)
	return nil
}

// readLayout reads an OCI image layout tarball (what build writes with
// --platform) into a temporary directory and returns the index its index.json
// names; nil, and no error, for a tarball that is not a layout.
func readLayout(file string) (v1.ImageIndex, func(), error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	dir, err := os.MkdirTemp("", "hwipam-image-push-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	isLayout := false
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		clean := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || strings.HasPrefix(clean, "..") || path.IsAbs(clean) {
			continue
		}
		if clean == "oci-layout" {
			isLayout = true
		}
		target := dir + "/" + clean
		if err := os.MkdirAll(path.Dir(target), 0o755); err != nil {
			cleanup()
			return nil, nil, err
		}
		w, err := os.Create(target)
		if err == nil {
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	if !isLayout {
		cleanup()
		return nil, nil, nil
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	top, err := lp.ImageIndex()
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	im, err := top.IndexManifest()
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("index.json: %w", err)
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsIndex() {
		cleanup()
		return nil, nil, errors.New("index.json must name one image index (as build --platform writes)")
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return idx, cleanup, nil
}

// serve runs a registry until SIGTERM/SIGINT: manifests in memory, blobs in memory
// or, with --blob-dir, on disk (a registry holding the hwipam image otherwise keeps
// ~370 MiB resident). With --addr-file it writes the address it listens on there once
// it accepts connections.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	addrFile := fs.String("addr-file", "", "file to write the bound host:port into")
	blobDir := fs.String("blob-dir", "", "keep blobs in this directory instead of memory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := []registry.Option{registry.Logger(log.New(io.Discard, "", 0))}
	if *blobDir != "" {
		if err := os.MkdirAll(*blobDir, 0o755); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(*blobDir)))
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()), 0o644); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	log.Printf("registry on %s", ln.Addr())
	srv := &http.Server{
		Handler:           registry.New(opts...),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The registry buffers every upload in memory; once pushes are over the heap
	// they left is garbage, but Go returns it to the OS only slowly.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
				debug.FreeOSMemory()
			}
		}
	}()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
