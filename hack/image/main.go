// Command hwipam-image builds OCI images from files on disk, pushes them and serves a
// registry, with go-containerregistry and without a Docker engine. It backs
// `make image`, `make image-push` and the real-node harness (which also uses it for the
// pause and workload images).
//
//	hwipam-image build -o OUT.tar [--tag REF] [--user UID:GID] [--entrypoint PATH]
//	                   [--dir PATH[:MODE]]... [--link PATH=TARGET]... PATH=SRC[:MODE]...
//	hwipam-image push [--insecure] OUT.tar REF
//	hwipam-image serve [--addr 127.0.0.1:0] [--addr-file FILE] [--blob-dir DIR]
//
// Every file is written with a fixed modification time, owner 0:0 and the given mode
// (default 0755), so the same inputs give the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"context"
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
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const usage = `usage:
  hwipam-image build -o OUT.tar [--tag REF] [--user UID:GID] [--entrypoint PATH]
                     [--dir PATH[:MODE]]... [--link PATH=TARGET]... PATH=SRC[:MODE]...
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
	out := fs.String("o", "", "output: image tarball (docker save format, loadable by `ctr images import`)")
	tag := fs.String("tag", "hwipam:dev", "the image reference recorded in the tarball")
	user := fs.String("user", "", "the image's default user, UID:GID (empty: root)")
	entrypoint := fs.String("entrypoint", "", "the image's entrypoint (empty: none; the pod gives the command)")
	var dirs, links multi
	fs.Var(&dirs, "dir", "a directory PATH[:MODE] to create (repeatable)")
	fs.Var(&links, "link", "a symlink PATH=TARGET (repeatable)")
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
		st, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("file for %s: %w", p, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("file for %s: %s is not a regular file", p, src)
		}
		entries = append(entries, entry{path: p, src: src, mode: mode, typ: tar.TypeReg})
	}
	if len(entries) == 0 {
		return errors.New("build: nothing to put in the image (give PATH=SRC files)")
	}
	layerData, err := layerTar(entries)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = runtime.GOARCH
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.User = *user
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if *entrypoint != "" {
		cfg.Config.Entrypoint = []string{*entrypoint}
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	ref, err := name.ParseReference(*tag)
	if err != nil {
		return fmt.Errorf("--tag %q: %w", *tag, err)
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
	img, err := tarball.ImageFromPath(fs.Arg(0), nil)
	if err != nil {
		return fmt.Errorf("push: reading %s: %w", fs.Arg(0), err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "%s@%s\n", ref, digest)
	return nil
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
