package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image holds both platforms; the install runs on this machine's.
var (
	platforms = []string{"linux/amd64", "linux/arm64"}
	native    = "linux/" + runtime.GOARCH
	machines  = map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
)

const plugin = "rdma-netns"

// binaries returns the directory holding OS_ARCH/NAME and the NAMEs: what
// make image built (make image-test passes them in the environment), or,
// for a plain go test, the plugin alone built here the same way.
func binaries(t *testing.T) (string, []string) {
	t.Helper()
	if dir := os.Getenv("IMAGE_TEST_BIN_DIR"); dir != "" {
		bins := strings.Split(os.Getenv("IMAGE_TEST_BINS"), ",")
		if bins[0] != plugin {
			t.Fatalf("IMAGE_TEST_BINS=%q: the image's first binary (its entrypoint) must be %s", bins, plugin)
		}
		return dir, bins
	}
	dir := t.TempDir()
	for _, p := range platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, goos+"_"+goarch, plugin), ".")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build for %s: %v\n%s", p, err, out)
		}
	}
	return dir, []string{plugin}
}

// cli runs the command as make image and make push do.
func cli(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if rc := run(context.Background(), args, &stdout, &stderr); rc != 0 {
		t.Fatalf("image %s: exit %d\n%s%s", strings.Join(args, " "), rc, stdout.String(), stderr.String())
	}
	t.Logf("image %s:\n%s", args[0], stdout.String())
	return stdout.String()
}

// The image make image builds and make push pushes, pulled back from a
// registry by digest as a node pulls it, holds a static binary for each
// platform whose install command puts the plugin in place.
func TestImage(t *testing.T) {
	binDir, bins := binaries(t)
	build := []string{"build", "-bin-dir", binDir, "-bins", strings.Join(bins, ","), "-platforms", strings.Join(platforms, ","), "-tag", "rdma-netns:test"}
	out := filepath.Join(t.TempDir(), "layout")
	cli(t, append(build, "-out", out)...)

	// The same binaries make the same image: a rebuild does not change
	// the digest a DaemonSet pins.
	again := filepath.Join(t.TempDir(), "layout")
	cli(t, append(build, "-out", again)...)
	built, err := ReadLayout(out)
	if err != nil {
		t.Fatal(err)
	}
	rebuilt, err := ReadLayout(again)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := built.Digest()
	d2, _ := rebuilt.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same binaries differ: %s, %s", d1, d2)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	pushed := cli(t, "push", "-layout", out, host+"/rdma-netns/rdma-netns:test")
	want := host + "/rdma-netns/rdma-netns@" + d1.String()
	if strings.TrimSpace(pushed) != "pushed "+want {
		t.Fatalf("push printed %q, want the reference by digest %s", pushed, want)
	}

	ref, err := name.ParseReference(want)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatalf("pull %s: %v", want, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s, want an OCI image index", m.MediaType)
	}
	var got []string
	for _, desc := range m.Manifests {
		got = append(got, desc.Platform.String())
		if desc.MediaType != types.OCIManifestSchema1 {
			t.Errorf("%s: media type %s, want an OCI manifest", desc.Platform, desc.MediaType)
		}
	}
	if !slices.Equal(got, platforms) {
		t.Fatalf("index has platforms %v, want %v", got, platforms)
	}

	roots := map[string]string{}
	for _, desc := range m.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		p := desc.Platform.String()
		roots[p] = unpack(t, img, *desc.Platform, bins)
		for _, b := range bins {
			checkStatic(t, filepath.Join(roots[p], b), machines[p])
		}
	}
	if roots[native] == "" {
		t.Fatalf("no %s image to run the install command of", native)
	}
	t.Run("install", func(t *testing.T) { checkInstall(t, filepath.Join(roots[native], plugin)) })
	t.Run("install-nri", func(t *testing.T) { checkInstallNRI(t, roots[native]) })
}

// checkInstallNRI runs the init container's install of the NRI plugin with
// the image's two binaries: the installed copy checks its configuration.
func checkInstallNRI(t *testing.T, root string) {
	host := t.TempDir()
	dest, plugins, confd := filepath.Join(host, "opt/cni/bin"), filepath.Join(host, "opt/nri/plugins"), filepath.Join(host, "etc/nri/conf.d")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, plugin), "install", "--dest", dest, "--nri", filepath.Join(root, "rdma-netns-nri"),
		"--nri-plugin-dir", plugins, "--nri-conf-dir", confd, "--", "--memlock", "unlimited", "--shm-size", "1Gi").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "(memlock unlimited, /dev/shm 1Gi") {
		t.Fatalf("install --nri: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(filepath.Join(root, "rdma-netns-nri"))
	if got, _ := os.ReadFile(filepath.Join(plugins, "10-rdma-netns-nri")); !bytes.Equal(got, want) {
		t.Error("the pre-installed plugin differs from the image's rdma-netns-nri")
	}
	if conf, err := os.ReadFile(filepath.Join(confd, "10-rdma-netns-nri.conf")); err != nil || !strings.Contains(string(conf), "--shm-size\n1Gi\n") {
		t.Errorf("configuration: %v\n%s", err, conf)
	}
	out, err = exec.Command(filepath.Join(root, plugin), "install", "--dest", dest, "--nri", filepath.Join(root, "rdma-netns-nri"),
		"--nri-plugin-dir", plugins, "--nri-conf-dir", confd, "--", "--shm-size", "lots").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the NRI plugin rejects its flags") {
		t.Errorf("install --nri with a bad size: %v\n%s", err, out)
	}
}

