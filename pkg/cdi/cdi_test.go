package cdi

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var node = Node{Name: "uverbs0", Major: 231, Minor: 192}

// RemoveDevice and Remove take exactly what they name, again without
// error; Sweep removes the specs of claims without a record and leaves
// every other file of the directory (the node's other CDI specs).
func TestRemoveAndSweep(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	for _, w := range [][2]string{{"a", "pci-1"}, {"a", "pci-2"}, {"b", "pci-3"}, {"c", "pci-4"}, {"d", "pci-5"}} {
		if err := d.Write(w[0], w[1], node, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(d.Path, "nvidia.com_gpu.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := d.RemoveDevice("a", "pci-1"); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove("d"); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := d.Sweep(map[string]bool{"a": true, "b": true})
	if err != nil || !reflect.DeepEqual(gone, []string{"c"}) {
		t.Fatalf("Sweep = %v, %v; want [c]", gone, err)
	}
	ents, _ := os.ReadDir(d.Path)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"nic.rdma-netns.io_nic_a_pci-2.json", "nic.rdma-netns.io_nic_b_pci-3.json", "nvidia.com_gpu.json"}; !reflect.DeepEqual(names, want) {
		t.Errorf("left %v, want %v", names, want)
	}
}

// Names that would leave the directory, or a node that is not a verbs
// node, are refused and nothing is written.
func TestWriteRefuses(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	for _, tc := range []struct {
		uid, dev string
		n        Node
	}{
		{"../x", "pci-1", node}, {"a", "pci/1", node}, {"", "pci-1", node}, {"a", ".hidden", node},
		{"a", "pci-1", Node{Name: "../uverbs0"}}, {"a", "pci-1", Node{Name: "umad0"}},
	} {
		if err := d.Write(tc.uid, tc.dev, tc.n, nil); err == nil {
			t.Errorf("Write(%q, %q, %q): no error", tc.uid, tc.dev, tc.n.Name)
		}
	}
	if ents, _ := os.ReadDir(d.Path); len(ents) != 0 {
		t.Errorf("left %d files", len(ents))
	}
}
