//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns/podnstest"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// A node reboot, a crashed runtime or a forced sandbox removal: every pod
// netns disappears without DEL and the records stay. The pods' new
// sandboxes must get their devices again: one through the whole chain,
// one renamed in the pod, one with the rdma-netns step alone.
func TestRebootLeavesRecordsBehind(t *testing.T) {
	requireMode(t, "exclusive")
	a, b, d := nicBy(t, "pf"), nicBy(t, "child"), nicBy(t, "udev")
	c := cni(t)
	la := chain(t, "rdma-reboot", a.Netdev, 90, nil)
	lb := chain(t, "rdma-reboot", b.Netdev, 91, map[string]any{"rdmaDevName": "rdma_boot"})
	ld := chain(t, "rdma-reboot", d.Netdev, 92, nil)
	oldA, oldB, oldD := newPod(t, "boot-a-1"), newPod(t, "boot-b-1"), newPod(t, "boot-d-1")
	lateDel := oldA.rt("net1")
	lateDel.NetNS = ""
	mustAdd(t, c, la, oldA.rt("net1"))
	mustAdd(t, c, lb, oldB.rt("net1"))
	mustAdd(t, c, ld, oldD.rt("net1"))
	oldA.destroy()
	oldB.destroy()
	oldD.destroy()
	waitRDMA(t, a.RDMA, "")
	waitRDMA(t, "rdma_boot", "") // back under its pod-side name
	waitRDMA(t, d.RDMA, "")
	if n := len(records()); n != 3 {
		t.Fatalf("%d records before the new sandboxes, want the 3 stale ones", n)
	}

	newA, newB, newD := newPod(t, "boot-a-2"), newPod(t, "boot-b-2"), newPod(t, "boot-d-2")
	mustAdd(t, c, la, newA.rt("net1"))
	mustAdd(t, c, lb, newB.rt("net1"))
	wantRDMA(t, a.RDMA, []string{newA.path()}, []string{""})
	wantRDMA(t, "rdma_boot", []string{newB.path()}, []string{""})
	// The rdma-netns step alone, with the prevResult host-device gives.
	hd := chain(t, "rdma-reboot", d.Netdev, 92, nil)
	hd.Plugins = hd.Plugins[:1]
	res := mustAdd(t, c, hd, newD.rt("net1"))
	only := conflist(t, "rdma-reboot", rdmaPlugin(nil))
	if _, err := c.AddNetwork(context.Background(), withPrev(t, only.Name, only.Plugins[0], res), newD.rt("net1")); err != nil {
		t.Fatalf("ADD of the rdma-netns step alone: %v\n%s", err, tailLog())
	}
	wantRDMA(t, d.RDMA, []string{newD.path()}, []string{""})
	if n := len(records()); n != 3 {
		t.Fatalf("%d records after the new sandboxes, want only their 3", n)
	}

	// The runtime's DEL of an old sandbox comes late: it touches nothing.
	mustDel(t, c, la, lateDel)
	wantRDMA(t, a.RDMA, []string{newA.path()}, nil)

	if err := c.DelNetwork(context.Background(), withPrev(t, only.Name, only.Plugins[0], res), newD.rt("net1")); err != nil {
		t.Fatal(err)
	}
	mustDel(t, c, hd, newD.rt("net1"))
	mustDel(t, c, lb, newB.rt("net1"))
	mustDel(t, c, la, newA.rt("net1"))
	wantRDMA(t, b.RDMA, []string{""}, nil)
	wantNoRecords(t)
}

