package plugin

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns/podnstest"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// A node reboot, a crashed runtime or a forced sandbox removal destroys
// pod netns without DEL: the kernel returns the devices and every record
// is left behind. The pods' new sandboxes must get their devices, and a
// late DEL of the old sandboxes must not touch them.
func TestRebootLeavesStaleRecords(t *testing.T) {
	e := newEnv(t)
	oldA := e.newPod("old-a", "net1", "virtio", "virtio1")
	oldB := e.newPod("old-b", "net1", "pci", "0000:3b:00.0")
	plain := e.netconf(oldA, "1.1.0", nil)
	renamed := e.netconf(oldB, "1.1.0", map[string]any{"rdmaDevName": "roce_b"})
	if _, err := e.add(oldA, plain, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.add(oldB, renamed, ""); err != nil {
		t.Fatal(err)
	}
	e.deleteNetns(oldA)
	e.deleteNetns(oldB)
	e.wantWhere("rxe1", "host")
	e.wantWhere("roce_b", "host") // back under its pod-side name

	newA := e.newPod("new-a", "net1", "virtio", "virtio1")
	newB := e.newPod("new-b", "net1", "pci", "0000:3b:00.0")
	if _, err := e.add(newA, e.netconf(newA, "1.1.0", nil), ""); err != nil {
		t.Fatalf("ADD of the new sandbox for rxe1: %v", err)
	}
	if _, err := e.add(newB, e.netconf(newB, "1.1.0", map[string]any{"rdmaDevName": "roce_b"}), ""); err != nil {
		t.Fatalf("ADD of the new sandbox for mlx5_0: %v", err)
	}
	e.wantWhere("rxe1", newA.path())
	e.wantWhere("roce_b", newB.path())
	e.wantWhere("mlx5_0", "<absent>")
	if recs := e.records(); len(recs) != 2 || recs[0].ContainerID != "new-a" || recs[1].ContainerID != "new-b" {
		t.Fatalf("records = %+v, want only the new sandboxes'", recs)
	}
	for _, want := range []string{"old-a/net1", "which is in the host", "renamed it back"} {
		if !strings.Contains(e.log.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, e.log)
		}
	}

	// The runtime's DEL of the old sandboxes comes late: nothing to do.
	if err := e.del(oldA, plain); err != nil {
		t.Fatal(err)
	}
	if err := e.del(oldB, renamed); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", newA.path())
	e.wantWhere("roce_b", newB.path())
}

