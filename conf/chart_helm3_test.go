package conf

import (
	"errors"
	"fmt"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"

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
