package rdmadev

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

func TestDevices(t *testing.T) {
	tr := mlx5Card(t)
	tr.Device("", "virtual")
	tr.RDMA("virtual", "siw0") // a parent that is not on any bus
	got, err := Sysfs{Root: tr.Root}.Devices()
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{"mlx5_0", tr.Path(mlxPF0), "0000:3b:00.0"},
		{"mlx5_1", tr.Path(mlxPF1), "0000:3b:00.1"},
		{"mlx5_2", tr.Path(mlxSF2), "0000:3b:00.0"},
		{"mlx5_4", tr.Path(mlxVF), "0000:3b:00.2"},
		{"siw0", tr.Path("virtual"), ""},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Devices:\n got %+v\nwant %+v", got, want)
	}
}

func TestDevicesWithoutRDMA(t *testing.T) {
	tr := sysfstest.New(t)
	tr.PCI(mlxPF0)
	tr.Netdev(mlxPF0, "ens1f0")
	got, err := Sysfs{Root: tr.Root}.Devices()
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Devices = %v, %v; want empty list, nil", got, err)
	}
}

func TestDevicesUnresolvableParent(t *testing.T) {
	tr := sysfstest.New(t)
	tr.PCI(mlxPF0)
	tr.RDMA(mlxPF0, "mlx5_0")
	dir := filepath.Join(tr.Root, "class", "infiniband", "mlx5_0")
	if err := os.Remove(filepath.Join(dir, "device")); err != nil {
		t.Fatal(err)
	}
	// A class link whose target vanished: the device left the host netns
	// between listing and resolving.
	if err := os.Symlink("../../devices/gone/infiniband/mlx5_9", filepath.Join(tr.Root, "class", "infiniband", "mlx5_9")); err != nil {
		t.Fatal(err)
	}
	got, err := Sysfs{Root: tr.Root}.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if want := []Device{{Name: "mlx5_0"}}; !slices.Equal(got, want) {
		t.Fatalf("Devices = %+v, want %+v", got, want)
	}
}

func TestPathForDeviceID(t *testing.T) {
	tr := mlx5Card(t)
	s := Sysfs{Root: tr.Root}
	for _, tc := range []struct{ id, want string }{
		{"0000:3b:00.0", mlxPF0},
		{"3b:00.0", mlxPF0},
		{"0000:3B:00.1", mlxPF1},
		{"3B:00.2", mlxVF},
		{"mlx5_core.sf.2", mlxSF2},
	} {
		got, err := s.PathForDeviceID(tc.id)
		if err != nil {
			t.Errorf("PathForDeviceID(%q): %v", tc.id, err)
			continue
		}
		if got != tr.Path(tc.want) {
			t.Errorf("PathForDeviceID(%q) = %s, want %s", tc.id, got, tr.Path(tc.want))
		}
	}
}

func TestPathForDeviceIDErrors(t *testing.T) {
	tr := mlx5Card(t)
	// Something a traversal would reach if names were not validated.
	if err := os.MkdirAll(filepath.Join(tr.Root, "bus", "auxiliary", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := Sysfs{Root: tr.Root}
	for _, tc := range []struct {
		id       string
		notExist bool
		msg      string
	}{
		{"", false, `empty device ID: expected a PCI address (e.g. 0000:3b:00.0) or an auxiliary device name (e.g. mlx5_core.sf.2)`},
		{"../etc", false, `invalid device ID "../etc": must be a single sysfs name without '/' or '..'; expected a PCI address`},
		{"..", false, `invalid device ID ".."`},
		{".", false, `invalid device ID "."`},
		{"mlx5_core.sf.2/..", false, `invalid device ID`},
		{"3b:00.7", true, `device ID "3b:00.7": no PCI function 0000:3b:00.7 on this host (` + tr.Root + `/bus/pci/devices/0000:3b:00.7 does not exist)`},
		{"mlx5_core.sf.9", true, `device ID "mlx5_core.sf.9" is not a PCI address and no auxiliary device of that name exists (` + tr.Root + `/bus/auxiliary/devices/mlx5_core.sf.9 does not exist)`},
		{"unknown", true, `device ID "unknown" is not a PCI address`},
		{"0000:3b:00.8", true, `device ID "0000:3b:00.8" is not a PCI address`}, // function is 0-7
	} {
		got, err := s.PathForDeviceID(tc.id)
		if err == nil {
			t.Errorf("PathForDeviceID(%q) = %q, want error", tc.id, got)
			continue
		}
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("PathForDeviceID(%q) error %q, want it to contain %q", tc.id, err, tc.msg)
		}
		if errors.Is(err, fs.ErrNotExist) != tc.notExist {
			t.Errorf("PathForDeviceID(%q): errors.Is(err, fs.ErrNotExist) = %v, want %v", tc.id, !tc.notExist, tc.notExist)
		}
	}
}

func TestBusDevicePath(t *testing.T) {
	tr := virtioVM(t, true)
	s := Sysfs{Root: tr.Root}
	got, err := s.BusDevicePath("virtio", "virtio1")
	if err != nil || got != tr.Path(virtioChild1) {
		t.Fatalf("BusDevicePath(virtio, virtio1) = %q, %v; want %q", got, err, tr.Path(virtioChild1))
	}
	_, err = s.BusDevicePath("virtio", "virtio7")
	want := `no virtio device "virtio7" on this host: ` + tr.Root + `/bus/virtio/devices/virtio7 does not exist; check the device ID and that the device is present and its driver bound`
	if err == nil || err.Error() != want || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing device: %v, want %q", err, want)
	}
	for _, tc := range []struct{ bus, name string }{
		{"", "virtio1"}, {"virtio", ""}, {"..", "virtio1"}, {"virtio/../pci", "x"}, {"virtio", "a..b"},
	} {
		if got, err := s.BusDevicePath(tc.bus, tc.name); err == nil || errors.Is(err, fs.ErrNotExist) {
			t.Errorf("BusDevicePath(%q, %q) = %q, %v; want a validation error", tc.bus, tc.name, got, err)
		}
	}
}

