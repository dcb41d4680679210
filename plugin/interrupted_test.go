package plugin

import (
	"testing"
	"time"
)

// An ADD or DEL killed between moving a device and renaming it leaves the
// device in the pod under its host name while the record names the pod
// name. A retried ADD and a DEL must both still find it (found by
// e2e/stress's SIGKILL rounds).
func TestKilledBetweenMoveAndRename(t *testing.T) {
	for _, verb := range []string{"ADD", "DEL"} {
		t.Run(verb, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			conf := e.netconf(p, "1.1.0", map[string]any{"rdmaDevName": "roce0"})
			if _, err := e.add(p, conf, ""); err != nil {
				t.Fatal(err)
			}
			// Undo the rename behind the plugin's back: the state a kill
			// between MoveToNetns and Rename (ADD), or between Rename and
			// MoveToHost (DEL), leaves.
			if err := e.kernel.Rename(p.path(), "roce0", "rxe1"); err != nil {
				t.Fatal(err)
			}
			if verb == "ADD" {
				if _, err := e.add(p, conf, ""); err != nil {
					t.Fatalf("retried ADD: %v", err)
				}
				e.wantWhere("roce0", p.path())
				e.wantWhere("rxe1", "<absent>")
				if len(e.records()) != 1 {
					t.Fatalf("records after the retried ADD: %+v", e.records())
				}
			}
			if err := e.del(p, conf); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.wantWhere("rxe1", "host")
			if len(e.records()) != 0 {
				t.Fatalf("records left: %+v", e.records())
			}
		})
	}
}

// The kernel returns the devices of a deleted netns asynchronously; a DEL
// that runs first must wait for a renamed device to give it its name back
// (found by e2e/stress: the device stayed in the host under its pod name).
func TestDelWaitsForDeviceOfDeletedNetns(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", map[string]any{"rdmaDevName": "roce0"})
	if _, err := e.add(p, conf, ""); err != nil {
		t.Fatal(err)
	}
	e.deleteNetns(p)
	e.kernel.mu.Lock()
	delete(e.kernel.where, "roce0") // still on its way back
	e.kernel.mu.Unlock()
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.kernel.mu.Lock()
		e.kernel.where["roce0"] = ""
		e.kernel.mu.Unlock()
	}()
	if err := e.del(p, conf); err != nil {
		t.Fatal(err)
	}
	e.wantWhere("rxe1", "host")
	e.wantWhere("roce0", "<absent>")
}
