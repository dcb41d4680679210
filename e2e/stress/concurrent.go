package main

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

type member struct {
	id   int
	pod  *rig.Pod
	nic  rig.NIC
	call rig.Call
}

// concurrentAddDel runs ADD and DEL from many pods at once, two pods per
// device, each pod sometimes racing its own DEL against its ADD (a runtime
// giving up on a slow ADD): ADDs and DELs of other devices overlap, those
// of one device contend. A device never has two owners, a successful ADD
// leaves the device in its pod, every DEL succeeds, and when a pod's
// calls are done its record exists exactly when its device is in the pod.
func concurrentAddDel(nics []rig.NIC, seed uint64) {
	var members []*member
	for i := 0; i < 2*len(nics); i++ {
		p, err := rig.NewPod()
		if err != nil {
			failf("concurrent: %v", err)
			return
		}
		defer p.Destroy()
		n := nics[i%len(nics)]
		id := fmt.Sprintf("conc-%d", i)
		members = append(members, &member{i, p, n, rig.Call{Verb: "ADD", ContainerID: id, Netns: p.Path(), IfName: "net1",
			Stdin: rig.PluginConf("stress-concurrent", "net1", p.Path(), map[string]any{"rdmaDevice": n.RDMA})}})
	}
	var mu sync.Mutex
	owner := map[string]int{}
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func(m *member, rng *rand.Rand) {
			defer wg.Done()
			del := m.call
			del.Verb = "DEL"
			for r := 0; r < *concurrent; r++ {
				st.concurrentCalls.Add(2)
				if rng.IntN(4) == 0 {
					// ADD and DEL of this attachment at once: either order
					// is allowed, a half-done mix of them is not.
					var add rig.Run
					done := make(chan struct{})
					go func() { add = rig.Exec(m.call); close(done) }()
					d := rig.Exec(del)
					<-done
					if d.Failed() {
						failf("concurrent: DEL of pod %d racing its ADD: %s", m.id, d.Msg())
					}
					if !add.Failed() {
						st.concurrentWins.Add(1)
					}
					m.consistent("ADD and DEL at once")
				} else if add := rig.Exec(m.call); !add.Failed() {
					st.concurrentWins.Add(1)
					mu.Lock()
					if o, held := owner[m.nic.RDMA]; held {
						failf("concurrent: pods %d and %d both hold %s", o, m.id, m.nic.RDMA)
					}
					owner[m.nic.RDMA] = m.id
					mu.Unlock()
					if !in(m.pod.Path(), m.nic.RDMA) {
						failf("concurrent: pod %d's ADD of %s succeeded but its pod lacks it", m.id, m.nic.RDMA)
					}
					mu.Lock()
					delete(owner, m.nic.RDMA)
					mu.Unlock()
				}
				if d := rig.Exec(del); d.Failed() {
					failf("concurrent: DEL of pod %d: %s", m.id, d.Msg())
				}
				m.consistent("DEL")
			}
		}(m, rand.New(rand.NewPCG(seed, uint64(m.id))))
	}
	wg.Wait()
}

// consistent checks the pod's record against the kernel once its calls
// are done: a record exactly while the pod holds the device.
func (m *member) consistent(after string) {
	store, err := state.Open(rig.StateDir)
	if err != nil {
		failf("concurrent: %v", err)
		return
	}
	_, err = store.Get(state.Key{Network: "stress-concurrent", ContainerID: m.call.ContainerID, IfName: m.call.IfName})
	recorded := err == nil
	if held := in(m.pod.Path(), m.nic.RDMA); recorded != held {
		failf("concurrent: after %s, pod %d has a record: %v, holds %s: %v", after, m.id, recorded, m.nic.RDMA, held)
	}
}
