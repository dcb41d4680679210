package doctor

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
)

var update = flag.Bool("update", false, "rewrite the golden reports in testdata from what the doctor prints now")

// The reports as a person and a script read them, whole: the sections and
// their order, the alignment of the tables, the findings worst first, the
// JSON's keys. `go test ./pkg/doctor -run TestReportGolden -update`
// rewrites testdata/*.golden; the diff is the change a reader sees.
func TestReportGolden(t *testing.T) {
	in, err := os.Open(filepath.Join("testdata", "nads-input.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for name, r := range map[string]*Report{
		"node": goldenNode(),
		"pod":  goldenPod(),
		"nads": CheckNADs(in),
	} {
		t.Run(name, func(t *testing.T) {
			var text, js bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if err := r.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			golden(t, name+".txt.golden", text.Bytes())
			golden(t, name+".json.golden", js.Bytes())
		})
	}
}

func golden(t *testing.T, file string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what the doctor prints now (-update rewrites it); it prints:\n%s", path, got)
	}
}

// goldenNode is a node in exclusive mode with a device in the host, one
// in a pod as recorded, one leaked, and a reserved name.
func goldenNode() *Report {
	r := &Report{Node: &NodeView{
		NetnsMode: "exclusive", Persistent: "/etc/modprobe.d/ib_core.conf", PersistentMode: "exclusive",
		StateDir: "/var/lib/cni/rdma-netns", StateDirPresent: true,
		Records: []RecordView{{Key: "rdma-net/cid-a/net1", Netns: "/run/netns/cni-a", Device: "mlx5_1", PodName: "rdma_r0", State: "attached",
			File: "/var/lib/cni/rdma-netns/rdma-net-cid-a-net1.json", Status: "ok"}},
		Reservations: []Reservation{{Name: "rdma_r0", Network: "rdma-net", File: "/var/lib/cni/rdma-netns/reserved-names/rdma_r0"}},
		Devices: []Device{
			{Name: "mlx5_0", Driver: "mlx5_core", PCIAddress: "0000:3b:00.0", CharDevices: []string{"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"},
				Ports: []Port{{Port: 1, State: "ACTIVE", LinkLayer: "Ethernet", Netdevs: []string{"ens1f0"}, GIDs: 4}}, Location: Location{Host: true}},
			{Name: "mlx5_2", Driver: "mlx5_core", PCIAddress: "0000:3b:00.2", CharDevices: []string{"/dev/infiniband/uverbs2"},
				Ports:    []Port{{Port: 1, State: "DOWN", Netdevs: []string{}}, {Port: 2, State: "ACTIVE", Netdevs: []string{"net2"}, GIDs: 1}},
				Location: Location{Netns: "/run/netns/cni-b", Inode: 4026533001}},
			{Name: "rdma_r0", Driver: "mlx5_core", PCIAddress: "0000:3b:00.1", CharDevices: []string{"/dev/infiniband/uverbs1"},
				Ports:    []Port{{Port: 1, State: "ACTIVE", Netdevs: []string{"net1"}, GIDs: 2}},
				Location: Location{Netns: "/run/netns/cni-a", Inode: 4026533000, Owner: "rdma-net/cid-a/net1"}},
		},
		Namespaces: []*inventory.Namespace{},
	}}
	r.Findings.add(OK, "netns-mode", "node", "the RDMA subsystem is in exclusive netns mode: each RDMA device belongs to one network namespace", "")
	r.Findings.add(Warn, "leak", "mlx5_2", "RDMA device mlx5_2 sits in netns /run/netns/cni-b, but no rdma-netns record owns it: no pod will get it from rdma-netns",
		moveBackCommand("mlx5_2", "/run/netns/cni-b"))
	r.Findings.add(OK, "record", "rdma-net/cid-a/net1", "RDMA device rdma_r0 is in netns /run/netns/cni-a as recorded", "")
	r.finish()
	return r
}

