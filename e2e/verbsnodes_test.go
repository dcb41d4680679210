//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// hostUverbs maps each RDMA device of the host to its uverbs node as the
// host's sysfs shows it (name and major:minor), read before any move.
func hostUverbs(t *testing.T) map[string]string {
	t.Helper()
	dirs, err := filepath.Glob("/sys/class/infiniband_verbs/uverbs*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no uverbs nodes in the host's sysfs (%v)", err)
	}
	out := map[string]string{}
	for _, d := range dirs {
		ibdev, err1 := os.ReadFile(filepath.Join(d, "ibdev"))
		dev, err2 := os.ReadFile(filepath.Join(d, "dev"))
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v %v", d, err1, err2)
		}
		out[strings.TrimSpace(string(ibdev))] = filepath.Base(d) + " " + strings.TrimSpace(string(dev))
	}
	return out
}

// The uverbs node of a pod's device comes from the kernel asked inside the
// pod's netns (the node's /sys/class/infiniband_verbs lists every uverbs
// node of every netns), under the name the device has there, renamed or
// not. A pod without a device gets none.
func TestVerbsNodesFromThePod(t *testing.T) {
	requireMode(t, "exclusive")
	want := hostUverbs(t)
	cm, err := os.ReadFile("/sys/class/misc/rdma_cm/dev")
	if err != nil {
		t.Fatalf("rdma_cm: %v", err)
	}
	c := cni(t)
	var pods []*pod
	for i, layout := range []string{"pf", "child"} {
		n := nicBy(t, layout)
		inPod := n.RDMA
		var extra map[string]any
		if i == 0 {
			inPod, extra = "rdma_net1", map[string]any{"rdmaDevName": "rdma_net1"}
		}
		l := chain(t, "rdma-verbs", n.Netdev, 80+i, extra)
		p := newPod(t, "verbs-"+layout)
		mustAdd(t, c, l, p.rt("net1"))
		pods = append(pods, p)

		got, err := rdmans.Netlink{}.VerbsNodesIn(p.path())
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Devices) != 1 || got.Devices[0].Device != inPod || got.Devices[0].Uverbs == nil {
			t.Fatalf("%s: the kernel in the pod says %+v, want %s with a uverbs node", n.RDMA, got.Devices, inPod)
		}
		u := got.Devices[0].Uverbs
		if have := fmt.Sprintf("%s %d:%d", u.Name, u.Major, u.Minor); have != want[n.RDMA] {
			t.Errorf("%s (%s in pod %s): uverbs node %s, want %s as the host's sysfs showed it before the move", n.RDMA, inPod, p.id, have, want[n.RDMA])
		}
		if got.RdmaCM == nil || fmt.Sprintf("%d:%d", got.RdmaCM.Major, got.RdmaCM.Minor) != strings.TrimSpace(string(cm)) {
			t.Errorf("rdma_cm %+v, want %s", got.RdmaCM, cm)
		}
		t.Logf("pod %s holds %s as %s: %s, rdma_cm %d:%d", p.id, n.RDMA, inPod, want[n.RDMA], got.RdmaCM.Major, got.RdmaCM.Minor)
	}
	empty := newPod(t, "verbs-none")
	if got, err := (rdmans.Netlink{}).VerbsNodesIn(empty.path()); err != nil || len(got.Devices) != 0 {
		t.Fatalf("a pod without a device: %+v, %v", got, err)
	}

	// Isolation, which exclusive mode gives and no device cgroup is needed
	// for: from inside one pod's netns every uverbs node of the node is
	// tried, and only the pod's own opens.
	own, _ := rdmans.Netlink{}.VerbsNodesIn(pods[0].path())
	nodes, _ := filepath.Glob("/dev/infiniband/uverbs*")
	var opened []string
	err = ns.WithNetNSPath(pods[0].path(), func(ns.NetNS) error {
		for _, node := range nodes {
			fd, err := unix.Open(node, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
				opened = append(opened, filepath.Base(node))
			} else if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.ENXIO) && !errors.Is(err, unix.ENODEV) {
				return fmt.Errorf("open %s: %v", node, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) != 1 || opened[0] != own.Devices[0].Uverbs.Name {
		t.Fatalf("from pod %s, of %d uverbs nodes these opened: %v; want only its own %s", pods[0].id, len(nodes), opened, own.Devices[0].Uverbs.Name)
	}
	t.Logf("from pod %s, of %d uverbs nodes only %v opened", pods[0].id, len(nodes), opened)
}
