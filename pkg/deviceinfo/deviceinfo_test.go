package deviceinfo

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func readDoc(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s is not valid JSON: %v\n%s", path, err, data)
	}
	return doc
}

// assertOnlyFile fails when anything but path (a temp file, say) is left in
// path's directory.
func assertOnlyFile(t *testing.T, path string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != filepath.Base(path) {
		t.Errorf("directory holds %v, want only %s", names, filepath.Base(path))
	}
}

func TestWriteCreatesNewFile(t *testing.T) {
	// Parent directories do not exist yet, as on a node where no device
	// plugin wrote device-info before.
	path := filepath.Join(t.TempDir(), "devinfo", "cni", "rdma-net-abc-net1.json")
	if err := Write(path, "0000:3b:00.2", "mlx5_3"); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type":    "pci",
		"version": "1.1.0",
		"pci": map[string]any{
			"pci-address": "0000:3b:00.2",
			"rdma-device": "mlx5_3",
		},
	}
	if got := readDoc(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("device-info = %#v, want %#v", got, want)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, err %v; want 0644 so the runtime can read it", st.Mode(), err)
	}
	assertOnlyFile(t, path)
}

func TestWriteWithoutPCIAddress(t *testing.T) {
	// An auxiliary (SF) device has no PCI address of its own: the field is
	// left out rather than written empty.
	path := filepath.Join(t.TempDir(), "x.json")
	if err := Write(path, "", "mlx5_4"); err != nil {
		t.Fatal(err)
	}
	pci := readDoc(t, path)["pci"].(map[string]any)
	if _, ok := pci["pci-address"]; ok {
		t.Errorf("pci-address written although none was given: %v", pci)
	}
	if pci["rdma-device"] != "mlx5_4" {
		t.Errorf("rdma-device = %v", pci["rdma-device"])
	}
}

func TestWriteExtendsDevicePluginFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sriov.json")
	// What the SR-IOV device plugin writes (with an extra unknown field).
	orig := `{"type":"pci","version":"1.0.0","pci":{"pci-address":"0000:3b:00.2","pf-pci-address":"0000:3b:00.0","vhost-net":"/dev/vhost-net","representor-device":"eth5"},"x-vendor":{"k":[1,2]}}`
	if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	// A different pciAddress must not overwrite the device plugin's.
	if err := Write(path, "0000:99:00.9", "mlx5_7"); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type":    "pci",
		"version": "1.0.0",
		"pci": map[string]any{
			"pci-address":        "0000:3b:00.2",
			"pf-pci-address":     "0000:3b:00.0",
			"vhost-net":          "/dev/vhost-net",
			"representor-device": "eth5",
			"rdma-device":        "mlx5_7",
		},
		"x-vendor": map[string]any{"k": []any{1.0, 2.0}},
	}
	if got := readDoc(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("device-info = %#v,\nwant %#v", got, want)
	}
	assertOnlyFile(t, path)

	// Writing again (a retried ADD) replaces rdma-device and keeps the rest.
	if err := Write(path, "", "rdma0"); err != nil {
		t.Fatal(err)
	}
	want["pci"].(map[string]any)["rdma-device"] = "rdma0"
	if got := readDoc(t, path); !reflect.DeepEqual(got, want) {
		t.Errorf("after second write = %#v,\nwant %#v", got, want)
	}
	assertOnlyFile(t, path)
}

