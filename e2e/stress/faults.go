package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// raceAdds starts two pods' ADDs for the same named device at the same
// moment: exactly one may win, the loser must get a clear error, and both
// DELs must leave the device in the host.
func raceAdds(n rig.NIC) {
	for r := 0; r < *races; r++ {
		st.races.Add(1)
		a, errA := rig.NewPod()
		b, errB := rig.NewPod()
		if errA != nil || errB != nil {
			failf("race: %v %v", errA, errB)
			return
		}
		calls := []rig.Call{}
		for i, p := range []*rig.Pod{a, b} {
			calls = append(calls, rig.Call{Verb: "ADD", ContainerID: fmt.Sprintf("race%d-%c", r, 'a'+i), Netns: p.Path(), IfName: "net1",
				Stdin: rig.PluginConf("stress-race", "net1", p.Path(), map[string]any{"rdmaDevice": n.RDMA})})
		}
		res := make([]rig.Run, 2)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range calls {
			wg.Add(1)
			go func(i int) { defer wg.Done(); <-gate; res[i] = rig.Exec(calls[i]) }(i)
		}
		close(gate)
		wg.Wait()
		wins := 0
		winner := -1
		for i, x := range res {
			if !x.Failed() {
				wins++
				winner = i
			}
		}
		if wins != 1 {
			failf("race %d: %d of 2 racing ADDs for %s succeeded (%q / %q)", r, wins, n.RDMA, res[0].Msg(), res[1].Msg())
		} else {
			st.raceWins.Add(1)
			loser := res[1-winner]
			msg := loser.Msg()
			if !strings.Contains(msg, n.RDMA) || !(strings.Contains(msg, "held by") || strings.Contains(msg, "not in the host")) {
				failf("race %d: the loser's error does not say who has %s: %q", r, n.RDMA, msg)
			} else if r == 0 {
				observe("race loser's error (example): %s", firstLine(msg))
			}
			pw := []*rig.Pod{a, b}[winner]
			if !in(pw.Path(), n.RDMA) {
				failf("race %d: the winner's pod lacks %s", r, n.RDMA)
			}
			if recs := rig.Records(rig.StateDir); len(recs) != 1 {
				failf("race %d: %d records after the race, want 1", r, len(recs))
			}
		}
		// Tear down in a random order; the loser's DEL has nothing to do.
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			c := calls[i]
			c.Verb = "DEL"
			if x := rig.Exec(c); x.Failed() {
				failf("race %d: DEL of pod %c: %s", r, 'a'+i, x.Msg())
			}
		}
		if !in("", n.RDMA) {
			failf("race %d: %s not back in the host after both DELs", r, n.RDMA)
		}
		a.Destroy()
		b.Destroy()
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// attachment is a pod with a NIC's netdev moved in (as host-device would
// have done) and the rdma-netns calls for it.
type attachment struct {
	nic   rig.NIC
	pod   *rig.Pod
	add   rig.Call
	inPod string
}

func newAttachment(n rig.NIC, id string, extra map[string]any) (*attachment, error) {
	pod, err := rig.NewPod()
	if err != nil {
		return nil, err
	}
	if err := rig.MoveNetdevIn(n.Netdev, pod.Path()); err != nil {
		pod.Destroy()
		return nil, err
	}
	if extra == nil {
		extra = map[string]any{}
	}
	a := &attachment{nic: n, pod: pod, inPod: n.RDMA,
		add: rig.Call{Verb: "ADD", ContainerID: id, Netns: pod.Path(), IfName: n.Netdev,
			Stdin: rig.PluginConf("stress-fault", n.Netdev, pod.Path(), extra)}}
	if name, ok := extra["rdmaDevName"].(string); ok {
		a.inPod = name
	}
	return a, nil
}

func (a *attachment) del() rig.Call { c := a.add; c.Verb = "DEL"; return c }

// attachedOK says whether the device is in the pod under its pod name and
// gone from the host.
func (a *attachment) attachedOK() error {
	if !in(a.pod.Path(), a.inPod) {
		devs, _ := rig.RDMAIn(a.pod.Path())
		return fmt.Errorf("%s not in the pod (pod has %v)", a.inPod, devs)
	}
	if in("", a.nic.RDMA) {
		return fmt.Errorf("%s still in the host", a.nic.RDMA)
	}
	return nil
}

// detachedOK says whether the device is back in the host under its name.
func (a *attachment) detachedOK() error {
	if !in("", a.nic.RDMA) {
		devs, _ := rig.RDMAIn(a.pod.Path())
		return fmt.Errorf("%s not in the host (pod has %v)", a.nic.RDMA, devs)
	}
	return nil
}

// close returns the netdev and destroys the pod.
func (a *attachment) close() {
	rig.MoveNetdevOut(a.nic.Netdev, a.pod.Path())
	a.pod.Destroy()
	rig.WaitHome([]rig.NIC{a.nic}, 5*time.Second)
}

// killRounds SIGKILLs the plugin after a random delay during ADD and DEL,
// then retries the same verb (or, as a runtime giving up on a pod would,
// DEL after a killed ADD), and checks the end state each time.
func killRounds(nics []rig.NIC, rng *rand.Rand) {
	// Calibrate the delay range on this machine: an unkilled ADD and DEL.
	a, err := newAttachment(nics[0], "kill-calibrate", nil)
	if err != nil {
		failf("kill: %v", err)
		return
	}
	var addT, delT time.Duration
	for i := 0; i < 3; i++ {
		r := rig.Exec(a.add)
		d := rig.Exec(a.del())
		if r.Failed() || d.Failed() {
			failf("kill calibration: %s / %s", r.Msg(), d.Msg())
		}
		addT, delT = max(addT, r.Wall), max(delT, d.Wall)
	}
	a.close()
	logf("kill: ADD takes up to %s, DEL %s here; kills land in 0..%s", addT.Round(time.Millisecond), delT.Round(time.Millisecond), (addT * 5 / 4).Round(time.Millisecond))

	for k := 0; k < *kills; k++ {
		n := nics[k%len(nics)]
		var extra map[string]any
		if k%2 == 1 {
			extra = map[string]any{"rdmaDevName": fmt.Sprintf("killed%d", k%len(nics))}
		}
		a, err := newAttachment(n, fmt.Sprintf("kill-%d", k), extra)
		if err != nil {
			failf("kill %d: %v", k, err)
			return
		}
		delay := time.Duration(rng.Int64N(int64(addT*5/4) + 1))
		r := rig.ExecKill(a.add, delay)
		fault("SIGKILL during ADD")
		if r.Killed {
			st.killedMidFlight.Add(1)
		}
		if k%3 == 2 {
			// The runtime gives up on the pod: DEL must clean up.
			if d := rig.Exec(a.del()); d.Failed() {
				failf("kill %d: DEL after a killed ADD (killed after %s): %s", k, delay, d.Msg())
			}
			if err := a.detachedOK(); err != nil {
				failf("kill %d: DEL after a killed ADD (killed after %s): %v", k, delay, err)
			}
		} else {
			if x := rig.Exec(a.add); x.Failed() {
				failf("kill %d: ADD retried after a kill at %s: %s", k, delay, x.Msg())
			} else if err := a.attachedOK(); err != nil {
				failf("kill %d: ADD retried after a kill at %s: %v", k, delay, err)
			}
			delay = time.Duration(rng.Int64N(int64(delT*5/4) + 1))
			d := rig.ExecKill(a.del(), delay)
			fault("SIGKILL during DEL")
			if d.Killed {
				st.killedMidFlight.Add(1)
			}
			if x := rig.Exec(a.del()); x.Failed() {
				failf("kill %d: DEL retried after a kill at %s: %s", k, delay, x.Msg())
			}
			if err := a.detachedOK(); err != nil {
				failf("kill %d: DEL retried after a kill at %s: %v", k, delay, err)
			}
		}
		if recs := rig.Records(rig.StateDir); len(recs) > 0 {
			failf("kill %d: records left: %v", k, recs)
		}
		if temps := tempFiles(rig.StateDir); len(temps) > 0 {
			// A writer killed between creating its temp file and renaming
			// it leaves the file; the plugin removes such files only once
			// they are 10 minutes old.
			st.tempLeft.Add(int64(len(temps)))
			observe("a SIGKILL between a state write's temp file and its rename leaves %s/.tmp-* behind (removed by List only after 10 min)", rig.StateDir)
			for _, t := range temps {
				os.Remove(filepath.Join(rig.StateDir, t))
			}
		}
		a.close()
	}
}

// corruptState replaces an attachment's record with garbage, then checks
// that it blocks nobody: another pod's ADD succeeds (the file is moved
// aside to damaged/), a retried ADD of the attachment finds its device
// already in the pod, and DEL returns the device.
func corruptState(n, other rig.NIC) {
	garbage := []struct {
		name string
		f    func([]byte) []byte
	}{
		{"truncated to 0 bytes", func([]byte) []byte { return nil }},
		{"truncated to half", func(b []byte) []byte { return b[:len(b)/2] }},
		{"random bytes", func(b []byte) []byte {
			out := make([]byte, len(b))
			for i := range out {
				out[i] = byte(i*131 + 7)
			}
			return out
		}},
		{"valid JSON of another schema", func([]byte) []byte { return []byte(`{"version":99,"hello":"world"}`) }},
	}
	for gi, g := range garbage {
		fault("corrupt state file")
		a, err := newAttachment(n, fmt.Sprintf("corrupt-%d", gi), nil)
		if err != nil {
			failf("corrupt: %v", err)
			return
		}
		if r := rig.Exec(a.add); r.Failed() {
			failf("corrupt %s: ADD: %s", g.name, r.Msg())
			a.close()
			continue
		}
		recs := rig.Records(rig.StateDir)
		if len(recs) != 1 {
			failf("corrupt %s: %d records after ADD", g.name, len(recs))
			a.close()
			continue
		}
		path := filepath.Join(rig.StateDir, recs[0])
		data, _ := os.ReadFile(path)
		os.WriteFile(path, g.f(data), 0o600)

		// Another pod's ADD while the node has an unreadable record.
		b, err := newAttachment(other, fmt.Sprintf("corrupt-other-%d", gi), nil)
		if err != nil {
			failf("corrupt: %v", err)
			return
		}
		if r := rig.Exec(b.add); r.Failed() {
			failf("corrupt %s: another pod's ADD with an unreadable record on the node: %s", g.name, r.Msg())
		} else if err := b.attachedOK(); err != nil {
			failf("corrupt %s: another pod's ADD: %v", g.name, err)
		}
		if damaged := rig.StateFiles(filepath.Join(rig.StateDir, "damaged")); len(damaged) != 1 {
			failf("corrupt %s: %d files moved aside to damaged/, want 1", g.name, len(damaged))
		}
		// Retried ADD of the attachment whose record was lost.
		if r := rig.Exec(a.add); r.Failed() {
			failf("corrupt %s: retried ADD of the attachment whose record was damaged: %s", g.name, r.Msg())
		} else if err := a.attachedOK(); err != nil {
			failf("corrupt %s: retried ADD succeeded but: %v", g.name, err)
		}
		if r := rig.Exec(a.del()); r.Failed() {
			failf("corrupt %s: DEL with a corrupt record: %s", g.name, r.Msg())
		}
		if r := rig.Exec(b.del()); r.Failed() {
			failf("corrupt %s: DEL of the other pod: %s", g.name, r.Msg())
		}
		if in(a.pod.Path(), a.nic.RDMA) {
			failf("corrupt %s: DEL left the device in the pod", g.name)
		}
		os.RemoveAll(filepath.Join(rig.StateDir, "damaged"))
		a.close()
		b.close()
		if missing, err := rig.WaitHome([]rig.NIC{n, other}, 5*time.Second); err != nil || len(missing) > 0 {
			failf("corrupt %s: not home after the pod netns was deleted: %v %v", g.name, missing, err)
		}
		if files := rig.StateFiles(rig.StateDir); len(files) > 0 {
			failf("corrupt %s: state files left: %v", g.name, files)
		}
	}
}

func mount(args ...string) error {
	out, err := exec.Command("mount", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// unwritableState runs ADD against a state directory that cannot be
// written: read-only from the start (nothing may change), and one that has
// room for the "moving" record but not for the "attached" one, so the
// device has moved when the write fails and must be moved back. Each is a
// tmpfs over the node's state directory (the plugin's only one), the
// node's records hidden below it meanwhile.
func unwritableState(n rig.NIC) {
	// Read-only.
	dir := rig.StateDir
	os.MkdirAll(dir, 0o700)
	if err := mount("-t", "tmpfs", "-o", "mode=0700", "tmpfs", dir); err != nil {
		failf("%v", err)
		return
	}
	defer exec.Command("umount", dir).Run()
	for _, rename := range []bool{false, true} {
		var extra map[string]any
		if rename {
			extra = map[string]any{"rdmaDevName": "rostate0"}
		}
		a, err := newAttachment(n, "ro-state", extra)
		if err != nil {
			failf("ro: %v", err)
			return
		}
		// A first ADD/DEL creates the lock file, as on a node in use.
		if r := rig.Exec(a.add); r.Failed() {
			failf("ro: ADD on a writable dir: %s", r.Msg())
		}
		if r := rig.Exec(a.del()); r.Failed() {
			failf("ro: DEL on a writable dir: %s", r.Msg())
		}
		if err := mount("-o", "remount,ro", dir); err != nil {
			failf("%v", err)
			a.close()
			return
		}
		fault("read-only state directory")
		r := rig.Exec(a.add)
		if !r.Failed() {
			failf("ro: ADD succeeded on a read-only state directory")
		} else {
			observe("ADD with a read-only state directory: %s", firstLine(r.Msg()))
		}
		if err := a.detachedOK(); err != nil {
			failf("ro: after the failed ADD: %v", err)
		}
		if r := rig.Exec(a.del()); r.Failed() {
			observe("DEL with a read-only state directory: %s", firstLine(r.Msg()))
		}
		mount("-o", "remount,rw", dir)
		if files := rig.StateFiles(dir); len(files) > 0 {
			failf("ro: files left in %s: %v", dir, files)
		}
		a.close()
	}

	// The state write after the move fails. Before the move the directory
	// holds root + lock, the attachment's lock (its directory and file) and
	// the device's (the same): 6 inodes. A renamed device's record is
	// written before the move too (7), and the rewrite after the move finds
	// no room. A plain move writes its record only after the move.
	full := rig.StateDir
	for _, rename := range []bool{false, true} {
		inodes := 6
		if rename {
			inodes = 7
		}
		if err := mount("-t", "tmpfs", "-o", fmt.Sprintf("mode=0700,nr_inodes=%d", inodes), "tmpfs", full); err != nil {
			failf("%v", err)
			return
		}
		os.WriteFile(filepath.Join(full, "lock"), nil, 0o600)
		var extra map[string]any
		if rename {
			extra = map[string]any{"rdmaDevName": "fullstate0"}
		}
		a, err := newAttachment(n, "full-state", extra)
		if err != nil {
			failf("full: %v", err)
			exec.Command("umount", full).Run()
			return
		}
		fault("state write fails after the move")
		r := rig.Exec(a.add)
		if !r.Failed() {
			failf("full: ADD succeeded although the attached record cannot be written")
		} else {
			observe("ADD whose state write after the move fails (rename %v): %s", rename, firstLine(r.Msg()))
		}
		if err := a.detachedOK(); err != nil {
			failf("full (rename %v): ADD did not roll the move back: %v", rename, err)
		}
		if in(a.pod.Path(), a.inPod) {
			failf("full (rename %v): %s still in the pod", rename, a.inPod)
		}
		if files := rig.StateFiles(full); len(files) > 0 {
			failf("full (rename %v): files left in the state dir: %v", rename, files)
		}
		a.close()
		exec.Command("umount", full).Run()
	}
}

func tempFiles(dir string) []string {
	var out []string
	for _, f := range rig.StateFiles(dir) {
		if strings.HasPrefix(f, ".tmp-") {
			out = append(out, f)
		}
	}
	return out
}
