package rdmadev

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
)

// lookup does what the plugin does: resolve the device ID the device plugin
// passed, find its PCI function and pick the closest RDMA devices.
func lookup(t *testing.T, tr *sysfstest.Tree, deviceID string) []Match {
	t.Helper()
	s := Sysfs{Root: tr.Root}
	devPath, err := s.PathForDeviceID(deviceID)
	if err != nil {
		t.Fatalf("PathForDeviceID(%q): %v", deviceID, err)
	}
	devs, err := s.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	return Closest(devPath, s.PCIAddressOf(devPath), devs)
}

func names(ms []Match) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Device.Name)
	}
	return out
}

type want struct {
	names    []string
	distance int
	relation string // checked on the first match if set
}

func check(t *testing.T, got []Match, w want) {
	t.Helper()
	if !slices.Equal(names(got), w.names) {
		t.Fatalf("matched %v, want %v (%+v)", names(got), w.names, got)
	}
	for _, m := range got {
		if m.Distance != w.distance {
			t.Errorf("%s: distance %d, want %d", m.Device.Name, m.Distance, w.distance)
		}
	}
	if w.relation != "" && len(got) > 0 && got[0].Relation != w.relation {
		t.Errorf("relation %q, want %q", got[0].Relation, w.relation)
	}
}

func TestClosestMLX5(t *testing.T) {
	tr := mlx5Card(t)
	for _, tc := range []struct {
		name, id string
		want     want
	}{
		{"PF gets its own device, not the SF's below it", "0000:3b:00.0",
			want{[]string{"mlx5_0"}, 0, "directly under the netdev's parent device 0000:3b:00.0"}},
		{"second port", "0000:3b:00.1", want{[]string{"mlx5_1"}, 0, ""}},
		{"SF gets its own device, not the PF's above it", "mlx5_core.sf.2",
			want{[]string{"mlx5_2"}, 0, "directly under the netdev's parent device mlx5_core.sf.2"}},
		{"VF gets its own device", "0000:3b:00.2", want{[]string{"mlx5_4"}, 0, ""}},
	} {
		t.Run(tc.name, func(t *testing.T) { check(t, lookup(t, tr, tc.id), tc.want) })
	}
}

func TestClosestVFNeverGetsPFDevice(t *testing.T) {
	tr := mlx5Card(t)
	// The VF's RDMA device was moved into another pod; the PF's mlx5_0 and
	// the SF's mlx5_2 are still on the host but outside the VF's function.
	tr.Remove("infiniband", "mlx5_4")
	if got := lookup(t, tr, "0000:3b:00.2"); len(got) != 0 {
		t.Fatalf("VF matched %v, want nothing", got)
	}
}

func TestClosestSFWithoutOwnDevice(t *testing.T) {
	tr := mlx5Card(t)
	s := Sysfs{Root: tr.Root}
	devs, err := s.Devices()
	if err != nil {
		t.Fatal(err)
	}
	sf3 := tr.Path(mlxSF3)

	// With the fallback, the PF's device is the nearest thing in the function
	// (one up), nearer than SF2's (one up, one down).
	check(t, Closest(sf3, "0000:3b:00.0", devs),
		want{[]string{"mlx5_0"}, 1, "under PCI function 0000:3b:00.0 enclosing mlx5_core.sf.3"})

	// Callers that know a sub-function's device must be its own switch the
	// fallback off.
	if got := Closest(sf3, "", devs); len(got) != 0 {
		t.Fatalf("without fallback matched %v, want nothing", got)
	}
}

func TestClosestE810(t *testing.T) {
	tr := e810Card(t)
	check(t, lookup(t, tr, "0000:47:00.0"),
		want{[]string{"rocep71s0f0"}, 0, "directly under the netdev's parent device 0000:47:00.0"})
	check(t, lookup(t, tr, "47:00.1"), want{[]string{"irdma1"}, 0, ""})
}

func TestClosestE810DeviceUnderAuxiliary(t *testing.T) {
	// Should irdma ever parent its device to the ice.roce auxiliary device,
	// it is still found below the netdev's PCI function.
	tr := sysfstest.New(t)
	tr.PCI(icePF0)
	tr.Device("auxiliary", icePF0+"/ice.roce.0")
	tr.Netdev(icePF0, "ens2f0")
	tr.RDMA(icePF0+"/ice.roce.0", "irdma0")
	check(t, lookup(t, tr, "0000:47:00.0"),
		want{[]string{"irdma0"}, 1, "under ice.roce.0, 1 level below the netdev's parent device 0000:47:00.0"})
}

