package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch is the time stamp of every file in the image: the same binaries
// give the same layers, the same image digest, on any machine.
var epoch = time.Unix(0, 0).UTC()

// binPath is where a binary built for a platform is found under binDir:
// the directory name `go install` uses for a cross-compiled GOBIN.
func binPath(binDir string, p v1.Platform, bin string) string {
	return filepath.Join(binDir, p.OS+"_"+p.Architecture, bin)
}

// parsePlatforms reads "linux/amd64,linux/arm64".
func parsePlatforms(s string) ([]v1.Platform, error) {
	var ps []v1.Platform
	for _, f := range strings.Split(s, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if p.OS == "" || p.Architecture == "" {
			return nil, fmt.Errorf("platform %q: want OS/ARCH, such as linux/arm64", f)
		}
		ps = append(ps, *p)
	}
	return ps, nil
}

// Layout says where things go in the image: the binaries in Dir (default
// /), and what a program expects of a distribution's root: Symlinks (path
// in the image -> target), such as /var/run -> ../run, and Files (path in
// the image -> file to copy, mode 0644), such as /etc/passwd.
type Layout struct {
	Dir      string
	Symlinks map[string]string
	Files    map[string]string
}

// dir is Layout.Dir as a tar name prefix: "" for /, else "usr/src/x/".
func (l Layout) dir() string {
	d := strings.Trim(path.Clean("/"+l.Dir), "/")
	if d == "" {
		return ""
	}
	return d + "/"
}

// Build makes the OCI image index: for every platform an image FROM
// scratch holding each of bins (static binaries) at /NAME (in l.Dir when
// set), one layer per binary, so that a change to one binary leaves the
// other layers as they were, and l.Symlinks in a layer of their own. The
// first binary is the entrypoint.
func Build(binDir string, bins []string, platforms []v1.Platform, l Layout) (v1.ImageIndex, error) {
	if len(bins) == 0 || len(platforms) == 0 {
		return nil, errors.New("no binaries or no platforms to build an image of")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		img, err := platformImage(binDir, bins, p, l)
		if err != nil {
			return nil, fmt.Errorf("%s image: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	return idx, nil
}

func platformImage(binDir string, bins []string, p v1.Platform, l Layout) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Created:      v1.Time{Time: epoch},
		OS:           p.OS,
		Architecture: p.Architecture,
		Variant:      p.Variant,
		Config:       v1.Config{Entrypoint: []string{"/" + l.dir() + bins[0]}},
	})
	if err != nil {
		return nil, err
	}
	for _, bin := range bins {
		layer, err := binaryLayer(binPath(binDir, p, bin), l.dir()+bin)
		if err != nil {
			return nil, err
		}
		if img, err = appendLayer(img, layer, "/"+l.dir()+bin); err != nil {
			return nil, err
		}
	}
	if len(l.Symlinks)+len(l.Files) > 0 {
		layer, err := rootLayer(l.Symlinks, l.Files)
		if err != nil {
			return nil, err
		}
		if img, err = appendLayer(img, layer, "files and symlinks"); err != nil {
			return nil, err
		}
	}
	return img, nil
}

func appendLayer(img v1.Image, layer v1.Layer, what string) (v1.Image, error) {
	return mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "build/image: " + what},
	})
}

// binaryLayer is a layer of one file, name (a path without the leading
// /), with mode 0755 and owner root, and the directories above it.
func binaryLayer(file, name string) (v1.Layer, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w (build the binaries first: make image does)", err)
	}
	return tarLayer(func(tw *tar.Writer) error {
		if err := writeParents(tw, name); err != nil {
			return err
		}
		if err := tw.WriteHeader(header(tar.TypeReg, name, 0o755, int64(len(data)))); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	})
}

// rootLayer is a layer of the symlinks (path in the image -> target) and
// files (path in the image -> file to copy), each in the order of their
// paths so that the layer's digest is stable.
func rootLayer(links, files map[string]string) (v1.Layer, error) {
	return tarLayer(func(tw *tar.Writer) error {
		for _, n := range sortedKeys(files) {
			name := strings.Trim(path.Clean("/"+n), "/")
			data, err := os.ReadFile(files[n])
			if err != nil || name == "" {
				return fmt.Errorf("file %q in the image from %q: want PATH=FILE (%v)", n, files[n], err)
			}
			if err := writeParents(tw, name); err != nil {
				return err
			}
			if err := tw.WriteHeader(header(tar.TypeReg, name, 0o644, int64(len(data)))); err != nil {
				return err
			}
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
		for _, n := range sortedKeys(links) {
			name := strings.Trim(path.Clean("/"+n), "/")
			if name == "" || links[n] == "" {
				return fmt.Errorf("symlink %q -> %q: want PATH=TARGET, neither empty nor /", n, links[n])
			}
			if err := writeParents(tw, name); err != nil {
				return err
			}
			h := header(tar.TypeSymlink, name, 0o777, 0)
			h.Linkname = links[n]
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeParents writes the directories above name (mode 0755), as a
// distribution's layers have them, so that no runtime has to guess.
func writeParents(tw *tar.Writer, name string) error {
	dirs := strings.Split(name, "/")
	for i := 1; i < len(dirs); i++ {
		if err := tw.WriteHeader(header(tar.TypeDir, strings.Join(dirs[:i], "/")+"/", 0o755, 0)); err != nil {
			return err
		}
	}
	return nil
}

func header(typ byte, name string, mode, size int64) *tar.Header {
	return &tar.Header{Typeflag: typ, Name: name, Mode: mode, Size: size, ModTime: epoch, Format: tar.FormatPAX}
}

// tarLayer is a gzip-compressed OCI layer of the tar that write writes.
func tarLayer(write func(*tar.Writer) error) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := write(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerTar := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithCompressedCaching)
}

// WriteLayout writes the index to dir as an OCI image layout whose
// index.json names it ref (org.opencontainers.image.ref.name), replacing
// what dir held.
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
	}))
}

// ReadLayout returns the image index WriteLayout wrote to dir.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI layout (run make image first): %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("%s/index.json should name one image index, as make image writes it", dir)
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

// Push uploads the index, its images and their layers to ref (a tag or a
// repository) and returns the reference by digest that a DaemonSet can pin.
// Credentials come from the Docker config (~/.docker/config.json,
// credential helpers), as docker and crane find them.
func Push(ctx context.Context, idx v1.ImageIndex, ref string) (name.Digest, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return name.Digest{}, err
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return name.Digest{}, fmt.Errorf("push to %s: %w", r, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	return r.Context().Digest(d.String()), nil
}

// describe is one line per platform: digest and size, compressed as pulled.
func describe(idx v1.ImageIndex) (string, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "index %s\n", d)
	for _, desc := range m.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return "", err
		}
		layers, err := img.Layers()
		if err != nil {
			return "", err
		}
		var size int64
		for _, l := range layers {
			s, err := l.Size()
			if err != nil {
				return "", err
			}
			size += s
		}
		fmt.Fprintf(&b, "  %-12s %s  %.1f MiB compressed, %d layer(s)\n", desc.Platform, desc.Digest, float64(size)/(1<<20), len(layers))
	}
	return b.String(), nil
}
