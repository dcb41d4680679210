// Package helmchart renders and lints the rdma-netns Helm chart
// (conf/helm/rdma-netns) with the Helm 4 SDK, the way `helm template` and
// `helm lint` do, so that conf/daemonset.yaml can be generated from the
// chart and the tests can check what each value renders.
package helmchart

import (
	"errors"
	"fmt"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
)

// The release conf/daemonset.yaml is rendered as: the DaemonSet belongs in
// kube-system (system-node-critical), and a release named after the chart
// keeps the DaemonSet's name rdma-netns.
const (
	ReleaseName = "rdma-netns"
	Namespace   = "kube-system"
)

// KubeVersion is the Kubernetes version Render and Lint render for, as
// `helm template --kube-version` (the chart's kubeVersion is checked
// against it); "" leaves Helm's default, the release of the client-go it
// was built with (v1.20 in a test binary, so tests set it).
var KubeVersion string

// kubeVersion is KubeVersion parsed, nil when unset.
func kubeVersion() (*common.KubeVersion, error) {
	if KubeVersion == "" {
		return nil, nil
	}
	return common.ParseKubeVersion(KubeVersion)
}

// Render renders the chart in dir with vals over its defaults, as
// `helm template --namespace kube-system rdma-netns DIR` would (the values
// schema is enforced), and returns the manifest: YAML documents each
// headed by "# Source: rdma-netns/templates/FILE".
func Render(dir string, vals map[string]any) (string, error) {
	return RenderRelease(dir, ReleaseName, Namespace, vals)
}

// RenderRelease is Render for the release name in namespace.
func RenderRelease(dir, name, namespace string, vals map[string]any) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load the chart %s: %w", dir, err)
	}
	kv, err := kubeVersion()
	if err != nil {
		return "", err
	}
	install := action.NewInstall(action.NewConfiguration())
	install.KubeVersion = kv
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true // no release store to check the name against
	install.ReleaseName = name
	install.Namespace = namespace
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", fmt.Errorf("render the chart %s: %w", dir, err)
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return "", fmt.Errorf("render the chart %s: a release of type %T", dir, rel)
	}
	return r.Manifest, nil
}

// Lint runs `helm lint` on the chart in dir with vals, and returns its
// findings of severity warning and above (info, such as a missing icon,
// is not a finding).
func Lint(dir string, vals map[string]any) error {
	kv, err := kubeVersion()
	if err != nil {
		return err
	}
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = Namespace
	lint.KubeVersion = kv
	res := lint.Run([]string{dir}, vals)
	if res.TotalChartsLinted != 1 && len(res.Errors) == 0 {
		return fmt.Errorf("helm lint %s: linted %d charts", dir, res.TotalChartsLinted)
	}
	return errors.Join(res.Errors...)
}

// Documents splits a rendered manifest by the template each document
// came from: template file name (e.g. "daemonset.yaml") to its
// documents, each starting with its "# Source:" line.
func Documents(manifest string) map[string][]string {
	docs := map[string][]string{}
	for _, doc := range strings.Split(manifest, "\n---\n") {
		doc = strings.TrimPrefix(strings.TrimSpace(doc), "---\n")
		src, _, _ := strings.Cut(doc, "\n")
		if !strings.HasPrefix(src, "# Source: ") {
			continue
		}
		file := src[strings.LastIndex(src, "/")+1:]
		docs[file] = append(docs[file], doc)
	}
	return docs
}