func TestClosestVirtio(t *testing.T) {
	t.Run("rxe under the virtio child", func(t *testing.T) {
		tr := virtioVM(t, true)
		s := Sysfs{Root: tr.Root}
		devs, err := s.Devices()
		if err != nil {
			t.Fatal(err)
		}
		// The netdev's parent is virtio1 (the plugin reads it from the
		// netdev's `device` link); the device ID is the PCI function.
		check(t, Closest(tr.Path(virtioChild1), "0000:00:04.0", devs),
			want{[]string{"rxe0"}, 0, "directly under the netdev's parent device virtio1"})
		check(t, Closest(tr.Path(virtioChild2), "0000:00:05.0", devs), want{[]string{"rxe1"}, 0, ""})
		// Starting from the PCI function finds the device below it.
		check(t, lookup(t, tr, "00:04.0"),
			want{[]string{"rxe0"}, 1, "under virtio1, 1 level below the netdev's parent device 0000:00:04.0"})
	})
	t.Run("rxe under the PCI function", func(t *testing.T) {
		tr := virtioVM(t, false)
		s := Sysfs{Root: tr.Root}
		devs, err := s.Devices()
		if err != nil {
			t.Fatal(err)
		}
		child := tr.Path(virtioChild1)
		check(t, Closest(child, s.PCIAddressOf(child), devs),
			want{[]string{"rxe0"}, 1, "under PCI function 0000:00:04.0 enclosing virtio1"})
		// The function may also be given by path.
		check(t, Closest(child, tr.Path(virtioFn1), devs), want{[]string{"rxe0"}, 1, ""})
		check(t, lookup(t, tr, "0000:00:05.0"), want{[]string{"rxe1"}, 0, ""})
	})
}

func TestClosestAmbiguous(t *testing.T) {
	tr := sysfstest.New(t)
	tr.PCI(mlxPF0)
	tr.RDMA(mlxPF0, "mlx5_1")
	tr.RDMA(mlxPF0, "mlx5_0")
	check(t, lookup(t, tr, "0000:3b:00.0"), want{[]string{"mlx5_0", "mlx5_1"}, 0, ""})
}

func TestClosestPrefersBelowOverFunction(t *testing.T) {
	// A device two levels below the netdev's parent beats one directly
	// under the enclosing function: below the parent is unambiguous
	// ownership, the function is only a fallback.
	fn := "/sys/devices/pci0000:00/0000:00:04.0"
	parent := fn + "/virtio1"
	devs := []Device{
		{Name: "a", DevPath: parent + "/x/y"},
		{Name: "b", DevPath: fn},
	}
	check(t, Closest(parent, "0000:00:04.0", devs),
		want{[]string{"a"}, 2, "under x/y, 2 levels below the netdev's parent device virtio1"})
}

func TestClosestNoMatch(t *testing.T) {
	fn := "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1"
	devs := []Device{
		// Name prefix of the netdev's function, but a different function.
		{Name: "mlx5_10", DevPath: fn + "0"},
		{Name: "mlx5_0", DevPath: "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"},
		{Name: "broken"},
	}
	for _, tc := range []struct{ devPath, pciFunc string }{
		{fn, "0000:3b:00.1"},
		{fn, "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"}, // does not enclose fn
		{fn, "0000:99:00.0"}, // not an ancestor
		{"", "0000:3b:00.1"},
	} {
		if got := Closest(tc.devPath, tc.pciFunc, devs); len(got) != 0 {
			t.Errorf("Closest(%q, %q) = %v, want nothing", tc.devPath, tc.pciFunc, got)
		}
	}
	if got := Closest(fn, "", nil); got != nil {
		t.Errorf("no devices: got %v", got)
	}
}

func TestClosestCleansPaths(t *testing.T) {
	p := filepath.Join("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
	got := Closest(p+"/", "", []Device{{Name: "mlx5_0", DevPath: p + "/./"}})
	check(t, got, want{[]string{"mlx5_0"}, 0, ""})
}

// TestDirectAgreesWithClosest: wherever Direct answers, it gives the one
// match Closest gives from the full listing, so the plugin may skip the
// listing; where Closest finds nothing right under the device, Direct
// does not answer.
func TestDirectAgreesWithClosest(t *testing.T) {
	ambiguous := sysfstest.New(t)
	ambiguous.PCI(mlxPF0)
	ambiguous.RDMA(mlxPF0, "mlx5_1")
	ambiguous.RDMA(mlxPF0, "mlx5_0")
	trees := map[string]*sysfstest.Tree{
		"mlx5": mlx5Card(t), "e810": e810Card(t), "virtio child": virtioVM(t, true),
		"virtio function": virtioVM(t, false), "ambiguous": ambiguous,
	}
	answered := 0
	for name, tr := range trees {
		s := Sysfs{Root: tr.Root}
		devs, err := s.Devices()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{mlxBridge, mlxPF0, mlxPF1, mlxVF, mlxSF2, mlxSF3, icePF0, icePF1, virtioFn1, virtioChild1, virtioFn2, virtioChild2, "pci0000:99/0000:99:00.0"} {
			path := tr.Path(p)
			m, ok := s.Direct(path)
			want := Closest(path, s.PCIAddressOf(path), devs)
			direct := len(want) == 1 && want[0].Distance == 0
			if ok != direct {
				t.Errorf("%s %s: Direct answered %v (%v), Closest found %+v", name, p, ok, m, want)
				continue
			}
			if !ok {
				continue
			}
			answered++
			if m.Device != want[0].Device || m.Relation != want[0].Relation || m.Distance != 0 {
				t.Errorf("%s %s: Direct %+v, Closest %+v", name, p, m, want[0])
			}
		}
	}
	if answered < 6 {
		t.Errorf("Direct answered only %d times; the fixtures have more devices right under their parents", answered)
	}
}
