package cririg

import (
	"archive/tar"
	"bytes"
	"context"
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
	imagesDir   = Dir + "/images"
)

// ToolsFiles are the guest paths the workload image carries: busybox (the
// shell and `sleep`), Debian's rdma-core userspace (ibv_devices,
// ibv_devinfo, ibv_rc_pingpong, rping, perftest's ib_write_bw, ...), the
// rxe provider and every library they load.
//
// The image is packed in the guest from the guest's own files rather than
// on the host: vm-prepare.sh already put exactly this userspace, resolved
// with its libraries, into the initramfs, so the image needs no second
// download, no host-side cache and cannot drift from what the guest runs.
// Packing it takes well under a second.
var ToolsFiles = []string{
	"/bin", "/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/usr/bin", "/etc/libibverbs.d",
}

// skipTools are files under ToolsFiles a workload has no use for.
var skipTools = map[string]bool{"/usr/bin/kmod": true}

// BuildImages writes the pause and the tools image as OCI archives under
// Dir/images (pause.tar, tools.tar).
func BuildImages() error {
	pause, err := layerOf(map[string]string{"/pause": PauseBinary}, nil)
	if err != nil {
		return fmt.Errorf("pause image: %v", err)
	}
	if err := writeArchive(filepath.Join(imagesDir, "pause.tar"), PauseImage, pause, v1.Config{
		Entrypoint: []string{"/pause"},
	}); err != nil {
		return err
	}
	tools, err := layerOf(nil, ToolsFiles)
	if err != nil {
		return fmt.Errorf("tools image: %v", err)
	}
	return writeArchive(filepath.Join(imagesDir, "tools.tar"), ToolsImage, tools, v1.Config{
		Cmd: []string{"/bin/sh"},
		Env: []string{"PATH=/usr/bin:/bin"},
	})
}

// layerOf is an uncompressed layer (containerd unpacks it as is: nothing to
// gain from gzip inside one VM) holding files (image path -> guest path)
// and the trees under dirs at their own paths.
func layerOf(files map[string]string, dirs []string) (v1.Layer, error) {
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
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || skipTools[p] {
				return err
			}
			return add(p, p)
		})
		if err != nil {
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

// writeArchive writes a one-image OCI archive (an OCI layout in a tar)
// that `ctr images import` names ref.
func writeArchive(path, ref string, layer v1.Layer, cfg v1.Config) error {
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
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
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":         ref,
		"org.opencontainers.image.ref.name": ref,
	})); err != nil {
		return err
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
	for _, f := range []string{"pause.tar", "tools.tar"} {
		out, err := exec.Command(Ctr, "--address", Socket, "-n", Namespace, "images", "import",
			"--local", "--snapshotter", "native", filepath.Join(imagesDir, f)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ctr images import %s: %v\n%s", f, err, out)
		}
	}
	return nil
}
