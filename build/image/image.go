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
	"path/filepath"
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

// Build makes the OCI image index: for every platform an image FROM
// scratch holding each of bins (static binaries) at /NAME, one layer per
// binary, so that a change to one binary leaves the other layers as they
// were. The first binary is the entrypoint.
func Build(binDir string, bins []string, platforms []v1.Platform) (v1.ImageIndex, error) {
	if len(bins) == 0 || len(platforms) == 0 {
		return nil, errors.New("no binaries or no platforms to build an image of")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		img, err := platformImage(binDir, bins, p)
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

func platformImage(binDir string, bins []string, p v1.Platform) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Created:      v1.Time{Time: epoch},
		OS:           p.OS,
		Architecture: p.Architecture,
		Variant:      p.Variant,
		Config:       v1.Config{Entrypoint: []string{"/" + bins[0]}},
	})
	if err != nil {
		return nil, err
	}
	for _, bin := range bins {
		layer, err := binaryLayer(binPath(binDir, p, bin), bin)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   layer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "build/image: /" + bin},
		})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// binaryLayer is a layer of one file, /name, with mode 0755 and owner root.
func binaryLayer(path, name string) (v1.Layer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w (build the binaries first: make image does)", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o755,
		Size:     int64(len(data)),
		ModTime:  epoch,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
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
