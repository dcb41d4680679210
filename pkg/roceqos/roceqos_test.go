package roceqos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeConfigfs lays out rdma_cm's configfs as the kernel does once a group
// exists for dev: ports/<n>/default_roce_tos.
func fakeConfigfs(t *testing.T, dev string, ports ...string) {
	t.Helper()
	root := t.TempDir()
	old := ConfigfsRoot
	ConfigfsRoot = root
	t.Cleanup(func() { ConfigfsRoot = old })
	for _, p := range ports {
		dir := filepath.Join(root, "rdma_cm", dev, "ports", p)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "default_roce_tos"), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func intp(v int) *int { return &v }

func TestApplyToSOnEveryPort(t *testing.T) {
	fakeConfigfs(t, "mlx5_0", "1", "2")
	if err := Apply("", "mlx5_0", Settings{ToS: intp(106)}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"1", "2"} {
		data, _ := os.ReadFile(filepath.Join(ConfigfsRoot, "rdma_cm", "mlx5_0", "ports", p, "default_roce_tos"))
		if strings.TrimSpace(string(data)) != "106" {
			t.Fatalf("port %s ToS = %q, want 106", p, data)
		}
	}
}

func TestVerifyNamesThePortThatDiffers(t *testing.T) {
	fakeConfigfs(t, "irdma0", "1")
	err := Verify("", "irdma0", Settings{ToS: intp(106)})
	if err == nil || !strings.Contains(err.Error(), "irdma0 port 1 is 0, want 106") {
		t.Fatalf("Verify = %v", err)
	}
}

func TestNoGroupForUnknownDevice(t *testing.T) {
	fakeConfigfs(t, "mlx5_0", "1")
	// A real configfs refuses mkdir for an unknown device; here the group
	// is created empty, which must still be reported, not ignored.
	err := Apply("", "nosuch0", Settings{ToS: intp(1)})
	if err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Fatalf("Apply on unknown device = %v", err)
	}
}

func TestRemoveIsIdempotent(t *testing.T) {
	fakeConfigfs(t, "mlx5_0")
	os.MkdirAll(filepath.Join(ConfigfsRoot, "rdma_cm", "mlx5_0"), 0o755)
	for i := 0; i < 2; i++ {
		if err := Remove("mlx5_0"); err != nil {
			t.Fatalf("Remove %d: %v", i, err)
		}
	}
}

func TestReadIntFormats(t *testing.T) {
	dir := t.TempDir()
	for in, want := range map[string]int{"106\n": 106, "Global tclass=3\n": 3, "0": 0} {
		f := filepath.Join(dir, "v")
		os.WriteFile(f, []byte(in), 0o644)
		got, err := readInt(f)
		if err != nil || got != want {
			t.Fatalf("readInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestTrafficClassUnsupportedMessage(t *testing.T) {
	_, err := tcFiles(t.TempDir(), "rxe0")
	if err == nil || !strings.Contains(err.Error(), "exposes no traffic class") || !strings.Contains(err.Error(), "rdmaQoS.tc") {
		t.Fatalf("tcFiles = %v", err)
	}
}
