package plugin

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// quietAdd and quietDel run the verbs as the runtime does, from several
// goroutines at once, without printing results.
func (e *env) quietAdd(p pod, conf []byte) error {
	quiet := *e.plugin
	quiet.Out = io.Discard
	return quiet.Add(&skel.CmdArgs{ContainerID: p.id, Netns: p.path(), IfName: p.ifName, StdinData: conf})
}

func (e *env) quietDel(p pod, conf []byte) error {
	return e.plugin.Del(&skel.CmdArgs{ContainerID: p.id, Netns: p.path(), IfName: p.ifName, StdinData: conf})
}

// holdMove makes the next move of dev into a pod wait until release is
// called; started is closed when that move begins.
func (e *env) holdMove(dev string) (started chan struct{}, release func()) {
	started, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.kernel.mu.Lock()
	e.kernel.beforeMoveIn = func(d string) {
		if d == dev {
			once.Do(func() {
				close(started)
				<-gate
			})
		}
	}
	e.kernel.mu.Unlock()
	var released sync.Once
	return started, func() { released.Do(func() { close(gate) }) }
}

// attachmentLocks lists the attachment lock files left in the state dir.
func (e *env) attachmentLocks() []string {
	entries, _ := os.ReadDir(filepath.Join(e.stateDir, state.AttachmentLockDir))
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

// A pod's ADD in the middle of its device's move holds up neither the ADD
// nor the DEL of another pod on another device: only what decides which
// device is whose is serialized node-wide, not the kernel's move.
func TestMoveOfOneDeviceDoesNotHoldUpOthers(t *testing.T) {
	e := newEnv(t)
	slow := e.newPod("slow", "net1", "virtio", "virtio1")
	other := e.newPod("other", "net1", "virtio", "virtio2")
	started, release := e.holdMove("rxe1")
	defer release()
	done := make(chan error, 1)
	go func() { done <- e.quietAdd(slow, e.netconf(slow, "1.1.0", nil)) }()
	<-started

	conf := e.netconf(other, "1.1.0", nil)
	if err := e.quietAdd(other, conf); err != nil {
		t.Fatalf("ADD of rxe2 while rxe1 moves: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe2", other.path())
	if err := e.quietDel(other, conf); err != nil {
		t.Fatalf("DEL of rxe2 while rxe1 moves: %v", err)
	}
	e.wantWhere("rxe2", "host")

	release()
	if err := <-done; err != nil {
		t.Fatalf("ADD of rxe1: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe1", slow.path())
	if recs := e.records(); len(recs) != 1 || recs[0].Device != "rxe1" || recs[0].State != state.StateAttached {
		t.Fatalf("records = %+v, want rxe1 attached", recs)
	}
}

// The record an ADD writes before its move (a renamed device's) is that
// ADD's while it moves: another pod's ADD, which drops the records the
// kernel shows stale, must not take the device still in the host for a
// leftover and drop the record the move's undo depends on.
func TestRecordOfDeviceBeingMovedIsNotStale(t *testing.T) {
	e := newEnv(t)
	slow := e.newPod("slow", "net1", "virtio", "virtio1")
	other := e.newPod("other", "net1", "virtio", "virtio2")
	started, release := e.holdMove("rxe1")
	defer release()
	done := make(chan error, 1)
	go func() { done <- e.quietAdd(slow, e.netconf(slow, "1.1.0", map[string]any{"rdmaDevName": "podrdma0"})) }()
	<-started

	if err := e.quietAdd(other, e.netconf(other, "1.1.0", nil)); err != nil {
		t.Fatalf("ADD of rxe2 while rxe1 moves: %v", err)
	}
	var slowRec *state.Record
	for _, r := range e.records() {
		if r.ContainerID == "slow" {
			slowRec = r
		}
	}
	if slowRec == nil || slowRec.State != state.StateMoving || slowRec.PodName != "podrdma0" {
		t.Fatalf("the moving ADD's record was dropped by the other ADD: %+v\nlog:\n%s", e.records(), e.log)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("ADD of rxe1: %v", err)
	}
	e.wantWhere("podrdma0", slow.path())
	if len(e.records()) != 2 {
		t.Fatalf("records = %+v, want both attachments", e.records())
	}
}

// A DEL issued while its attachment's ADD is still moving the device (a
// runtime giving up on a slow ADD) waits for the ADD and undoes it: the
// device ends in the host with no record, not in the pod with one.
func TestDelDuringAddOfSameAttachment(t *testing.T) {
	e := newEnv(t)
	p := e.newPod("c1", "net1", "virtio", "virtio1")
	conf := e.netconf(p, "1.1.0", nil)
	started, release := e.holdMove("rxe1")
	defer release()
	added := make(chan error, 1)
	go func() { added <- e.quietAdd(p, conf) }()
	<-started
	deleted := make(chan error, 1)
	go func() { deleted <- e.quietDel(p, conf) }()
	// Let the DEL reach its lock; if it ran first the ADD would leave the
	// device in the pod, recorded, after a successful DEL.
	time.Sleep(50 * time.Millisecond)
	release()
	if err := <-added; err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("DEL: %v", err)
	}
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
	if locks := e.attachmentLocks(); len(locks) != 0 {
		t.Fatalf("attachment locks left: %v", locks)
	}
}

// Pods on the same and on different devices ADD and DEL at once, over and
// over: a device never has two owners (two ADDs of one device never both
// succeed until the winner's DEL), every DEL succeeds, and at the end every
// device is home with no record and no lock of an attachment left.
func TestConcurrentAddDelOnSameAndOtherDevices(t *testing.T) {
	e := newEnv(t)
	devs := []string{"rxe1", "rxe2", "mlx5_0", "mlx5_2"}
	type member struct {
		pod  pod
		dev  string
		conf []byte
	}
	var members []member
	for i := 0; i < 2*len(devs); i++ {
		dev := devs[i%len(devs)]
		p := e.newPod(fmt.Sprintf("pod-%d", i), "net1", "", "")
		members = append(members, member{p, dev, e.netconf(p, "1.1.0", map[string]any{"rdmaDevice": dev})})
	}
	var mu sync.Mutex
	owner := map[string]string{}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for _, m := range members {
		wg.Add(1)
		go func(m member) {
			defer wg.Done()
			for round := 0; round < 15; round++ {
				if err := e.quietAdd(m.pod, m.conf); err == nil {
					mu.Lock()
					if o := owner[m.dev]; o != "" {
						errs <- fmt.Errorf("%s and %s both hold %s", o, m.pod.id, m.dev)
					}
					owner[m.dev] = m.pod.id
					mu.Unlock()
					if where := e.kernel.location(m.dev); where != m.pod.path() {
						errs <- fmt.Errorf("%s's ADD of %s succeeded, the device is in %s", m.pod.id, m.dev, where)
					}
					mu.Lock()
					owner[m.dev] = ""
					mu.Unlock()
				}
				if err := e.quietDel(m.pod, m.conf); err != nil {
					errs <- fmt.Errorf("DEL of %s: %v", m.pod.id, err)
				}
			}
		}(m)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, d := range devs {
		e.wantWhere(d, "host")
	}
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
	if locks := e.attachmentLocks(); len(locks) != 0 {
		t.Fatalf("attachment locks left: %v", locks)
	}
}
