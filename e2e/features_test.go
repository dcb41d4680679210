//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const cmConfigfs = "/sys/kernel/config/rdma_cm"

func readToS(t *testing.T, dev string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(cmConfigfs, dev, "ports", "1", "default_roce_tos"))
	if err != nil {
		t.Fatalf("read ToS of %s: %v", dev, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func writeToS(t *testing.T, dev string, tos int) {
	t.Helper()
	group := filepath.Join(cmConfigfs, dev)
	if err := os.Mkdir(group, 0o755); err != nil && !os.IsExist(err) {
		t.Fatalf("create rdma_cm group for %s: %v", dev, err)
	}
	if err := os.WriteFile(filepath.Join(group, "ports", "1", "default_roce_tos"), []byte(strconv.Itoa(tos)), 0o644); err != nil {
		t.Fatalf("set ToS of %s: %v", dev, err)
	}
}

// The kernel forgets a device's RoCE ToS when it changes netns; rdmaQoS
// puts it back in the pod, and CHECK notices when it is lost again.
func TestQoSToSSurvivesMove(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "pf")
	c := cni(t)

	// What operators hit without rdmaQoS: set on the host, gone after the move.
	writeToS(t, n.RDMA, 106)
	plain := chain(t, "rdma-plain", n.Netdev, 70, nil)
	p0 := newPod(t, "plain")
	mustAdd(t, c, plain, p0.rt("net1"))
	lost := readToS(t, n.RDMA)
	t.Logf("ToS 106 set on the host reads %d after the move without rdmaQoS", lost)
	mustDel(t, c, plain, p0.rt("net1"))
	os.Remove(filepath.Join(cmConfigfs, n.RDMA))

	l := chain(t, "rdma-qos", n.Netdev, 71, map[string]any{"rdmaQoS": map[string]any{"tos": 106}})
	p := newPod(t, "qos")
	mustAdd(t, c, l, p.rt("net1"))
	wantRDMA(t, n.RDMA, []string{p.path()}, []string{""})
	if got := readToS(t, n.RDMA); got != 106 {
		t.Fatalf("ToS of %s in the pod is %d, want 106\n%s", n.RDMA, got, tailLog())
	}
	if err := c.CheckNetworkList(context.Background(), l, p.rt("net1")); err != nil {
		t.Fatalf("CHECK with rdmaQoS applied: %v", err)
	}
	writeToS(t, n.RDMA, 0)
	err := c.CheckNetworkList(context.Background(), l, p.rt("net1"))
	wantErrContains(t, err, "rdmaQoS no longer holds", n.RDMA, "want 106")
	mustDel(t, c, l, p.rt("net1"))
	wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	if _, err := os.Stat(filepath.Join(cmConfigfs, n.RDMA)); !os.IsNotExist(err) {
		t.Fatalf("rdma_cm group of %s left behind after DEL (%v)", n.RDMA, err)
	}
	wantNoRecords(t)
}

// soft-RoCE has no per-port traffic class: asking for one fails clearly and
// the device goes back to the host.
func TestQoSTrafficClassUnsupportedRollsBack(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "child")
	c := cni(t)
	l := chain(t, "rdma-tc", n.Netdev, 72, map[string]any{"rdmaQoS": map[string]any{"tc": 3}})
	p := newPod(t, "tc")
	_, err := add(t, c, l, p.rt("net1"))
	wantErrContains(t, err, "cannot apply rdmaQoS", n.RDMA, "exposes no traffic class")
	wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	wantNoRecords(t)
	mustDel(t, c, l, p.rt("net1"))
}

func TestRenameInPod(t *testing.T) {
	requireMode(t, "exclusive")
	n, c, l, p := attachedPod(t, "udev", "rdma-name", 73, map[string]any{"rdmaDevName": "rdma_net1"}, "name")
	wantRDMA(t, "rdma_net1", []string{p.path()}, []string{""})
	wantRDMA(t, n.RDMA, nil, []string{p.path(), ""})
	if nd, err := rdmaLinkNetdev(p.path(), "rdma_net1"); err != nil || nd != "net1" {
		t.Fatalf("`rdma link` shows %q on rdma_net1/1 (%v), want net1", nd, err)
	}
	if err := c.CheckNetworkList(context.Background(), l, p.rt("net1")); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	mustDel(t, c, l, p.rt("net1"))
	wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	wantRDMA(t, "rdma_net1", nil, []string{""})
	wantNoRecords(t)
}

// The pod chooses the name through CNI_ARGS, within the prefix its network
// allows; its netns dies before DEL and the kernel returns the device under
// the pod's name: DEL restores it.
func TestRenameRestoredAfterNetnsDeletion(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "pf")
	c := cni(t)
	l := chain(t, "rdma-name2", n.Netdev, 74, map[string]any{"podRdmaDevNamePrefix": "nccl_"})
	p := newPod(t, "name2")
	rt := p.rt("net1")
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"rdmaDevName", "nccl_hca0"}}
	mustAdd(t, c, l, rt)
	wantRDMA(t, "nccl_hca0", []string{p.path()}, []string{""})
	p.destroy()
	wantRDMA(t, "nccl_hca0", []string{""}, nil)
	rt.NetNS = ""
	mustDel(t, c, l, rt)
	wantRDMA(t, n.RDMA, []string{""}, nil)
	wantRDMA(t, "nccl_hca0", nil, []string{""})
	wantNoRecords(t)
}

func TestRenameClashRefused(t *testing.T) {
	requireMode(t, "exclusive")
	n, other := nics[0], nics[1]
	c := cni(t)
	l := chain(t, "rdma-clash", n.Netdev, 75, map[string]any{"rdmaDevName": other.RDMA})
	p := newPod(t, "clash")
	before, _ := rdmaDevs("")
	_, err := add(t, c, l, p.rt("net1"))
	wantErrContains(t, err, other.RDMA, "already has a device of that name")
	if after, _ := rdmaDevs(""); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("host RDMA devices changed: %v -> %v", before, after)
	}
	wantNoRecords(t)
	mustDel(t, c, l, p.rt("net1"))
}
