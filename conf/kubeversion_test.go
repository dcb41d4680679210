package conf

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/conf/helmchart"
	"github.com/rdma-netns/rdma-netns/internal/versions"
)

// TestMain renders the chart for the Kubernetes the suite's node runs
// (../versions.env), as an operator's helm does for their cluster: Helm's
// default in a test binary (v1.20) is below the chart's kubeVersion.
func TestMain(m *testing.M) {
	v, err := kubernetesVersion("../versions.env")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helmchart.KubeVersion = v
	os.Exit(m.Run())
}

// kubernetesVersion is versions.env's KUBERNETES_VERSION.
func kubernetesVersion(file string) (string, error) {
	v, err := versions.Read(file)
	if err != nil {
		return "", err
	}
	if v["KUBERNETES_VERSION"] == "" {
		return "", fmt.Errorf("%s names no KUBERNETES_VERSION", file)
	}
	return v["KUBERNETES_VERSION"], nil
}

// The chart installs on the oldest Kubernetes still supported (1.35) and
// later, and refuses an older cluster with a message saying why, in Helm
// 4 and Helm 3 alike (`helm install` checks the cluster's version as
// these renders check the one they are given).
func TestChartKubeVersion(t *testing.T) {
	defer func(v string) { helmchart.KubeVersion = v }(helmchart.KubeVersion)
	for _, tc := range []struct {
		kube string
		ok   bool
	}{
		{"v1.34.9", false},
		{"v1.35.0", true},
		{helmchart.KubeVersion, true},
	} {
		helmchart.KubeVersion = tc.kube
		for helm, render := range map[string]func(string, map[string]any) (string, error){"helm 4": helmchart.Render, "helm 3": renderHelm3} {
			_, err := render(helmchart.ChartDir, nil)
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s, Kubernetes %s: %v", helm, tc.kube, err)
			case !tc.ok && err == nil:
				t.Errorf("%s, Kubernetes %s: rendered, want refused", helm, tc.kube)
			case !tc.ok && !strings.Contains(err.Error(), "chart requires kubeVersion: >=1.35.0-0 which is incompatible with Kubernetes "+tc.kube):
				t.Errorf("%s, Kubernetes %s: %v, want it to say the chart requires >=1.35.0-0", helm, tc.kube, err)
			}
		}
	}
}