func TestPCIAddressOf(t *testing.T) {
	tr := mlx5Card(t)
	// A directory named like a PCI function but not on bus pci must not be
	// taken for one.
	fake := tr.Device("platform", "platform/0000:3b:00.5")
	vm := virtioVM(t, true)
	for _, tc := range []struct {
		root, path, want string
	}{
		{tr.Root, tr.Path(mlxPF0), "0000:3b:00.0"},
		{tr.Root, tr.Path(mlxSF2), "0000:3b:00.0"},
		{tr.Root, tr.Path(mlxPF0 + "/infiniband/mlx5_0"), "0000:3b:00.0"},
		{tr.Root, tr.Path(mlxVF), "0000:3b:00.2"},
		{tr.Root, tr.Path(mlxBridge), "0000:3a:00.0"},
		{tr.Root, tr.Path("pci0000:3a"), ""},
		{tr.Root, fake, ""},
		{tr.Root, "", ""},
		{vm.Root, vm.Path(virtioChild1), "0000:00:04.0"},
	} {
		if got := (Sysfs{Root: tc.root}).PCIAddressOf(tc.path); got != tc.want {
			t.Errorf("PCIAddressOf(%s) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestNormalizePCIAddress(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"0000:3b:00.0", "0000:3b:00.0", true},
		{"3b:00.0", "0000:3b:00.0", true},
		{"3B:1F.7", "0000:3b:1f.7", true},
		{"10000:e1:00.0", "10000:e1:00.0", true}, // VMD domain
		{"0000:3b:00", "", false},
		{"0000:3b:00.0 ", "", false},
		{"mlx5_core.sf.2", "", false},
		{"000:3b:00.0", "", false},       // domain too short
		{"123456789:3b:00.0", "", false}, // domain too long
		{"0000:3g:00.0", "", false},      // not hex
		{"0000:3b:00.8", "", false},      // function is 0-7
		{"0000:0000:3b:00.0", "", false}, // two domains
		{"0000:3b:00.0.1", "", false},
		{"", "", false},
	} {
		got, ok := normalizePCIAddress(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("normalizePCIAddress(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// A Root reached through a symlink must give the same canonical device paths
// as BusDevicePath does, or no netdev's parent would ever contain its RDMA
// device.
func TestDevicesRootBehindSymlink(t *testing.T) {
	tr := mlx5Card(t)
	link := filepath.Join(t.TempDir(), "sys")
	if err := os.Symlink(tr.Root, link); err != nil {
		t.Fatal(err)
	}
	s := Sysfs{Root: link}
	devs, err := s.Devices()
	if err != nil {
		t.Fatal(err)
	}
	parent, err := s.BusDevicePath("pci", "0000:3b:00.0")
	if err != nil {
		t.Fatal(err)
	}
	if m := Closest(parent, "", devs); len(m) != 1 || m[0].Device.Name != "mlx5_0" {
		t.Fatalf("Closest(%s) = %+v over %+v, want mlx5_0", parent, m, devs)
	}
}

func TestHas(t *testing.T) {
	tr := mlx5Card(t)
	s := Sysfs{Root: tr.Root}
	for name, want := range map[string]bool{"mlx5_0": true, "mlx5_4": true, "mlx5_9": false} {
		if got, err := s.Has(name); err != nil || got != want {
			t.Errorf("Has(%s) = %v, %v; want %v, nil", name, got, err, want)
		}
	}
	// The class directory shows only the host's devices: one that moved
	// into a pod is gone from it.
	tr.Remove("infiniband", "mlx5_0")
	if got, err := s.Has("mlx5_0"); err != nil || got {
		t.Errorf("Has(mlx5_0) after it left = %v, %v; want false, nil", got, err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := s.Has(bad); err == nil {
			t.Errorf("Has(%q) accepted a name that is not one path element", bad)
		}
	}
}

// BusDevicePath takes the kernel's relative bus links at their word and
// must still land where full resolution lands, whatever shape the link has.
func TestBusDevicePathMatchesFullResolution(t *testing.T) {
	tr := mlx5Card(t)
	link := filepath.Join(t.TempDir(), "sys")
	if err := os.Symlink(tr.Root, link); err != nil {
		t.Fatal(err)
	}
	busDir := filepath.Join(tr.Root, "bus", "pci", "devices")
	// A link written absolute, and one whose path leaves the devices tree
	// and comes back: both only resolvable the long way.
	if err := os.Symlink(tr.Path(mlxPF1), filepath.Join(busDir, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../class/../devices/"+mlxVF, filepath.Join(busDir, "detour")); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{tr.Root, link} {
		s := Sysfs{Root: root}
		for _, name := range []string{"0000:3b:00.0", "0000:3b:00.1", "0000:3b:00.2", "abs", "detour"} {
			want, err := filepath.EvalSymlinks(filepath.Join(busDir, name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.BusDevicePath("pci", name)
			if err != nil || got != want {
				t.Errorf("root %s: BusDevicePath(pci, %s) = %q, %v; want %q", root, name, got, err, want)
			}
		}
	}
}

// Candidates must see what Devices sees, minus what Complete adds back for
// the chosen device, or the quick look and the full one could pick
// different devices for the same netdev.
func TestCandidatesAgreeWithDevices(t *testing.T) {
	for name, tr := range map[string]*sysfstest.Tree{"mlx5": mlx5Card(t), "e810": e810Card(t)} {
		s := Sysfs{Root: tr.Root}
		full, err := s.Devices()
		if err != nil {
			t.Fatal(err)
		}
		cands, exact, err := s.Candidates()
		if err != nil || !exact || len(cands) != len(full) {
			t.Fatalf("%s: Candidates = %d devices, exact %v, %v; Devices has %d", name, len(cands), exact, err, len(full))
		}
		for i, c := range cands {
			if c.Name != full[i].Name || c.DevPath != full[i].DevPath || c.PCIAddress != "" {
				t.Errorf("%s: candidate %+v, device %+v", name, c, full[i])
			}
			if got, ok := s.Complete(c); !ok || got != full[i] {
				t.Errorf("%s: Complete(%s) = %+v, %v; want %+v", name, c.Name, got, ok, full[i])
			}
		}
	}
}

// A class link of another shape makes Candidates say it is not exact, and
// a device gone since the listing is not completed.
func TestCandidatesInexact(t *testing.T) {
	tr := mlx5Card(t)
	s := Sysfs{Root: tr.Root}
	cands, _, err := s.Candidates()
	if err != nil {
		t.Fatal(err)
	}
	tr.Remove("infiniband", "mlx5_1")
	for _, c := range cands {
		if _, ok := s.Complete(c); ok == (c.Name == "mlx5_1") {
			t.Errorf("Complete(%s) = %v after mlx5_1 left the host", c.Name, ok)
		}
	}
	if err := os.Symlink(tr.Path(mlxVF), filepath.Join(tr.Root, "class", "infiniband", "odd0")); err != nil {
		t.Fatal(err)
	}
	if _, exact, err := s.Candidates(); err != nil || exact {
		t.Fatalf("Candidates with an odd class link: exact %v, %v", exact, err)
	}
}

// IsPCIAddress takes only the form sysfs spells, which names one entry of
// /sys/bus/pci/devices.
func TestIsPCIAddress(t *testing.T) {
	for s, want := range map[string]bool{
		"0000:3b:00.0": true, "10000:00:05.7": true,
		"3b:00.0": false, "0000:3B:00.0": false, "0000:3b:00.8": false, "../../../tmp/x": false,
		"0000:3b:00.0/..": false, "": false, "mlx5_core.sf.2": false,
	} {
		if got := IsPCIAddress(s); got != want {
			t.Errorf("IsPCIAddress(%q) = %v, want %v", s, got, want)
		}
	}
}