// goldenPod is a pod with two rails on one subnet, one of whose routes
// leaves by the other's netdev, a process with what it needs, and two
// GPUs of which one has the pod's NICs under its PCIe root.
func goldenPod() *Report {
	gid := func(i int) *int { return &i }
	r := &Report{Pod: &PodView{
		Netns: "/run/netns/cni-a", Inode: 4026533000, NetnsMode: "exclusive",
		Devices: []Device{
			{Name: "rdma_r0", Driver: "mlx5_core", PCIAddress: "0000:3b:00.1", CharDevices: []string{"/dev/infiniband/uverbs1"},
				Ports: []Port{{Port: 1, State: "ACTIVE", Netdevs: []string{"net1"}, GIDs: 2}}, Location: Location{Netns: "/run/netns/cni-a", Inode: 4026533000}},
			{Name: "rdma_r1", Driver: "mlx5_core", PCIAddress: "0000:3b:00.3", CharDevices: []string{"/dev/infiniband/uverbs3"},
				Ports: []Port{{Port: 1, State: "ACTIVE", Netdevs: []string{"net2"}, GIDs: 2}}, Location: Location{Netns: "/run/netns/cni-a", Inode: 4026533000}},
		},
		VerbsNodes: []string{"rdma_cm", "uverbs1", "uverbs3"},
		Rails: []Rail{
			{Device: "rdma_r0", Port: 1, Netdev: "net1", ArpIgnore: 1, ArpAnnounce: 2, SharesSubnetWith: []string{"net2"},
				Addresses: []RailAddress{{Address: "10.0.0.1/24", RoCEv2GID: gid(1), Peer: "10.0.0.254", RouteNetdev: "net1"}}},
			{Device: "rdma_r1", Port: 1, Netdev: "net2", ArpIgnore: 1, ArpAnnounce: 2, SharesSubnetWith: []string{"net1"},
				Addresses: []RailAddress{{Address: "10.0.0.2/24", RoCEv2GID: gid(1), Peer: "10.0.0.254", RouteNetdev: "net1"}}},
		},
		Processes: []Process{{PID: 42, Comm: "python", Memlock: Limit{Unlimited: true, Known: true}, MemlockHard: Limit{Unlimited: true, Known: true},
			CapIPCLock: true, CapKnown: true, ShmBytes: 16 << 30,
			CharDevices: []string{"rdma_cm", "uverbs0", "uverbs1", "uverbs3"}}},
	}}
	r.Findings.add(OK, "memlock", "pid 42 (python)", "holds CAP_IPC_LOCK, so memory registration ignores its memlock limit (unlimited)", "")
	r.Findings.add(Fail, "rail-route", "rdma_r1 (net2)", "traffic from rail rdma_r1's address 10.0.0.2 leaves by netdev net1, not net2",
		tryRoute("/run/netns/cni-a", "net2", netip.MustParsePrefix("10.0.0.2/24"), 101))
	r.Pod.NICs = []NIC{
		{Device: "rdma_r0", Netdevs: []string{"net1"}, PCIPlace: PCIPlace{PCIAddress: "0000:3b:00.1", PCIeRoot: "pci0000:3a", NUMANode: 0}},
		{Device: "rdma_r1", Netdevs: []string{"net2"}, PCIPlace: PCIPlace{PCIAddress: "0000:3b:00.3", PCIeRoot: "pci0000:3a", NUMANode: 0}},
	}
	r.Pod.GPUs = alignFindings(&r.Findings, []GPU{
		{PCIPlace: PCIPlace{PCIAddress: "0000:3c:00.0", PCIeRoot: "pci0000:3a", NUMANode: 0}, FoundBy: []string{"/dev/nvidia0"}},
		{PCIPlace: PCIPlace{PCIAddress: "0000:af:00.0", PCIeRoot: "pci0000:ae", NUMANode: 1}, FoundBy: []string{"--gpus"}},
	}, r.Pod.NICs)
	r.finish()
	return r
}