// unpack extracts the image's file system as a runtime does and checks
// that it holds the binaries and nothing else (scratch: no shell).
func unpack(t *testing.T, img v1.Image, p v1.Platform, bins []string) string {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != p.OS || cfg.Architecture != p.Architecture {
		t.Errorf("%s image config says %s/%s", p, cfg.OS, cfg.Architecture)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/" + plugin}) {
		t.Errorf("%s entrypoint %q", p, cfg.Config.Entrypoint)
	}
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var files []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, hdr.Name)
		if hdr.Typeflag != tar.TypeReg || strings.Contains(hdr.Name, "/") {
			t.Fatalf("%s: %s is not a plain file at the root", p, hdr.Name)
		}
		if hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s: %s has mode %o, owner %d:%d; want 0755 root", p, hdr.Name, hdr.Mode, hdr.Uid, hdr.Gid)
		}
		f, err := os.OpenFile(filepath.Join(root, hdr.Name), os.O_CREATE|os.O_WRONLY|os.O_EXCL, os.FileMode(hdr.Mode))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	// The flattened filesystem lists the top layer first: compare as sets.
	want := slices.Sorted(slices.Values(bins))
	slices.Sort(files)
	if !slices.Equal(files, want) {
		t.Errorf("%s image holds %v, want %v", p, files, want)
	}
	return root
}

// checkStatic reads the ELF header: a binary for the wrong machine, or one
// that needs a dynamic loader the node may not have, is a broken image.
func checkStatic(t *testing.T, path string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Machine != machine || f.Class != elf.ELFCLASS64 {
		t.Errorf("%s: %s %s, want %s", path, f.Class, f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has a %s program header: dynamically linked", path, p.Type)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s: needs libraries %v (%v)", path, libs, err)
	}
}

// installRun runs the image's install command as the DaemonSet does.
func installRun(t *testing.T, exe, dest string) (string, error) {
	t.Helper()
	out, err := exec.Command(exe, "install", "--dest", dest).CombinedOutput()
	t.Logf("%s install --dest %s: %v\n%s", filepath.Base(exe), dest, err, out)
	return string(out), err
}

func checkInstall(t *testing.T, exe string) {
	host := filepath.Join(t.TempDir(), "host")
	dest := filepath.Join(host, "opt/cni/bin")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dest, plugin)
	want, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	installed := func() os.FileInfo {
		t.Helper()
		fi, err := os.Stat(target)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o755 {
			t.Errorf("%s has mode %v, want -rwxr-xr-x", target, fi.Mode())
		}
		if got, _ := os.ReadFile(target); !bytes.Equal(got, want) {
			t.Errorf("%s differs from the image's binary", target)
		}
		if des, _ := os.ReadDir(dest); len(des) != 1 {
			t.Errorf("%s holds %d files, want only %s", dest, len(des), plugin)
		}
		return fi
	}

	if _, err := installRun(t, exe, dest); err != nil {
		t.Fatal(err)
	}
	first := installed()

	// A second run (pod restart, new image) replaces the file with a new
	// inode; the old one stays intact for a plugin run holding it.
	running, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	if _, err := installRun(t, exe, dest); err != nil {
		t.Fatal(err)
	}
	if second := installed(); os.SameFile(first, second) {
		t.Error("the second install rewrote the file in place instead of renaming a new one over it")
	}
	if old, _ := io.ReadAll(running); !bytes.Equal(old, want) {
		t.Error("the replaced file's content changed under an open reader")
	}

	out, err := installRun(t, exe, filepath.Join(host, "opt/cni/missing"))
	if err == nil || !strings.Contains(out, "does not exist") {
		t.Errorf("install into a missing directory: %v, %q; want a failure saying it does not exist", err, out)
	}

	t.Run("read-only", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("a read-only bind mount needs root (make test runs as root)")
		}
		before := readOnlyBind(t, dest)
		out, err := installRun(t, exe, dest)
		if err == nil || !strings.Contains(out, "read-only") {
			t.Errorf("install into a read-only directory: %v, %q; want a failure saying it is read-only", err, out)
		}
		after := installed()
		if !os.SameFile(before, after) {
			t.Error("the binary changed although the install failed")
		}
	})
}