// The state directory is wiped (node image restored) while a pod holds its
// device: a retried ADD records it again, and DEL returns it.
func TestRecordsWipedThenDel(t *testing.T) {
	requireMode(t, "exclusive")
	for _, retryAdd := range []bool{false, true} {
		n := nicBy(t, "pf")
		c := cni(t)
		l := chain(t, "rdma-wiped", n.Netdev, 93, nil)
		p := newPod(t, "wiped")
		res := mustAdd(t, c, l, p.rt("net1"))
		wipeState(t)
		if retryAdd {
			// host-device cannot ADD twice: retry the rdma-netns step alone.
			only := conflist(t, "rdma-wiped", rdmaPlugin(nil))
			if _, err := c.AddNetwork(context.Background(), withPrev(t, only.Name, only.Plugins[0], res), p.rt("net1")); err != nil {
				t.Fatalf("retried ADD after the records were wiped: %v\n%s", err, tailLog())
			}
			wantRDMA(t, n.RDMA, []string{p.path()}, []string{""})
			if len(records()) != 1 {
				t.Fatal("the retried ADD did not record the attachment again")
			}
		}
		mustDelHome(t, c, l, p, n)
	}
}

// One damaged record: another pod's ADD goes on, the file is kept aside
// for the operator, and the damaged pod's own DEL returns its device.
func TestDamagedRecordBlocksNobody(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := nicBy(t, "pf"), nicBy(t, "child")
	c := cni(t)
	la := chain(t, "rdma-damaged", a.Netdev, 94, nil)
	lb := chain(t, "rdma-damaged", b.Netdev, 95, nil)
	pa, pb := newPod(t, "damaged-a"), newPod(t, "damaged-b")
	mustAdd(t, c, la, pa.rt("net1"))
	recs := records()
	if len(recs) != 1 {
		t.Fatalf("records %v", recs)
	}
	if err := os.WriteFile(filepath.Join(stateDir, recs[0]), []byte("garbage{"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, c, lb, pb.rt("net1"))
	wantRDMA(t, b.RDMA, []string{pb.path()}, []string{""})
	damaged, _ := filepath.Glob(filepath.Join(stateDir, "damaged", "*"))
	if len(damaged) != 1 {
		t.Fatalf("damaged/ holds %v, want the one unreadable record", damaged)
	}
	mustDel(t, c, la, pa.rt("net1"))
	wantRDMA(t, a.RDMA, []string{""}, []string{pa.path()})
	mustDel(t, c, lb, pb.rt("net1"))
	os.RemoveAll(filepath.Join(stateDir, "damaged"))
	wantNoRecords(t)
}

// The kernel index a device's lock file keeps from its last move is only
// a hint: one that names another device (as after a reboot or a driver
// reload) moves nothing but the right device, and is corrected.
func TestWrongDeviceIndexHint(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := nicBy(t, "pf"), nicBy(t, "child")
	other, err := netlink.RdmaLinkByName(b.RDMA)
	if err != nil {
		t.Fatal(err)
	}
	self, err := netlink.RdmaLinkByName(a.RDMA)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel's answer that ADD relies on.
	if !rdmans.IsAt(self.Attrs.Index, a.RDMA) || rdmans.IsAt(other.Attrs.Index, a.RDMA) || rdmans.IsAt(rdmans.NoIndex, a.RDMA) {
		t.Fatalf("IsAt: %s at its own index %d %v, at %s's %d %v", a.RDMA, self.Attrs.Index, rdmans.IsAt(self.Attrs.Index, a.RDMA),
			b.RDMA, other.Attrs.Index, rdmans.IsAt(other.Attrs.Index, a.RDMA))
	}
	c := cni(t)
	l := chain(t, "rdma-hint", a.Netdev, 96, nil)
	p := newPod(t, "hint")
	lockFile := filepath.Join(stateDir, "devices", a.RDMA)
	if err := os.MkdirAll(filepath.Dir(lockFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lockFile, []byte(fmt.Sprintf("%d\n", other.Attrs.Index)), 0o600); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, c, l, p.rt("net1"))
	wantRDMA(t, a.RDMA, []string{p.path()}, []string{""})
	wantRDMA(t, b.RDMA, []string{""}, []string{p.path()})
	mustDel(t, c, l, p.rt("net1"))
	wantRDMA(t, a.RDMA, []string{""}, []string{p.path()})
	if kept, _ := os.ReadFile(lockFile); string(kept) != fmt.Sprintf("%d\n", self.Attrs.Index) {
		t.Fatalf("lock file of %s holds %q after the move, want its index %d", a.RDMA, kept, self.Attrs.Index)
	}
	// The kept index serves the next move.
	mustAdd(t, c, l, p.rt("net1"))
	wantRDMA(t, a.RDMA, []string{p.path()}, []string{""})
	mustDel(t, c, l, p.rt("net1"))
	wantNoRecords(t)
}

// A sandbox ID reused with a new netns at the same path: the old record is
// not this pod's; ADD starts afresh and DEL returns the device.
func TestSandboxIDReusedWithNewNetns(t *testing.T) {
	requireMode(t, "exclusive")
	n, c, l, p := attachedPod(t, "child", "rdma-reuse", 96, nil, "reuse")
	path := newNetnsAtPath(t, p, n.RDMA)
	rt := &libcni.RuntimeConf{ContainerID: "reuse", NetNS: path, IfName: "net1"}
	mustAdd(t, c, l, rt)
	wantRDMA(t, n.RDMA, []string{path}, []string{""})
	mustDel(t, c, l, rt)
	wantRDMA(t, n.RDMA, []string{""}, []string{path})
	wantNoRecords(t)
}

// A /proc/PID/ns/net-style path that opens another netns by the time DEL
// runs: the device that netns holds is not the attachment's and stays.
func TestReusedNetnsPathIsNotThePod(t *testing.T) {
	requireMode(t, "exclusive")
	other := nicBy(t, "udev")
	n, c, _, p := attachedPod(t, "pf", "rdma-pathreuse", 97, nil, "pathreuse")
	lo := chain(t, "rdma-pathreuse-other", other.Netdev, 98, nil)
	// Another pod's netns now answers at the same path, with its own
	// device on its own net1.
	path := newNetnsAtPath(t, p, n.RDMA)
	ort := &libcni.RuntimeConf{ContainerID: "pathreuse-other", NetNS: path, IfName: "net1"}
	mustAdd(t, c, lo, ort)
	// The old pod's DEL of its rdma-netns step, with the reused path.
	only := conflist(t, "rdma-pathreuse", rdmaPlugin(nil))
	rt := &libcni.RuntimeConf{ContainerID: "pathreuse", NetNS: path, IfName: "net1"}
	if err := c.DelNetwork(context.Background(), withPrev(t, only.Name, only.Plugins[0], nil), rt); err != nil {
		t.Fatalf("DEL: %v\n%s", err, tailLog())
	}
	wantRDMA(t, other.RDMA, []string{path}, []string{""})
	mustDel(t, c, lo, ort)
	wantRDMA(t, other.RDMA, []string{""}, nil)
	wantNoRecords(t)
}

// newNetnsAtPath deletes p's netns, waits for the kernel to return dev to
// the host, and mounts a new netns at the path p's had: a path the
// runtime may pass again now names another netns. It returns the path.
func newNetnsAtPath(t *testing.T, p *pod, dev string) string {
	t.Helper()
	path := p.path()
	p.destroy()
	waitRDMA(t, dev, "")
	mountNetnsAt(t, path)
	return path
}

// waitRDMA waits for the kernel to return a device to a netns: netns
// cleanup runs asynchronously.
func waitRDMA(t *testing.T, dev, nsPath string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if devs, err := rdmaDevs(nsPath); err == nil && contains(devs, dev) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantRDMA(t, dev, []string{nsPath}, nil)
}

func wipeState(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		if e.Name() != "lock" {
			os.RemoveAll(filepath.Join(stateDir, e.Name()))
		}
	}
}

// mountNetnsAt bind-mounts a fresh network namespace at path, as a runtime
// reusing a name or the kernel reusing a PID leaves it.
func mountNetnsAt(t *testing.T, path string) {
	t.Helper()
	if err := podnstest.MountNew(path); err != nil {
		t.Fatalf("mount a new netns at %s: %v", path, err)
	}
	t.Cleanup(func() {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		time.Sleep(300 * time.Millisecond)
		restoreNetdevNames(t)
	})
}
