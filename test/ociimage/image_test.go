package ociimage_test

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hwipam/hwipam/test/harness"
	"github.com/hwipam/hwipam/test/ociimage"
)

// binaries are the Dockerfile's binaries (cmd/*), at / in the image.
var binaries = []string{"ipam-controller", "ipam-node", "ipamctl", "nv-ipam"}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// dockerfileLayout reads what the Dockerfile says of the final image: the
// directory the binaries are copied to and the user.
func dockerfileLayout(t *testing.T) (copyTo, user string) {
	t.Helper()
	f, err := os.Open(filepath.Join(harness.RepoRoot(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) == 4 && fields[0] == "COPY" && fields[1] == "--from=build" && fields[2] == "/src/bin/":
			copyTo = fields[3]
		case len(fields) == 2 && fields[0] == "USER":
			user = fields[1]
		}
	}
	if copyTo == "" || user == "" {
		t.Fatalf("the Dockerfile no longer copies /src/bin/ into the image or names no USER (%q, %q): update this test", copyTo, user)
	}
	return copyTo, user
}

func makeIn(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "make", append([]string{"--no-print-directory", "-C", harness.RepoRoot()}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestMakeImageIsAMultiPlatformIndex builds the image as users do (`make
// image`) and reads it back without the tool that wrote it: one index, an
// image for linux/amd64 and one for linux/arm64, each configuration naming its
// platform, every binary a static ELF for that platform's machine, laid out as
// the Dockerfile lays it out.
func TestMakeImageIsAMultiPlatformIndex(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary for two platforms")
	}
	bin := t.TempDir()
	makeIn(t, "image", "BIN_DIR="+bin, "IMAGE_TAG=test")
	l, err := ociimage.Read(filepath.Join(bin, "hwipam-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if l.RefName != "test" || l.IndexType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("index.json names %q (%s), want the tag test and an OCI image index", l.RefName, l.IndexType)
	}
	var platforms []string
	for _, img := range l.Images {
		platforms = append(platforms, img.Platform.String())
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("the index holds %v, want linux/amd64 and linux/arm64", platforms)
	}
	copyTo, user := dockerfileLayout(t)
	for _, img := range l.Images {
		p := img.Platform
		if img.Config.OS != p.OS || img.Config.Architecture != p.Architecture {
			t.Errorf("%s: the configuration names %s/%s", p, img.Config.OS, img.Config.Architecture)
		}
		if img.Config.Config.User != user {
			t.Errorf("%s: user %q, the Dockerfile's is %q", p, img.Config.Config.User, user)
		}
		for _, b := range binaries {
			f, ok := img.Files[filepath.Join(copyTo, b)]
			switch {
			case !ok:
				t.Errorf("%s: no %s", p, filepath.Join(copyTo, b))
			case f.Mode != 0o755:
				t.Errorf("%s: %s has mode %o", p, b, f.Mode)
			case !f.ELF || f.Machine != elfMachine[p.Architecture]:
				t.Errorf("%s: %s is %v (ELF %v), want an ELF for %v", p, b, f.Machine, f.ELF, elfMachine[p.Architecture])
			case f.Interpreter:
				t.Errorf("%s: %s names a program interpreter: not a static binary", p, b)
			}
		}
		for path, mode := range map[string]int64{"/etc/passwd": 0o644, "/etc/group": 0o644, "/tmp": 0o1777, "/home/nonroot": 0o700} {
			if f, ok := img.Files[path]; !ok || f.Mode != mode {
				t.Errorf("%s: %s is %+v (present %v), want mode %o", p, path, f, ok, mode)
			}
		}
	}
}

// TestMakeBuildForArm64: `make build GOARCH=arm64` links every binary for
// arm64 (the plugin without its amd64 entry point).
func TestMakeBuildForArm64(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary for arm64")
	}
	bin := t.TempDir()
	makeIn(t, "build", "GOARCH=arm64", "BIN_DIR="+bin)
	for _, b := range binaries {
		f, err := elf.Open(filepath.Join(bin, b))
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if f.Machine != elf.EM_AARCH64 {
			t.Errorf("%s is for %v", b, f.Machine)
		}
		_ = f.Close()
	}
}
