package handlernet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// conf/containerd's first handler reads as the network its conflist
// describes.
func TestReadConfContainerd(t *testing.T) {
	n, err := Read("../../conf/containerd/rdma-eth1.d")
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "rdma-eth1" || n.CNIVersion != "1.1.0" || n.Device != "eth1" || !slices.Equal(n.Addresses, []string{"10.100.200.11/24"}) || !n.RdmaNetns {
		t.Fatalf("read %+v", n)
	}
}

// A handler loads only the first conflist it finds, so a directory with
// none or two is refused, as is a conflist libcni would not load.
func TestReadRefuses(t *testing.T) {
	conflist := `{"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "host-device", "device": "eth1"}]}`
	for name, files := range map[string]map[string]string{
		"none":         {},
		"two":          {"a.conflist": conflist, "b.conflist": conflist},
		"no name":      {"a.conflist": strings.Replace(conflist, `"name": "n", `, "", 1)},
		"not json":     {"a.conflist": "{"},
		"device typed": {"a.conflist": strings.Replace(conflist, `"eth1"`, `1`, 1)},
	} {
		dir := t.TempDir()
		for f, data := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := Read(dir); err == nil {
			t.Errorf("%s: read %+v, want an error", name, n)
		}
	}
}
