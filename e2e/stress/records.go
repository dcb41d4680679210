package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// rebootRounds: every pod netns deleted at once without DEL, as a node
// reboot or a crashed runtime leaves them, with all records behind. The
// pods' new sandboxes must get the same devices (one renamed in the pod),
// and the late DELs of the old sandboxes must change nothing.
func rebootRounds(nics []rig.NIC, rounds int) {
	for r := 0; r < rounds; r++ {
		fault("reboot: every pod netns deleted without DEL")
		var old []*attachment
		for i, n := range nics {
			a, err := bootSandbox(n, r, i, "old")
			if err != nil {
				failf("reboot: %v", err)
				return
			}
			if res := rig.Exec(a.add); res.Failed() {
				failf("reboot %d: ADD before the reboot: %s", r, res.Msg())
			}
			old = append(old, a)
		}
		for _, a := range old {
			a.pod.Destroy()
		}
		// The kernel returns the renamed device under its pod-side name.
		if missing, _ := rig.WaitHome(nics[1:], 5*time.Second); len(missing) > 0 {
			failf("reboot %d: not back after the netns were deleted: %v", r, missing)
		}
		if n := len(rig.Records(rig.StateDir)); n != len(nics) {
			failf("reboot %d: %d records left by the reboot, want %d", r, n, len(nics))
		}
		var fresh []*attachment
		for i, n := range nics {
			a, err := bootSandbox(n, r, i, "new")
			if err != nil {
				failf("reboot: %v", err)
				return
			}
			if res := rig.Exec(a.add); res.Failed() {
				failf("reboot %d: ADD of the new sandbox for %s: %s", r, n.RDMA, res.Msg())
			} else if err := a.attachedOK(); err != nil {
				failf("reboot %d: new sandbox: %v", r, err)
			}
			fresh = append(fresh, a)
		}
		for _, a := range old {
			del := a.del()
			del.Netns = ""
			if res := rig.Exec(del); res.Failed() {
				failf("reboot %d: late DEL of an old sandbox: %s", r, res.Msg())
			}
		}
		for _, a := range fresh {
			if err := a.attachedOK(); err != nil {
				failf("reboot %d: a late DEL of an old sandbox took a device: %v", r, err)
			}
			if res := rig.Exec(a.del()); res.Failed() {
				failf("reboot %d: DEL of the new sandbox: %s", r, res.Msg())
			}
			a.close()
		}
	}
}

// bootSandbox is reboot round r's sandbox (age "old" before the reboot,
// "new" after) for the i-th NIC; the first NIC's device is renamed in the
// pod, so that the kernel returns one device under its pod-side name.
func bootSandbox(n rig.NIC, r, i int, age string) (*attachment, error) {
	var extra map[string]any
	if i == 0 {
		extra = map[string]any{"rdmaDevName": fmt.Sprintf("boot%d", r)}
	}
	return newAttachment(n, fmt.Sprintf("boot-%d-%d-%s", r, i, age), extra)
}

// wipedState: the state directory is wiped while pods hold their devices
// (node image restored); DEL must still return every device.
func wipedState(nics []rig.NIC) {
	fault("state directory wiped while pods hold devices")
	var as []*attachment
	for i, n := range nics {
		a, err := newAttachment(n, fmt.Sprintf("wiped-%d", i), nil)
		if err != nil {
			failf("wiped: %v", err)
			return
		}
		if res := rig.Exec(a.add); res.Failed() {
			failf("wiped: ADD: %s", res.Msg())
		}
		as = append(as, a)
	}
	for _, name := range rig.StateFiles(rig.StateDir) {
		os.RemoveAll(filepath.Join(rig.StateDir, name))
	}
	for _, a := range as {
		if res := rig.Exec(a.del()); res.Failed() {
			failf("wiped: DEL without a record: %s", res.Msg())
		}
		if err := a.detachedOK(); err != nil {
			failf("wiped: DEL without a record left the device: %v", err)
		}
		a.close()
	}
}
