package conf

import (
	"os"
	"testing"

	"github.com/rdma-netns/rdma-netns/conf/helmchart"
)

// The files of conf/ that come from the chart are what it renders now:
// the chart is their one source.
func TestGeneratedManifests(t *testing.T) {
	files, err := helmchart.Manifests(helmchart.ChartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		have, err := os.ReadFile(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		if string(have) != f.Data {
			t.Errorf("conf/%s differs from the chart %s rendered: run make manifests (edit the chart, not the file)", f.Name, helmchart.ChartDir)
		}
	}
}