// A stale record of another attachment on a device the host can see is
// not an owner: the ADD proceeds and the record goes.
func TestStaleRecordOfInterruptedAddDoesNotBlock(t *testing.T) {
	e := newEnv(t)
	a := e.newPod("pod-a", "net1", "virtio", "virtio1")
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	// What an ADD killed after writing "moving" leaves: the device never left.
	if err := st.Put(&state.Record{Key: state.Key{Network: "rdma-net", ContainerID: "killed", IfName: "net1"},
		Netns: a.path(), Device: "rxe1", State: state.StateMoving}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.add(a, e.netconf(a, "1.1.0", nil), ""); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", a.path())
	if recs := e.records(); len(recs) != 1 || recs[0].ContainerID != "pod-a" {
		t.Fatalf("records = %+v", recs)
	}
}

// The state directory wiped while a pod holds its device: DEL still finds
// the device from the kernel and returns it.
func TestDelWithoutRecordReturnsDevice(t *testing.T) {
	for _, tc := range []struct {
		name, devName string
		conf          map[string]any
	}{{"plain", "rxe1", nil}, {"renamed", "roce0", map[string]any{"rdmaDevName": "roce0"}}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			other := e.newPod("c2", "net2", "virtio", "virtio2")
			e.kernel.ports["rxe2"] = "net2"
			conf := e.netconf(p, "1.1.0", tc.conf)
			if _, err := e.add(p, conf, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := e.add(other, e.netconf(other, "1.1.0", nil), ""); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(e.stateDir); err != nil {
				t.Fatal(err)
			}
			if err := e.del(p, conf); err != nil {
				t.Fatalf("DEL without a record: %v", err)
			}
			e.wantWhere(tc.devName, "host")
			e.wantWhere("rxe2", other.path()) // another pod's device stays
			if tc.devName != "rxe1" {
				if !strings.Contains(e.log.String(), "host name is unknown") {
					t.Errorf("log does not warn that the host name is lost:\n%s", e.log)
				}
				st, err := state.New(e.stateDir)
				if err != nil {
					t.Fatal(err)
				}
				if notes, _ := st.LostNames(); !strings.Contains(notes[tc.devName], "host name is unknown") {
					t.Errorf("no note for rdma-netns doctor: %v", notes)
				}
			}
			if err := e.del(p, conf); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

// One damaged record blocks nobody: another pod's ADD works, the file is
// moved aside for the operator, and its own pod's DEL still returns the
// device.
func TestDamagedRecordBlocksNobody(t *testing.T) {
	e := newEnv(t)
	a := e.newPod("pod-a", "net1", "virtio", "virtio1")
	confA := e.netconf(a, "1.1.0", nil)
	if _, err := e.add(a, confA, ""); err != nil {
		t.Fatal(err)
	}
	st, err := state.New(e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	recA := st.Path(state.Key{Network: "rdma-net", ContainerID: "pod-a", IfName: "net1"})
	if err := os.WriteFile(recA, []byte("garbage{"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := e.newPod("pod-b", "net1", "virtio", "virtio2")
	if _, err := e.add(b, e.netconf(b, "1.1.0", nil), ""); err != nil {
		t.Fatalf("ADD with a damaged record on the node: %v", err)
	}
	e.wantWhere("rxe2", b.path())
	damaged, err := st.Damaged()
	if err != nil || len(damaged) != 1 {
		t.Fatalf("damaged = %v, %v; want the one file moved aside", damaged, err)
	}
	if data, _ := os.ReadFile(damaged[0]); string(data) != "garbage{" {
		t.Fatalf("moved-aside file holds %q", data)
	}
	if err := e.del(a, confA); err != nil {
		t.Fatalf("DEL of the pod whose record was damaged: %v", err)
	}
	e.wantWhere("rxe1", "host")
}

// A netns path such as /proc/PID/ns/net can later open another netns. A
// record of the old one must not make DEL take a device out of the new.
func TestReusedNetnsPathIsNotThePod(t *testing.T) {
	e := newEnv(t)
	a := e.newPod("pod-a", "net1", "virtio", "virtio1")
	conf := e.netconf(a, "1.1.0", nil)
	if _, err := e.add(a, conf, ""); err != nil {
		t.Fatal(err)
	}
	path := a.path()
	e.deleteNetns(a)
	mountNewNetnsAt(t, path)
	// Someone else's device now sits in the netns at the same path.
	if _, err := e.kernel.MoveToNetns("rxe1", path, rdmans.NoIndex); err != nil {
		t.Fatal(err)
	}
	if err := e.del(a, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", path)
	if len(e.records()) != 0 {
		t.Fatalf("records left: %+v", e.records())
	}
}

// A sandbox ID reused with a new netns at the same path: the old record
// is not this pod's, and the ADD starts afresh.
func TestSandboxIDReusedWithNewNetns(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	path := p.path()
	e.deleteNetns(p)
	mountNewNetnsAt(t, path)
	e.kernel.addNetdev(fakeNetdev{netns: path, name: "net1", bus: "virtio", parent: "virtio1"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", path)
	recs := e.records()
	if len(recs) != 1 {
		t.Fatalf("records = %+v", recs)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if recs[0].NetnsIno != st.Ino {
		t.Fatalf("record names netns inode %d, the pod's is %d", recs[0].NetnsIno, st.Ino)
	}
}

// mountNewNetnsAt bind-mounts a fresh network namespace at path, as a
// runtime reusing a name or the kernel reusing a PID does.
func mountNewNetnsAt(t *testing.T, path string) {
	t.Helper()
	if err := podnstest.MountNew(path); err != nil {
		t.Fatalf("mount a new netns at %s: %v", path, err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH); os.Remove(path) })
}

// The records wiped while a pod holds its device, then the runtime
// retries ADD: the device is already in the pod, the record comes back,
// and DEL returns the device.
func TestRetriedAddAfterRecordsLost(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(e.stateDir); err != nil {
		t.Fatal(err)
	}
	moves := e.kernel.moves
	if _, err := e.add(p, conf, "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0"); err != nil {
		t.Fatalf("retried ADD after the records were lost: %v", err)
	}
	if e.kernel.moves != moves {
		t.Fatal("the retried ADD moved a device")
	}
	recs := e.records()
	if len(recs) != 1 || recs[0].Device != "rxe1" || recs[0].State != state.StateAttached || recs[0].K8sPod != "trainer-0" || recs[0].K8sNamespace != "ml" {
		t.Fatalf("records = %+v", recs)
	}
	if err := e.del(p, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", "host")
}
