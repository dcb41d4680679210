package rdmans

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		err    error
		noRDMA bool
	}{
		{unix.EPROTONOSUPPORT, true},
		{unix.EAFNOSUPPORT, true},
		{fmt.Errorf("socket: %w", unix.EPROTONOSUPPORT), true},
		{unix.EPERM, false},
		{unix.ENODEV, false},
		{unix.EBUSY, false},
		{errors.New("anything else"), false},
	}
	for _, tt := range tests {
		got := classify(tt.err)
		if errors.Is(got, ErrNoRDMA) != tt.noRDMA {
			t.Errorf("classify(%v) = %v; ErrNoRDMA %v, want %v", tt.err, got, !tt.noRDMA, tt.noRDMA)
		}
		if !strings.Contains(got.Error(), tt.err.Error()) {
			t.Errorf("classify(%v) = %q lost the kernel's error", tt.err, got)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
}

// rdmaNetlinkErr is what the kernel says when asked for an RDMA netlink
// socket: nil when the RDMA subsystem is there.
func rdmaNetlinkErr() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_RDMA)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

type podNS struct {
	ns       ns.NetNS
	hostVeth string
	podVeth  string
}

// newPodNS creates a netns with a veth pair whose peer is moved into it, as
// the main CNI plugin leaves things before rdma-netns runs.
func newPodNS(t *testing.T) *podNS {
	t.Helper()
	requireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := testutils.UnmountNS(n); err != nil {
			t.Errorf("unmounting netns: %v", err)
		}
	})
	suffix := fmt.Sprintf("%x", os.Getpid()%0xfffff)
	p := &podNS{ns: n, hostVeth: "rnth" + suffix, podVeth: "rntp" + suffix}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.hostVeth}, PeerName: p.podVeth}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("creating veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(p.hostVeth); err == nil {
			netlink.LinkDel(l)
		}
	})
	peer, err := netlink.LinkByName(p.podVeth)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(peer, int(n.Fd())); err != nil {
		t.Fatalf("moving %s into the netns: %v", p.podVeth, err)
	}
	return p
}

// hostNSPath is the netns of the test process's main thread.
func hostNSPath() string { return fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) }

func TestNetdevVeth(t *testing.T) {
	p := newPodNS(t)
	n, err := Netlink{}.Netdev(p.ns.Path(), p.podVeth)
	if err != nil {
		t.Fatalf("Netdev(%s, %s): %v", p.ns.Path(), p.podVeth, err)
	}
	if n.ParentBus != "" || n.Parent != "" || n.ParentID() != "" {
		t.Errorf("veth reports parent bus %q dev %q, want none", n.ParentBus, n.Parent)
	}
}

func TestNetdevLooksInTheGivenNetns(t *testing.T) {
	p := newPodNS(t)
	// The host end of the pair is not in the pod...
	_, err := Netlink{}.Netdev(p.ns.Path(), p.hostVeth)
	if err == nil {
		t.Fatalf("found host netdev %s in the pod netns", p.hostVeth)
	}
	for _, want := range []string{p.hostVeth, p.ns.Path()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// ...and the pod end is no longer in the host.
	if _, err := (Netlink{}).Netdev(hostNSPath(), p.podVeth); err == nil {
		t.Errorf("found pod netdev %s in the host netns", p.podVeth)
	}
}

func TestNetdevMissingIfName(t *testing.T) {
	p := newPodNS(t)
	_, err := Netlink{}.Netdev(p.ns.Path(), "nosuchif0")
	if err == nil {
		t.Fatal("Netdev of a missing netdev succeeded")
	}
	for _, want := range []string{"nosuchif0", p.ns.Path()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestNetdevBadNetns(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	notNS := filepath.Join(dir, "file")
	if err := os.WriteFile(notNS, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), notNS} {
		_, err := Netlink{}.Netdev(path, "lo")
		if err == nil {
			t.Errorf("Netdev in %s succeeded", path)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name %s", err, path)
		}
	}
}

// A netdev backed by a real device reports the parent sysfs shows for it.
// Skipped where no netdev has one (everything virtual).
func TestNetdevPhysical(t *testing.T) {
	requireRoot(t)
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, l := range links {
		name := l.Attrs().Name
		devLink, err := filepath.EvalSymlinks(filepath.Join("/sys/class/net", name, "device"))
		if err != nil {
			continue
		}
		busLink, err := filepath.EvalSymlinks(filepath.Join(devLink, "subsystem"))
		if err != nil {
			continue
		}
		n, err := Netlink{}.Netdev(hostNSPath(), name)
		if err != nil {
			t.Errorf("Netdev(host, %s): %v", name, err)
			continue
		}
		if n.Parent != filepath.Base(devLink) || n.ParentBus != filepath.Base(busLink) {
			t.Errorf("%s: Netdev's parent = %q/%q, sysfs says %q/%q", name, n.ParentBus, n.Parent, filepath.Base(busLink), filepath.Base(devLink))
		}
		checked++
	}
	if checked == 0 {
		t.Skip("no netdev with a parent device on this host")
	}
}

// On a kernel without RDMA netlink every RDMA call must fail with ErrNoRDMA
// (so the plugin can say "is ib_core loaded?") instead of panicking or
// reporting devices as merely absent.
func TestNoRDMAClassified(t *testing.T) {
	requireRoot(t)
	kerr := rdmaNetlinkErr()
	if kerr == nil {
		t.Skip("this kernel has RDMA netlink")
	}
	t.Logf("RDMA netlink socket: %v (errno %d)", kerr, kerr.(unix.Errno))
	p := newPodNS(t)
	nl := Netlink{}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrNoRDMA) {
			t.Errorf("%s: err = %v, want ErrNoRDMA", what, err)
			return
		}
		if !strings.Contains(err.Error(), kerr.Error()) {
			t.Errorf("%s: err %q hides the kernel's %q", what, err, kerr)
		}
	}

	mode, err := nl.NetnsMode()
	check("NetnsMode", err)
	if mode != "" {
		t.Errorf("NetnsMode = %q with an error", mode)
	}
	found, err := nl.InHost("mlx5_0")
	check("InHost", err)
	if found {
		t.Error("InHost reported a device")
	}
	names, err := nl.HostDevices()
	check("HostDevices", err)
	if len(names) != 0 {
		t.Errorf("HostDevices = %v", names)
	}
	found, err = nl.InNetns(p.ns.Path(), "mlx5_0")
	check("InNetns", err)
	if found {
		t.Error("InNetns reported a device")
	}
	_, err = nl.DevicesIn(p.ns.Path())
	check("DevicesIn", err)
	_, err = nl.MoveToNetns("mlx5_0", p.ns.Path(), NoIndex)
	check("MoveToNetns", err)
	_, err = nl.MoveToNetns("mlx5_0", p.ns.Path(), 0)
	check("MoveToNetns with an index hint", err)
	check("MoveToHost", nl.MoveToHost("mlx5_0", p.ns.Path()))
	check("Rename in host", nl.Rename("", "mlx5_0", "rdma0"))
	check("Rename in netns", nl.Rename(p.ns.Path(), "mlx5_0", "rdma0"))
}

