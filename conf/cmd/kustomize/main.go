// Command kustomize prints a kustomization rendered as `kubectl kustomize
// --load-restrictor LoadRestrictionsNone DIR` prints it, with the
// kustomize module conf/ already renders the overlays with in its tests
// (overlays_test.go). scripts/k8s/payload.sh renders the suites'
// overlays with it: the cluster's build then needs no kubectl, whose 194
// packages of its own (kubectl's commands, kustomize) were built for
// this alone.
//
// Usage, in conf/: go run ./cmd/kustomize DIR
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kustomize DIR (a directory with a kustomization.yaml)")
		os.Exit(2)
	}
	out, err := render(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "kustomize %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}

// render is the kustomization in dir as YAML, files outside dir allowed
// (the suites' overlays take conf/'s examples from beside them).
func render(dir string) ([]byte, error) {
	o := krusty.MakeDefaultOptions()
	o.LoadRestrictions = types.LoadRestrictionsNone
	// As kubectl without --reorder: the kustomization's sortOptions, or
	// else the legacy order (namespaces and accounts before workloads).
	o.Reorder = krusty.ReorderOptionUnspecified
	m, err := krusty.MakeKustomizer(o).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}