// readOnlyBind makes dir read-only for the rest of the test, as a hostPath
// volume with readOnly: true is, and returns the binary's state before.
func readOnlyBind(t *testing.T, dir string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(filepath.Join(dir, plugin))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	if f, err := os.Create(filepath.Join(dir, "probe")); err == nil || !errors.Is(err, syscall.EROFS) {
		f.Close()
		t.Fatalf("%s is still writable after the read-only remount: %v", dir, err)
	}
	return fi
}

// Mistakes on the command line of make image and make push are reported,
// not turned into an empty image or a push of nothing.
func TestCommandLineErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		rc   int
		want string
	}{
		{nil, 2, "Usage"},
		{[]string{"publish"}, 2, "Usage"},
		{[]string{"build", "-bin-dir", missing}, 2, "-out are required"},
		{[]string{"build", "-bin-dir", missing, "-out", missing + "/layout", "-platforms", "linux"}, 1, "want OS/ARCH"},
		{[]string{"build", "-bin-dir", missing, "-out", missing + "/layout"}, 1, "build the binaries first"},
		{[]string{"build", "-bin-dir", missing, "-out", missing + "/layout", "-symlinks", "/var/run"}, 2, "want PATH=TARGET"},
		{[]string{"build", "-bin-dir", missing, "-out", missing + "/layout", "-files", "/etc/passwd="}, 2, "want PATH=FILE"},
		{[]string{"push", "-layout", missing}, 2, "one image reference"},
		{[]string{"push", "-layout", missing, "registry.example/rdma-netns:v1"}, 1, "run make image first"},
		{[]string{"push", "-layout", missing, "rdma-netns:v1"}, 1, "names no registry"},
		{[]string{"push", "-layout", missing, "team/rdma-netns:v1"}, 1, "names no registry"},
		{[]string{"push", "-layout", missing, "registry.example/rdma-netns:v1:v2"}, 1, "could not parse reference"},
	} {
		var stdout, stderr bytes.Buffer
		rc := run(context.Background(), tc.args, &stdout, &stderr)
		if rc != tc.rc || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("image %q: exit %d, stderr %q; want exit %d and %q", tc.args, rc, stderr.String(), tc.rc, tc.want)
		}
	}
	if _, err := os.Stat(missing + "/layout"); !os.IsNotExist(err) {
		t.Errorf("a failed build left %s/layout behind: %v", missing, err)
	}
}

// -dir, -symlinks and -files lay an image out as another project's
// manifest runs it (Multus's: /usr/src/multus-cni/bin/NAME) and as its
// programs expect a root to be (/var/run a link to /run, where the pods'
// netns paths are; an /etc/passwd naming root).
func TestImageLayout(t *testing.T) {
	binDir := t.TempDir()
	want := []byte("#!/bin/true\n")
	for _, b := range []string{"daemon", "shim"} {
		if err := os.MkdirAll(filepath.Join(binDir, "linux_amd64"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(binDir, "linux_amd64", b), want, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	passwd := filepath.Join(binDir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/sbin/nologin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "layout")
	cli(t, "build", "-bin-dir", binDir, "-bins", "daemon,shim", "-platforms", "linux/amd64", "-tag", "multus:test",
		"-dir", "/usr/src/multus-cni/bin", "-symlinks", "/var/run=../run", "-files", "/etc/passwd="+passwd, "-out", out)
	idx, err := ReadLayout(out)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/src/multus-cni/bin/daemon"}) {
		t.Errorf("entrypoint %q, want the first binary in -dir", cfg.Config.Entrypoint)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	got := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			got[hdr.Name] = "dir"
		case tar.TypeSymlink:
			got[hdr.Name] = "-> " + hdr.Linkname
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			if hdr.Name == "etc/passwd" {
				if !strings.HasPrefix(string(data), "root:x:0:0:") || hdr.Mode != 0o644 {
					t.Errorf("etc/passwd: mode %o, content %q; want 0644 and the file given", hdr.Mode, data)
				}
			} else if !bytes.Equal(data, want) || hdr.Mode != 0o755 {
				t.Errorf("%s: mode %o, content %q; want 0755 and the binary", hdr.Name, hdr.Mode, data)
			}
			got[hdr.Name] = "file"
		}
	}
	for name, what := range map[string]string{
		"usr": "dir", "usr/src": "dir", "usr/src/multus-cni": "dir", "usr/src/multus-cni/bin": "dir",
		"usr/src/multus-cni/bin/daemon": "file", "usr/src/multus-cni/bin/shim": "file",
		"var": "dir", "var/run": "-> ../run", "etc": "dir", "etc/passwd": "file",
	} {
		if got[name] != what {
			t.Errorf("image has %s as %q, want %q (all: %v)", name, got[name], what, got)
		}
	}
	if len(got) != 10 {
		t.Errorf("image holds %v, want the binaries, their directories and the link alone", got)
	}
}
