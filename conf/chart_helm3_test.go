package conf

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	kubefake "helm.sh/helm/v3/pkg/kube/fake"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"

	"github.com/rdma-netns/rdma-netns/conf/helmchart"
)

// renderHelm3 renders the chart as Helm 3's `helm template` does (a
// client-only dry-run install), for the same release as helmchart.Render.
func renderHelm3(dir string, vals map[string]any) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load the chart %s: %w", dir, err)
	}
	kv, err := chartutil.ParseKubeVersion(helmchart.KubeVersion)
	if err != nil {
		return "", err
	}
	install := action.NewInstall(&action.Configuration{})
	install.KubeVersion = kv
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = helmchart.ReleaseName
	install.Namespace = helmchart.Namespace
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", fmt.Errorf("render the chart %s: %w", dir, err)
	}
	return rel.Manifest, nil
}

// lintHelm3 is Helm 3's `helm lint --strict`.
func lintHelm3(dir string, vals map[string]any) error {
	kv, err := chartutil.ParseKubeVersion(helmchart.KubeVersion)
	if err != nil {
		return err
	}
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = helmchart.Namespace
	lint.KubeVersion = kv
	res := lint.Run([]string{dir}, vals)
	if res.TotalChartsLinted != 1 && len(res.Errors) == 0 {
		return fmt.Errorf("helm lint %s: linted %d charts", dir, res.TotalChartsLinted)
	}
	return errors.Join(res.Errors...)
}

// helm3Cluster is the chart and a Helm 3 action configuration whose
// releases live in memory and whose cluster runs versions.env's
// Kubernetes, for install, upgrade and rollback without an API server.
func helm3Cluster(t *testing.T) (*chart.Chart, *action.Configuration) {
	t.Helper()
	ch, err := loader.Load(helmchart.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := chartutil.ParseKubeVersion(helmchart.KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps := *chartutil.DefaultCapabilities
	caps.KubeVersion = *kv
	return ch, &action.Configuration{Releases: storage.Init(driver.NewMemory()), KubeClient: &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: &caps, Log: func(string, ...any) {}}
}

// An install with nri.maxShmSize null (an image older than the flag, as
// e2e-k8s's upgrade test installs) upgrades with helm 3's --reuse-values,
// which hands the null to the schema again, and the new image then runs
// with the plugin's own cap.
func TestChartUpgradeReusesNullShmCap(t *testing.T) {
	ch, cfg := helm3Cluster(t)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = helmchart.ReleaseName, helmchart.Namespace
	if _, err := install.Run(ch, values("image.tag", "old", "nri.maxShmSize", nil)); err != nil {
		t.Fatalf("install: %v", err)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace, upgrade.ReuseValues = helmchart.Namespace, true
	rel, err := upgrade.Run(helmchart.ReleaseName, ch, values("image.tag", "new"))
	if err != nil {
		t.Fatalf("upgrade --reuse-values: %v", err)
	}
	if !strings.Contains(rel.Manifest, "rdma-netns:new") || strings.Contains(rel.Manifest, "- --max-shm-size\n") {
		t.Errorf("upgraded manifest: want image tag new and no --max-shm-size:\n%s", rel.Manifest)
	}
}

// An install for an image older than the exporter's --auth (auth.enabled
// and cacheMaxAge null, as e2e-k8s's upgrade test installs) serves plain
// HTTP without RBAC; helm 3's upgrade --reuse-values to this build, which
// sets auth.enabled again, adds the ServiceAccount, its RBAC and --auth
// kubernetes.
func TestChartUpgradeTurnsExporterAuthOn(t *testing.T) {
	ch, cfg := helm3Cluster(t)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = helmchart.ReleaseName, helmchart.Namespace
	rel, err := install.Run(ch, values("image.tag", "old", "exporter.auth.enabled", nil, "exporter.cacheMaxAge", nil))
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	if strings.Contains(rel.Manifest, "- --auth") || strings.Contains(rel.Manifest, "- --cache-max-age") || strings.Contains(rel.Manifest, "kind: ClusterRole") {
		t.Errorf("install for an older image: want no --auth, --cache-max-age or RBAC:\n%s", rel.Manifest)
	}
	upgrade := action.NewUpgrade(cfg)
	upgrade.Namespace, upgrade.ReuseValues = helmchart.Namespace, true
	rel, err = upgrade.Run(helmchart.ReleaseName, ch, values("image.tag", "new", "exporter.auth.enabled", true, "exporter.cacheMaxAge", "2s"))
	if err != nil {
		t.Fatalf("upgrade --reuse-values: %v", err)
	}
	for _, want := range []string{"rdma-netns:new", "- --auth\n            - kubernetes\n", "- --cache-max-age\n            - 2s\n", "kind: ServiceAccount", "kind: ClusterRoleBinding"} {
		if !strings.Contains(rel.Manifest, want) {
			t.Errorf("upgraded manifest lacks %q:\n%s", want, rel.Manifest)
		}
	}
}
