package benchcluster

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	resourceapi "k8s.io/api/resource/v1"
)

func str(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func num(d resourceapi.Device, name resourceapi.QualifiedName) int64 {
	if a, ok := d.Attributes[name]; ok && a.IntValue != nil {
		return *a.IntValue
	}
	return -1
}

const (
	attrRoot = "resource.kubernetes.io/pcieRoot"
	attrNUMA = "resource.kubernetes.io/numaNode"
)

// The slice the bench publishes for a node is the driver's for the
// server it claims to be: 8 NICs and 8 GPUs, 2 of each under each of 4
// PCIe roots, roots 0-1 on NUMA node 0 and 2-3 on node 1, the NICs named
// as the rails template selects them. A layout the driver read otherwise
// (a NIC skipped, a root or NUMA node missing) would bench another
// cluster than the one the docs describe.
func TestServerSlices(t *testing.T) {
	srv, err := Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	res, err := NICResources("n1", srv.Root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	nics := res.Pools["n1"].Slices[0].Devices
	gpus, err := GPUDevices(srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(nics) != NICsPerNode || len(gpus) != GPUsPerNode {
		t.Fatalf("%d NICs and %d GPUs published, want %d and %d", len(nics), len(gpus), NICsPerNode, GPUsPerNode)
	}
	type perRoot struct {
		nics, gpus int
		numa       int64
	}
	roots := map[string]*perRoot{}
	at := func(d resourceapi.Device) *perRoot {
		r := str(d, attrRoot)
		if roots[r] == nil {
			roots[r] = &perRoot{numa: num(d, attrNUMA)}
		}
		if roots[r].numa != num(d, attrNUMA) {
			t.Errorf("device %s: NUMA node %d under root %s, whose others are on %d", d.Name, num(d, attrNUMA), r, roots[r].numa)
		}
		return roots[r]
	}
	netdevs := map[string]bool{}
	for _, d := range nics {
		at(d).nics++
		netdevs[str(d, slices.AttrNetdev)] = true
		if str(d, slices.AttrRdmaDevice) == "" || str(d, slices.AttrPCIVendor) != NICVendor {
			t.Errorf("NIC %s: attributes %v", d.Name, d.Attributes)
		}
	}
	for _, d := range gpus {
		at(d).gpus++
	}
	numas := map[int64]int{}
	for name, r := range roots {
		if r.nics != 2 || r.gpus != 2 {
			t.Errorf("root %s: %d NICs and %d GPUs, want 2 and 2", name, r.nics, r.gpus)
		}
		numas[r.numa]++
	}
	if len(roots) != 4 || numas[0] != 2 || numas[1] != 2 {
		t.Errorf("roots %v: want 4, two on each NUMA node", numas)
	}
	for _, n := range []string{"ens1f0np0", "ens2f0np0", "ens3f0np0", "ens4f0np0"} {
		if !netdevs[n] {
			t.Errorf("no NIC %s, which conf's rails template selects; have %v", n, netdevs)
		}
	}
}

// A NIC unplugged leaves the driver's slice at its next scan, and comes
// back when plugged again: the change whose cost the bench measures.
func TestUnplugPlug(t *testing.T) {
	srv, err := Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	records := t.TempDir()
	count := func() int {
		t.Helper()
		res, err := NICResources("n1", srv.Root, records)
		if err != nil && !strings.Contains(err.Error(), "skipped") {
			t.Fatal(err)
		}
		return len(res.Pools["n1"].Slices[0].Devices)
	}
	if err := srv.Unplug(7); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 7 {
		t.Errorf("%d NICs with one unplugged, want 7", n)
	}
	if err := srv.Plug(7); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 8 {
		t.Errorf("%d NICs plugged back, want 8", n)
	}
}

// The templates are conf's as shipped, and the bench's per-node counts
// are what those templates take of the server.
func TestTemplates(t *testing.T) {
	conf := filepath.Join("..", "..", "..", "conf")
	if _, err := NICClass(conf); err != nil {
		t.Fatal(err)
	}
	for _, tt := range Templates {
		tmpl, err := tt.Load(conf)
		if err != nil {
			t.Fatal(err)
		}
		gpus, nics := 0, 0
		for _, r := range tmpl.Spec.Spec.Devices.Requests {
			n := 1
			if r.Exactly.Count > 0 {
				n = int(r.Exactly.Count)
			}
			switch r.Exactly.DeviceClassName {
			case GPUClass:
				gpus += n
			case "rdma-nic.rdma-netns.io":
				nics += n
			default:
				t.Errorf("%s: request %s of class %q", tt.Name, r.Name, r.Exactly.DeviceClassName)
			}
		}
		want := 1 // rails: one set of rail NICs a node
		switch {
		case gpus > 0:
			want = GPUsPerNode / gpus
		case tt.Name != "rdma-rails-4":
			want = NICsPerNode / nics
		}
		if tt.PerNode != want {
			t.Errorf("%s: %d pods a node, its requests (%d GPUs, %d NICs) make it %d", tt.Name, tt.PerNode, gpus, nics, want)
		}
	}
}
