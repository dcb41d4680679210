package rdmadev

import (
	"errors"
	"strings"
	"testing"
)

// The error goes to the pod's events: it names the pod's own netdev and
// parent, never the other devices of the node; Describe lists those for
// the node's log.
func TestNoMatchError(t *testing.T) {
	tr := mlx5Card(t)
	tr.Remove("infiniband", "mlx5_4")
	s := Sysfs{Root: tr.Root}
	devs, err := s.Devices()
	if err != nil {
		t.Fatal(err)
	}
	vf := tr.Path(mlxVF)
	err = NoMatch(`netdev "net1" (deviceID 0000:3b:00.2)`, vf, devs)
	want := `no RDMA device found for netdev "net1" (deviceID 0000:3b:00.2) (parent device ` + vf + `); ` +
		`set "rdmaDevice" to name it, check that the RDMA driver for this device is loaded (e.g. mlx5_ib, irdma, rdma_rxe), ` +
		`or it may already be in another pod's network namespace; the node's log of rdma-netns lists the RDMA devices the host has`
	if err.Error() != want {
		t.Fatalf("got  %s\nwant %s", err, want)
	}
	for _, d := range devs {
		if strings.Contains(err.Error(), d.Name) {
			t.Errorf("error names the node's device %s: %s", d.Name, err)
		}
	}
	var nm *NoMatchError
	if !errors.As(err, &nm) || nm.DevPath != vf || len(nm.Have) != 3 {
		t.Fatalf("errors.As: %+v", nm)
	}
	if got, want := Describe(nm.Have), "mlx5_0 (PCI 0000:3b:00.0), mlx5_1 (PCI 0000:3b:00.1), mlx5_2 (PCI 0000:3b:00.0)"; got != want {
		t.Fatalf("Describe = %s, want %s", got, want)
	}
}

func TestDescribeOddDevices(t *testing.T) {
	got := Describe([]Device{
		{Name: "siw0", DevPath: "/sys/devices/virtual/foo"},
		{Name: "mlx5_9"},
	})
	if want := "siw0 (no PCI function, parent /sys/devices/virtual/foo), mlx5_9 (parent device unknown)"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if got := Describe(nil); got != "none" {
		t.Fatalf("Describe(nil) = %s, want none", got)
	}
}

func TestAmbiguousError(t *testing.T) {
	tr := mlx5Card(t)
	tr.RDMA(mlxPF0, "mlx5_5")
	matches := lookup(t, tr, "0000:3b:00.0")
	err := Ambiguous(`netdev "net1"`, matches)
	want := `2 RDMA devices are equally close to netdev "net1": ` +
		`mlx5_0 (directly under the netdev's parent device 0000:3b:00.0), ` +
		`mlx5_5 (directly under the netdev's parent device 0000:3b:00.0); ` +
		`set "rdmaDevice" to the one to move into the pod`
	if err.Error() != want {
		t.Fatalf("got  %s\nwant %s", err, want)
	}
	var am *AmbiguousError
	if !errors.As(err, &am) || len(am.Matches) != 2 {
		t.Fatalf("errors.As: %+v", am)
	}
}
