package main

import (
	"context"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/publish"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func netnsMode(t *testing.T, root, v string) {
	t.Helper()
	p := filepath.Join(root, "module", "ib_core", "parameters", "netns_mode")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The slice is published again when the NICs change, not every round
// (each publish is API-server traffic from every node), and is emptied
// when the RDMA subsystem is in shared mode.
func TestPublishesWhenChanged(t *testing.T) {
	sys := fakesys.New(t)
	netnsMode(t, sys.Root, "N")
	var got []int
	p := &publish.Publisher{Node: "node1", Records: drarecord.Dir(t.TempDir()), Scanner: nics.Scanner{Root: sys.Root}, Sysfs: sys.Root,
		Log: log.New(io.Discard, "", 0), Publish: func(_ context.Context, r resourceslice.DriverResources) error {
			got = append(got, len(r.Pools["node1"].Slices[0].Devices))
			return nil
		}}
	ctx := context.Background()
	p.Once(ctx)
	p.Once(ctx)
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA) // no record holds it: gone
	p.Once(ctx)
	netnsMode(t, sys.Root, "Y")
	p.Once(ctx)
	want := []int{2, 1, 0}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("published device counts %v, want %v", got, want)
	}
}

func TestPCIAllowList(t *testing.T) {
	only, err := pciAllowList(" 0000:3B:00.0,0000:00:05.0")
	if err != nil || len(only) != 2 || !only["0000:3b:00.0"] || !only["0000:00:05.0"] {
		t.Errorf("pciAllowList = %v, %v", only, err)
	}
	if only, err := pciAllowList(""); only != nil || err != nil {
		t.Errorf("empty list = %v, %v; want every NIC (nil)", only, err)
	}
	for _, bad := range []string{"eth1", "0000:3b:00.0,../x", "3b:00.0"} {
		if _, err := pciAllowList(bad); err == nil || !strings.Contains(err.Error(), "not a PCI address") {
			t.Errorf("pciAllowList(%q) = %v, want a refusal", bad, err)
		}
	}
}

// The driver finds its kubelet sockets gone when another instance took
// them away as it stopped, and says which.
func TestMissingSocket(t *testing.T) {
	dir := t.TempDir()
	reg, dra := filepath.Join(dir, "reg.sock"), filepath.Join(dir, "dra.sock")
	for _, p := range []string{reg, dra} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := missingSocket([]string{reg, dra}); got != "" {
		t.Fatalf("both there: missingSocket = %q, want none", got)
	}
	if err := os.Remove(dra); err != nil {
		t.Fatal(err)
	}
	if got := missingSocket([]string{reg, dra}); got != dra {
		t.Fatalf("%s removed: missingSocket = %q", dra, got)
	}
}
