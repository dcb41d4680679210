// Command manifests writes the files of conf/ that are the Helm chart
// conf/helm/rdma-netns rendered (make manifests): daemonset.yaml with the
// chart's default values, exporter-servicemonitor.yaml with the
// ServiceMonitor turned on. The conf tests fail when they differ from the
// chart, so the chart is the one source.
//
// Usage, in conf/: go run ./cmd/manifests [-check]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/rdma-netns/rdma-netns/conf/helmchart"
)

func main() {
	check := flag.Bool("check", false, "only report the files that differ from the chart; exit 1 if any")
	flag.Parse()
	files, err := helmchart.Manifests(helmchart.ChartDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifests: %v\n", err)
		os.Exit(1)
	}
	stale := 0
	for _, f := range files {
		old, _ := os.ReadFile(f.Name)
		if string(old) == f.Data {
			continue
		}
		if *check {
			fmt.Fprintf(os.Stderr, "manifests: %s differs from the chart %s: run make manifests\n", f.Name, helmchart.ChartDir)
			stale++
			continue
		}
		if err := os.WriteFile(f.Name, []byte(f.Data), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "manifests: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s\n", f.Name)
	}
	if stale > 0 {
		os.Exit(1)
	}
}
