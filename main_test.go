package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/config"
)

// The binary a runtime executes answers VERSION with every supported
// version, and explains itself when run without CNI_COMMAND.
func TestBinaryVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "rdma-netns")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	var info struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("VERSION output %q: %v", out, err)
	}
	if strings.Join(info.SupportedVersions, ",") != strings.Join(config.SupportedVersions, ",") {
		t.Fatalf("supported versions %v, want %v", info.SupportedVersions, config.SupportedVersions)
	}

	cmd = exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	about, _ := cmd.CombinedOutput()
	if !strings.Contains(string(about), "CNI rdma-netns plugin") || !strings.Contains(string(about), "1.1.0") {
		t.Fatalf("without CNI_COMMAND the binary says %q", about)
	}
}

// The CNI binary, executed at every pod start, links only what the CNI
// path needs: the exporter's client_golang and the NRI plugin's stub,
// ttrpc and protobuf live in their own binaries.
func TestBinaryLinksOnlyTheCNIPath(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/containerd/", "github.com/prometheus/", "google.golang.org/", "github.com/tetratelabs/", "github.com/sirupsen/", "/pkg/nriplugin", "/pkg/podadjust", "/pkg/exporter"} {
			if strings.Contains(pkg, banned) {
				t.Errorf("the CNI binary links %s", pkg)
			}
		}
	}
}
