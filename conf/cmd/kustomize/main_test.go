package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The suites' overlays take conf/'s examples from the directory above
// them, and Multus's overlay puts its ServiceAccount after the
// DaemonSet that runs as it: render must take files outside the overlay
// (kubectl's --load-restrictor LoadRestrictionsNone) and print the
// account first (kubectl's legacy order), or the payload's manifests
// differ from what kubectl rendered.
func TestRenderAsKubectl(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("example.yaml", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: ds\nspec:\n  template:\n    spec:\n      serviceAccountName: sa\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n")
	write("overlay/kustomization.yaml", "resources:\n- ../example.yaml\nnamespace: kube-system\n")
	out, err := render(filepath.Join(dir, "overlay"))
	if err != nil {
		t.Fatalf("render with the example outside the overlay: %v", err)
	}
	s := string(out)
	sa, ds := strings.Index(s, "kind: ServiceAccount"), strings.Index(s, "kind: DaemonSet")
	if sa < 0 || ds < 0 || sa > ds {
		t.Errorf("rendered:\n%s\nwant the ServiceAccount before the DaemonSet (kubectl kustomize's legacy order)", s)
	}
	if strings.Count(s, "namespace: kube-system") != 2 {
		t.Errorf("rendered:\n%s\nwant both objects in the overlay's namespace", s)
	}
	if _, err := render(filepath.Join(dir, "missing")); err == nil {
		t.Error("render of a directory without a kustomization: no error")
	}
}