// A bad netns path is reported as such, not as a missing RDMA subsystem.
func TestBadNetnsPath(t *testing.T) {
	requireRoot(t)
	missing := filepath.Join(t.TempDir(), "missing")
	nl := Netlink{}
	errs := map[string]error{
		"MoveToNetns": func() error { _, err := nl.MoveToNetns("mlx5_0", missing, NoIndex); return err }(),
		"MoveToHost":  nl.MoveToHost("mlx5_0", missing),
		"Rename":      nl.Rename(missing, "mlx5_0", "rdma0"),
		"DevicesIn":   func() error { _, err := nl.DevicesIn(missing); return err }(),
		"InNetns":     func() error { _, err := nl.InNetns(missing, "mlx5_0"); return err }(),
	}
	for what, err := range errs {
		if err == nil {
			t.Errorf("%s with a missing netns succeeded", what)
			continue
		}
		if errors.Is(err, ErrNoRDMA) {
			t.Errorf("%s: missing netns reported as ErrNoRDMA: %v", what, err)
		}
		if !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: error %q does not name %s", what, err, missing)
		}
	}
}

func TestPickPrefersThePodName(t *testing.T) {
	var devs []*netlink.RdmaLink
	for i, name := range []string{"mlx5_0", "rdma_net1", "mlx5_1"} {
		devs = append(devs, &netlink.RdmaLink{Attrs: netlink.RdmaLinkAttrs{Index: uint32(i + 1), Name: name}})
	}
	tests := []struct {
		host, pod, want string
		asPod           bool
	}{
		{"mlx5_1", "rdma_net1", "rdma_net1", true}, // renamed in the pod
		{"mlx5_1", "", "mlx5_1", false},            // never renamed
		{"mlx5_1", "gone", "mlx5_1", false},        // killed before the rename
		{"mlx5_1", "mlx5_1", "mlx5_1", false},      // a rename to its own name
		{"mlx5_9", "gone", "", false},              // not in the pod
	}
	for _, tt := range tests {
		d, asPod := pick(devs, tt.host, tt.pod)
		got := ""
		if d != nil {
			got = d.Attrs.Name
		}
		if got != tt.want || asPod != tt.asPod {
			t.Errorf("pick(%s, %q) = %q, %v; want %q, %v", tt.host, tt.pod, got, asPod, tt.want, tt.asPod)
		}
	}
}

func TestModeOfParam(t *testing.T) {
	for in, want := range map[string]string{"Y\n": ModeShared, "N\n": ModeExclusive, "N": ModeExclusive, "1\n": "", "": ""} {
		if got := modeOfParam([]byte(in)); got != want {
			t.Errorf("modeOfParam(%q) = %q, want %q", in, got, want)
		}
	}
}