func TestWriteFileWithoutTypeOrPCI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	if err := os.WriteFile(path, []byte(`{"note":"kept"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, "0000:01:00.0", "mlx5_0"); err != nil {
		t.Fatal(err)
	}
	got := readDoc(t, path)
	if got["note"] != "kept" || got["type"] != "pci" || got["version"] != SpecVersion {
		t.Errorf("device-info = %v", got)
	}
	if pci := got["pci"].(map[string]any); pci["pci-address"] != "0000:01:00.0" || pci["rdma-device"] != "mlx5_0" {
		t.Errorf("pci = %v", pci)
	}
}

func TestWriteRefusesNonPCI(t *testing.T) {
	for _, typ := range []string{`"vdpa"`, `"accelerator"`, `5`, `null`} {
		t.Run(typ, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.json")
			orig := `{"type":` + typ + `,"version":"1.1.0","vdpa":{"parent-device":"vdpa0"}}`
			if err := os.WriteFile(path, []byte(orig), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Write(path, "0000:01:00.0", "mlx5_0")
			if err == nil {
				t.Fatal("non-pci device-info file was extended")
			}
			if !strings.Contains(err.Error(), "only extends pci entries") || !strings.Contains(err.Error(), path) {
				t.Errorf("error %q should name the file and say only pci entries are extended", err)
			}
			if data, _ := os.ReadFile(path); string(data) != orig {
				t.Errorf("file changed to %s", data)
			}
			assertOnlyFile(t, path)
		})
	}
}

func TestWriteRefusesInvalidJSON(t *testing.T) {
	for _, content := range []string{``, `{`, `[1,2]`, `"pci"`, `{"type":"pci",}`} {
		t.Run(content, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.json")
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			err := Write(path, "0000:01:00.0", "mlx5_0")
			if err == nil || !strings.Contains(err.Error(), "is not valid JSON") {
				t.Fatalf("err = %v, want an invalid-JSON error", err)
			}
			if data, _ := os.ReadFile(path); string(data) != content {
				t.Errorf("file changed to %s", data)
			}
			assertOnlyFile(t, path)
		})
	}
}

// A file holding JSON null decodes to a nil map; writing must not panic.
func TestWriteNullFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	if err := os.WriteFile(path, []byte("null"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, "0000:01:00.0", "mlx5_0"); err != nil {
		t.Fatal(err)
	}
	got := readDoc(t, path)
	if got["type"] != "pci" || got["pci"].(map[string]any)["rdma-device"] != "mlx5_0" {
		t.Errorf("device-info = %v", got)
	}
}

func TestWriteUnreadablePath(t *testing.T) {
	// The path is a directory: reading it fails, and that is reported
	// rather than the directory being replaced.
	path := t.TempDir()
	err := Write(path, "0000:01:00.0", "mlx5_0")
	if err == nil || !strings.Contains(err.Error(), "failed to read device-info file") {
		t.Fatalf("err = %v", err)
	}
	if st, err := os.Stat(path); err != nil || !st.IsDir() {
		t.Errorf("directory disturbed: %v %v", st, err)
	}
}

func TestWriteParentIsFile(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "devinfo")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := Write(filepath.Join(blocker, "x.json"), "0000:01:00.0", "mlx5_0")
	if err == nil {
		t.Fatal("Write succeeded below a regular file")
	}
	assertOnlyFile(t, blocker)
}

// FuzzWrite feeds arbitrary existing device-info files to Write: it must not
// panic, and whatever it accepts must end up a pci entry naming the device,
// with no temp file left behind.
func FuzzWrite(f *testing.F) {
	for _, s := range []string{
		`{"type":"pci","version":"1.0.0","pci":{"pci-address":"0000:3b:00.2"}}`,
		`{"type":"vdpa"}`,
		`{"pci":"x"}`,
		`null`,
		`{}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, existing []byte) {
		path := filepath.Join(t.TempDir(), "x.json")
		if err := os.WriteFile(path, existing, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := Write(path, "0000:01:00.0", "mlx5_0"); err != nil {
			if data, _ := os.ReadFile(path); string(data) != string(existing) {
				t.Fatalf("refused file was modified: %v", err)
			}
			assertOnlyFile(t, path)
			return
		}
		doc := readDoc(t, path)
		pci, _ := doc["pci"].(map[string]any)
		if doc["type"] != "pci" || pci == nil || pci["rdma-device"] != "mlx5_0" || doc["version"] == nil {
			t.Fatalf("written device-info %v lacks type/version/pci.rdma-device", doc)
		}
		assertOnlyFile(t, path)
	})
}
