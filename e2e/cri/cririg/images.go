package cririg

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The images the suite's pods run. No registry is reachable from the VM:
// both are built in the guest by BuildImages and imported by ImportImages;
// the pause image is pinned in the config, so containerd never pulls.
const (
	PauseImage = "rdma-netns.test/pause:1"
	ToolsImage = "rdma-netns.test/rdma-tools:1"
	// PauseBinary is the pods' pause program (e2e/cri/cmd/pause), which
	// build-payload.sh ships.
	PauseBinary = "/usr/local/bin/rdma-netns-pause"
	archivePath = Dir + "/images/images.tar"
)

// ToolsBinaries are the RDMA tools of the workload image: Debian's
// rdma-core userspace (verbs, rdma_cm) and perftest. With them the image
// carries busybox, the verbs providers (rxe's among them) and every library
// they load (toolsClosure). iproute2's ip is there for what root in a pod
// with NET_ADMIN can do to its links (busybox's ip cannot set an alias).
//
// The image is packed in the guest from the guest's own files rather than
// on the host: vm-prepare.sh already put exactly this userspace, with its
// libraries, into the initramfs, so the image needs no second download and
// no host-side cache, and cannot drift from what the guest runs.
var ToolsBinaries = []string{
	"/usr/bin/ibv_devices", "/usr/bin/ibv_devinfo", "/usr/bin/ibv_rc_pingpong",
	"/usr/bin/ib_write_bw", "/usr/bin/ib_read_bw", "/usr/bin/ib_send_lat",
	"/usr/bin/rping", "/usr/bin/udaddy",
	"/usr/sbin/ip",
}

// loader is the guest's dynamic loader, which lists what a program loads.
const loader = "/lib64/ld-linux-x86-64.so.2"

// BuildImages writes the pause and the tools image into one OCI archive,
// Dir/images/images.tar, which ImportImages imports with one ctr call
// (each ctr run costs seconds of start-up in the emulated VM).
func BuildImages() error {
	pause, err := layerOf(map[string]string{"/pause": PauseBinary})
	if err != nil {
		return fmt.Errorf("pause image: %v", err)
	}
	files, err := toolsClosure()
	if err != nil {
		return fmt.Errorf("tools image: %v", err)
	}
	tools, err := layerOf(files)
	if err != nil {
		return fmt.Errorf("tools image: %v", err)
	}
	return writeArchive(archivePath, []image{
		{PauseImage, pause, v1.Config{Entrypoint: []string{"/pause"}}},
		{ToolsImage, tools, v1.Config{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/usr/bin:/bin"}}},
	})
}

// toolsClosure maps the tools image's files to the guest's: ToolsBinaries,
// busybox with its applet links (the shell, sleep, cat, ...), the verbs
// providers and the libibverbs driver files, and every library these load,
// as the guest's dynamic loader lists them.
func toolsClosure() (map[string]string, error) {
	files := map[string]string{}
	var objs []string
	for _, b := range ToolsBinaries {
		files[b] = b
		objs = append(objs, b)
	}
	for _, pattern := range []string{"/usr/lib/x86_64-linux-gnu/libibverbs/*.so", "/etc/libibverbs.d/*", "/lib/x86_64-linux-gnu/libgcc_s.so.1"} {
		m, err := filepath.Glob(pattern)
		if err != nil || len(m) == 0 {
			return nil, fmt.Errorf("nothing matches %s in the guest (%v)", pattern, err)
		}
		for _, f := range m {
			files[f] = f
			if strings.HasSuffix(f, ".so") {
				objs = append(objs, f)
			}
		}
	}
	if err := addLibraries(files, objs); err != nil {
		return nil, err
	}
	// busybox's applets are links to it in /bin.
	applets, err := filepath.Glob("/bin/*")
	if err != nil {
		return nil, err
	}
	for _, a := range applets {
		files[a] = a
	}
	return files, nil
}

// addLibraries adds to files every library the guest's dynamic loader
// lists for the ELF objects objs, and the targets of library links
// (libfoo.so.1 -> libfoo.so.1.2.3).
func addLibraries(files map[string]string, objs []string) error {
	for _, o := range objs {
		out, err := exec.Command(loader, "--list", o).Output()
		if err != nil {
			return fmt.Errorf("%s --list %s: %v", loader, o, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				files[f[2]] = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				files[f[0]] = f[0]
			}
		}
	}
	for f := range files {
		if t, err := filepath.EvalSymlinks(f); err == nil && t != f {
			files[t] = t
		}
	}
	return nil
}

// WriteProgramImage writes an image of one program of the guest, at the
// same path, with the libraries it loads if it is dynamically linked, as
// an uncompressed OCI archive at path (for `ctr images import`), its
// entrypoint the program and args: what an image of that program holds,
// packed from the guest's own files as the tools image is.
func WriteProgramImage(path, ref, program string, args ...string) error {
	files := map[string]string{program: program}
	dynamic, err := isDynamic(program)
	if err != nil {
		return fmt.Errorf("image %s: %v", ref, err)
	}
	if dynamic {
		if err := addLibraries(files, []string{program}); err != nil {
			return fmt.Errorf("image %s: %v", ref, err)
		}
	}
	layer, err := layerOf(files)
	if err != nil {
		return fmt.Errorf("image %s: %v", ref, err)
	}
	return writeArchive(path, []image{{ref, layer, v1.Config{Entrypoint: append([]string{program}, args...)}}})
}

// isDynamic says whether the ELF program names a dynamic loader.
func isDynamic(program string) (bool, error) {
	f, err := elf.Open(program)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true, nil
		}
	}
	return false, nil
}

