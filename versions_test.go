package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/internal/versions"
)

// readVersions parses versions.env.
func readVersions(t *testing.T) map[string]string {
	t.Helper()
	v, err := versions.Read("versions.env")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// valuesOf are the versions the file names for a component: KEY, and
// KEY's oldest supported one when the suite runs two (KUBERNETES_VERSION,
// KUBERNETES_OLDEST_VERSION).
func valuesOf(v map[string]string, key string) []string {
	var out []string
	for _, k := range []string{key, strings.TrimSuffix(key, "_VERSION") + "_OLDEST_VERSION"} {
		if v[k] != "" {
			out = append(out, v[k])
		}
	}
	return out
}

type requirement struct {
	Path     string
	Version  string
	Indirect bool
}

// requirements are a go.mod's requirements, as `go mod edit -json` reads
// them (no network).
func requirements(t *testing.T, gomod string) []requirement {
	t.Helper()
	out, err := exec.Command("go", "mod", "edit", "-json", gomod).Output()
	if err != nil {
		t.Fatalf("go mod edit -json %s: %v", gomod, err)
	}
	var m struct{ Require []requirement }
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("%s: %v", gomod, err)
	}
	return m.Require
}

// goMods are the repository's go.mod files.
func goMods(t *testing.T) []string {
	t.Helper()
	var mods []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" {
			mods = append(mods, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

// The build modules of scripts/k8s build what versions.env names: one
// module per Kubernetes version the suite runs, requiring it, and etcd,
// Multus, helm and runc at the file's versions (build.sh stops on a mismatch
// too, but only when it runs).
func TestVersionsBuildModules(t *testing.T) {
	v := readVersions(t)
	tools := map[string]string{ // module directory -> what it builds
		"scripts/k8s/etcd":   "go.etcd.io/etcd/server/v3",
		"scripts/k8s/multus": "gopkg.in/k8snetworkplumbingwg/multus-cni.v4",
		"scripts/k8s/helm":   "helm.sh/helm/v3",
		"scripts/k8s/runc":   "github.com/opencontainers/runc",
		"scripts/k8s/promop": "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring",
	}
	keys := map[string]string{
		"go.etcd.io/etcd/server/v3":                   "ETCD_VERSION",
		"gopkg.in/k8snetworkplumbingwg/multus-cni.v4": "MULTUS_VERSION",
		"helm.sh/helm/v3":                             "HELM_VERSION",
		"github.com/opencontainers/runc":              "RUNC_VERSION",
		"github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring": "PROMETHEUS_OPERATOR_VERSION",
	}
	kubeMods, err := filepath.Glob("scripts/k8s/kube*/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]string{} // Kubernetes version -> its module
	for _, gomod := range kubeMods {
		for _, r := range requirements(t, gomod) {
			if r.Path != "k8s.io/kubernetes" {
				continue
			}
			if !slices.Contains(valuesOf(v, "KUBERNETES_VERSION"), r.Version) {
				t.Errorf("%s requires k8s.io/kubernetes %s, which versions.env does not name (%v)", gomod, r.Version, valuesOf(v, "KUBERNETES_VERSION"))
			}
			built[r.Version] = gomod
		}
	}
	for _, want := range valuesOf(v, "KUBERNETES_VERSION") {
		if built[want] == "" {
			t.Errorf("versions.env names Kubernetes %s, and no scripts/k8s/kube*/go.mod requires it (build.sh could not build it)", want)
		}
	}
	// Prometheus vX.Y.Z is its module's v0.X0Y.Z.
	tools["scripts/k8s/prometheus"] = "github.com/prometheus/prometheus"
	keys["github.com/prometheus/prometheus"] = "PROMETHEUS_VERSION"
	moduleVersion := map[string]func(string) string{"github.com/prometheus/prometheus": prometheusModule}
	for dir, mod := range tools {
		found := false
		for _, r := range requirements(t, filepath.Join(dir, "go.mod")) {
			if r.Path == mod {
				found = true
				want := v[keys[mod]]
				if f := moduleVersion[mod]; f != nil {
					want = f(want)
				}
				if r.Version != want {
					t.Errorf("%s/go.mod requires %s %s, versions.env says %s=%s", dir, mod, r.Version, keys[mod], want)
				}
			}
		}
		if !found {
			t.Errorf("%s/go.mod does not require %s", dir, mod)
		}
	}
}

// prometheusModule is the Go module version of Prometheus release v
// (vX.Y.Z: v0.X0Y.Z, as scripts/k8s/build.sh's prom_module), "" if v is
// not a release.
func prometheusModule(v string) string {
	var maj, min, patch int
	if n, err := fmt.Sscanf(v, "v%d.%d.%d", &maj, &min, &patch); n != 3 || err != nil {
		return ""
	}
	return fmt.Sprintf("v0.%d%02d.%d", maj, min, patch)
}

func TestPrometheusModule(t *testing.T) {
	for v, want := range map[string]string{"v3.16.0": "v0.316.0", "v3.5.2": "v0.305.2", "3.16": ""} {
		if got := prometheusModule(v); got != want {
			t.Errorf("prometheusModule(%q) = %q, want %q", v, got, want)
		}
	}
}

// Every go.mod that requires directly a component versions.env names
// requires the file's version: the plugin's libraries (the CNI library and
// plugins, NRI), Multus in e2e/multus, helm in conf, and the Kubernetes
// client libraries the suites talk to the cluster with (e2e/k8s, e2e/cri)
// at the release of the node's Kubernetes.
func TestVersionsGoModules(t *testing.T) {
	v := readVersions(t)
	keys := map[string]string{
		"github.com/containernetworking/cni":          "CNI_VERSION",
		"github.com/containernetworking/plugins":      "CNI_PLUGINS_VERSION",
		"github.com/containerd/nri":                   "NRI_VERSION",
		"gopkg.in/k8snetworkplumbingwg/multus-cni.v4": "MULTUS_VERSION",
		"helm.sh/helm/v3":                             "HELM_VERSION",
		"helm.sh/helm/v4":                             "HELM_SDK_VERSION",
	}
	// The client libraries are published as v0.MINOR.PATCH of the release.
	client := "v0." + strings.TrimPrefix(v["KUBERNETES_VERSION"], "v1.")
	clientMods := map[string]bool{"e2e/k8s/go.mod": true, "e2e/cri/go.mod": true}
	staging := regexp.MustCompile(`^k8s\.io/(api|apimachinery|client-go|cri-api|kubelet)$`)
	seen := map[string]bool{}
	for _, gomod := range goMods(t) {
		for _, r := range requirements(t, gomod) {
			if r.Indirect {
				continue
			}
			if key, ok := keys[r.Path]; ok {
				seen[r.Path] = true
				if r.Version != v[key] {
					t.Errorf("%s requires %s %s, versions.env says %s=%s", gomod, r.Path, r.Version, key, v[key])
				}
			}
			if clientMods[filepath.ToSlash(gomod)] && staging.MatchString(r.Path) && r.Version != client {
				t.Errorf("%s requires %s %s, want %s (the client of KUBERNETES_VERSION=%s)", gomod, r.Path, r.Version, client, v["KUBERNETES_VERSION"])
			}
		}
	}
	for mod, key := range keys {
		if !seen[mod] {
			t.Errorf("no go.mod requires %s directly: versions.env's %s names nothing", mod, key)
		}
	}
}

// versionClaim is a component's name followed closely by a version, as
// docs and comments write one: "Kubernetes v1.37.2", "containerd
// **v2.4.2**", "Multus (v4.3.0". The alternatives are tried in order, so
// "containerd/nri v0.12.5" is NRI's.
var versionClaim = regexp.MustCompile(`(?i)\b(prometheus-operator|prometheus|containerd/nri|nri|kubernetes|kubelet|kubectl|kube-apiserver|containerd|multus|etcd|helm|containernetworking/plugins|cni plugins|host-device|host-local|ptp|containernetworking/cni|cnitool|open mpi|openmpi|ucx)\b[^\n\d]{0,12}?\bv?(\d+(?:\.\d+)+)`)

// claimKeys are the versions.env entries a component's claim may name.
var claimKeys = map[string][]string{
	"prometheus-operator":         {"PROMETHEUS_OPERATOR_VERSION"},
	"prometheus":                  {"PROMETHEUS_VERSION", "PROMTOOL_VERSION"},
	"containerd/nri":              {"NRI_VERSION"},
	"nri":                         {"NRI_VERSION"},
	"kubernetes":                  {"KUBERNETES_VERSION"},
	"kubelet":                     {"KUBERNETES_VERSION"},
	"kubectl":                     {"KUBERNETES_VERSION"},
	"kube-apiserver":              {"KUBERNETES_VERSION"},
	"containerd":                  {"CONTAINERD_VERSION"},
	"multus":                      {"MULTUS_VERSION"},
	"etcd":                        {"ETCD_VERSION"},
	"helm":                        {"HELM_VERSION", "HELM_SDK_VERSION"},
	"containernetworking/plugins": {"CNI_PLUGINS_VERSION"},
	"cni plugins":                 {"CNI_PLUGINS_VERSION"},
	"host-device":                 {"CNI_PLUGINS_VERSION"},
	"host-local":                  {"CNI_PLUGINS_VERSION"},
	"ptp":                         {"CNI_PLUGINS_VERSION"},
	"containernetworking/cni":     {"CNI_VERSION"},
	"cnitool":                     {"CNI_VERSION"},
	"open mpi":                    {"OPENMPI_VERSION"},
	"openmpi":                     {"OPENMPI_VERSION"},
	"ucx":                         {"UCX_VERSION"},
}

// claims are the version claims of one text. A figure measured on an
// earlier version says so ("measured under containerd 2.2.1"): what
// follows "measured" in a line is history, not a claim.
func claims(text string) [][2]string {
	var out [][2]string
	if i := strings.Index(strings.ToLower(text), "measured"); i >= 0 {
		text = text[:i]
	}
	for _, m := range versionClaim.FindAllStringSubmatch(text, -1) {
		if strings.Count(m[2], ".") != 2 {
			continue // "containerd 2.3", an address
		}
		out = append(out, [2]string{strings.ToLower(m[1]), m[2]})
	}
	return out
}

func TestVersionClaimPattern(t *testing.T) {
	for text, want := range map[string][][2]string{
		"Tested on Kubernetes v1.37.2 with Multus v4.3.0 (thick)":      {{"kubernetes", "1.37.2"}, {"multus", "4.3.0"}},
		"under containerd **v2.4.2** with":                             {{"containerd", "2.4.2"}},
		"built against containerd/nri v0.12.5":                         {{"containerd/nri", "0.12.5"}},
		"Multus (v4.3.0, tested in e2e/multus)":                        {{"multus", "4.3.0"}},
		"kubelet v1.37.2, containerd 2.4.2, runc 1.1.5":                {{"kubelet", "1.37.2"}, {"containerd", "2.4.2"}},
		"Kubernetes 1.35 to 1.37, containerd 2.3 LTS":                  nil,
		"CNI networks with `cniVersion` 1.1.0":                         nil,
		"Kubernetes v1.37.2 (figures measured under containerd 2.2.1)": {{"kubernetes", "1.37.2"}},
		"ptp and host-local, 10.244.0.0/24":                            nil,
		"Prometheus v3.16.0 and the prometheus-operator v0.95.2":       {{"prometheus", "3.16.0"}, {"prometheus-operator", "0.95.2"}},
		"Open MPI 4.1.4 with UCX 1.13.1, openmpi-bin_4.1.4-3+b1":       {{"open mpi", "4.1.4"}, {"ucx", "1.13.1"}},
	} {
		if got := claims(text); !slices.Equal(got, want) {
			t.Errorf("claims(%q) = %v, want %v", text, got, want)
		}
	}
}

// Every version the README, docs/ and the rest of the tree claim for a
// component (in prose, comments or scripts) is one versions.env names:
// a bump that misses a line fails here. go.mod and go.sum are
// TestVersionsGoModules'.
func TestVersionClaims(t *testing.T) {
	v := readVersions(t)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".go", ".sh", ".yaml", ".yml", ".conf", ".toml", ".txt", "":
		default:
			return nil
		}
		if d.Name() == "go.mod" || d.Name() == "go.sum" || path == "versions_test.go" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil || slices.Contains(data, 0) {
			return err
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, c := range claims(line) {
				var vals []string
				for _, key := range claimKeys[c[0]] {
					vals = append(vals, valuesOf(v, key)...)
				}
				if c[0] == "prometheus" { // its Go module's version too
					vals = append(vals, prometheusModule(v["PROMETHEUS_VERSION"]))
				}
				if !slices.ContainsFunc(vals, func(s string) bool { return strings.TrimPrefix(s, "v") == c[1] }) {
					t.Errorf("%s:%d: says %s %s, versions.env says %v (%s):\n\t%s", path, i+1, c[0], c[1], vals, strings.Join(claimKeys[c[0]], ", "), strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The modules that build on Kubernetes' client libraries (the chart's and
// manifests' checks in conf, the DRA driver, the Kubernetes and CRI
// suites) select one version of every module two of them use. Go's build
// cache then compiles k8s.io/api, client-go and what they import once for
// all of them: a package compiled against another version of any
// dependency is compiled again. Cold, go vet of the four took 679 s of CPU
// with seven shared modules apart (client-go v0.37.1 in conf, x/net at four
// versions) and 438 s aligned (2026-11-29), on a machine whose two cores
// build the Kubernetes cluster beside it before the first node boots.
// e2e/multus keeps the versions Multus's release requires; the root module
// (the CNI binary) its own few.
func TestSharedBuildModules(t *testing.T) {
	mods := []string{"conf/go.mod", "cmd/rdma-netns-dra/go.mod", "e2e/k8s/go.mod", "e2e/cri/go.mod"}
	type seen struct{ gomod, version string }
	first := map[string]seen{} // by module path
	for _, gomod := range mods {
		for _, r := range requirements(t, gomod) {
			if strings.HasPrefix(r.Path, "github.com/rdma-netns/") {
				continue
			}
			prev, ok := first[r.Path]
			if !ok {
				first[r.Path] = seen{gomod, r.Version}
				continue
			}
			if prev.version != r.Version {
				t.Errorf("%s requires %s %s, %s %s: select one version in both (go get %s@<the higher> in the other), or every package on it is compiled twice", gomod, r.Path, r.Version, prev.gomod, prev.version, r.Path)
			}
		}
	}
}