// layerOf is an uncompressed layer (containerd unpacks it as is: nothing to
// gain from gzip inside one VM) holding files (image path -> guest path),
// with their parent directories.
func layerOf(files map[string]string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	var add func(name, src string) error
	add = func(name, src string) error {
		name = strings.TrimPrefix(filepath.Clean(name), "/")
		if seen[name] || name == "" || name == "." {
			return nil
		}
		if parent := filepath.Dir(name); parent != "." {
			if err := add("/"+parent, filepath.Dir(src)); err != nil {
				return err
			}
		}
		seen[name] = true
		fi, err := os.Lstat(src)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(src); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = name, 0, 0, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := add(n, files[n]); err != nil {
			return nil, err
		}
	}
	// Mount points runc creates anyway, and a /tmp for the tools.
	for _, d := range []string{"tmp", "etc", "dev", "proc", "sys"} {
		if !seen[d] {
			mode := int64(0o755)
			if d == "tmp" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode}); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer), nil
}

// image is one image of an archive: its name, its one layer, its config.
type image struct {
	ref   string
	layer v1.Layer
	cfg   v1.Config
}

// writeArchive writes images as an OCI archive (an OCI layout in a tar)
// in which `ctr images import` finds each under its ref.
func writeArchive(path string, images []image) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	for _, im := range images {
		img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), im.layer)
		if err != nil {
			return err
		}
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, im.cfg
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          im.ref,
			"org.opencontainers.image.ref.name": im.ref,
		})); err != nil {
			return fmt.Errorf("%s: %v", im.ref, err)
		}
	}
	return tarDir(dir, path)
}

// tarDir writes the files under dir (an OCI layout: plain files and
// directories) as a tar at path.
func tarDir(dir, path string) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := e.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = rel
		if e.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if e.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// ImportImages imports the archives BuildImages wrote into CRI's
// namespace, unpacked for the native snapshotter, unless containerd has
// both images already (its content survives restarts).
func (c *Containerd) ImportImages(ctx context.Context) error {
	have := true
	for _, ref := range []string{PauseImage, ToolsImage} {
		st, err := c.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			return fmt.Errorf("ImageStatus %s: %v", ref, err)
		}
		have = have && st.Image != nil
	}
	if have {
		return nil
	}
	out, err := exec.Command(Ctr, "--address", Socket, "-n", Namespace, "images", "import",
		"--local", "--snapshotter", "native", archivePath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %v\n%s", archivePath, err, out)
	}
	return nil
}
