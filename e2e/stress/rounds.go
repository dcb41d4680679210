package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// stressPod is one pod of the random rounds: a NIC, its chain, and whether
// it is attached now.
type stressPod struct {
	mu       sync.Mutex
	i        int
	nic      rig.NIC
	inPod    string // the RDMA device's name inside the pod
	list     *libcni.NetworkConfigList
	pod      *rig.Pod
	id       string
	attached bool
	gen      int
}

// randomRounds runs ADD/DEL on random pods from several workers at once.
// Pods differ in how rdma-netns finds the device (netdev parent, deviceID,
// rename in the pod) so the rounds cover every resolution path; 1 in 8
// DELs happen after the pod netns was deleted (the kernel already returned
// the devices), as after a node-level cleanup.
func randomRounds(nics []rig.NIC, seed uint64) {
	cache, _ := os.MkdirTemp("", "stress-cni")
	defer os.RemoveAll(cache)
	c := rig.CNI(cache)
	ps := make([]*stressPod, len(nics))
	for i, n := range nics {
		extra := map[string]any{}
		p := &stressPod{i: i, nic: n, inPod: n.RDMA}
		switch i % 4 {
		case 1:
			p.inPod = fmt.Sprintf("spod%d", i)
			extra["rdmaDevName"] = p.inPod
		case 2:
			extra["deviceID"] = n.PCI
		}
		l, err := rig.Chain("stress-net", n.Netdev, i, extra)
		if err != nil {
			failf("chain: %v", err)
			return
		}
		p.list = l
		ps[i] = p
	}
	var left = int64(*rounds)
	var leftMu sync.Mutex
	take := func() bool {
		leftMu.Lock()
		defer leftMu.Unlock()
		if left <= 0 {
			return false
		}
		left--
		return true
	}
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for take() {
				p := ps[rng.IntN(len(ps))]
				p.mu.Lock()
				if p.attached {
					first := rng.IntN(8) == 0
					if *verbose {
						logf("worker %d: DEL pod %d (%s, netns deleted first: %v)", w, p.i, p.id, first)
					}
					p.del(c, first, rng)
				} else {
					if *verbose {
						logf("worker %d: ADD pod %d", w, p.i)
					}
					p.add(c)
				}
				p.mu.Unlock()
				st.rounds.Add(1)
			}
		}(w)
	}
	wg.Wait()
	for _, p := range ps {
		if p.attached {
			p.del(c, false, nil)
		}
	}
}

func (p *stressPod) rt() *libcni.RuntimeConf { return rig.RT(p.id, p.pod.Path(), "net1") }

func (p *stressPod) add(c *libcni.CNIConfig) {
	st.adds.Add(1)
	p.gen++
	p.id = fmt.Sprintf("stress-pod%d-%d", p.i, p.gen)
	pod, err := rig.NewPod()
	if err != nil {
		failf("pod %d: %v", p.i, err)
		return
	}
	p.pod = pod
	if err := rig.AddChain(c, p.list, p.rt()); err != nil {
		failf("pod %d ADD: %v; %s", p.i, err, where())
		rig.DelChain(c, p.list, p.rt())
		p.destroy()
		return
	}
	if !in(p.pod.Path(), p.inPod) {
		devs, _ := rig.RDMAIn(p.pod.Path())
		failf("pod %d: after ADD its RDMA device %s is not in the pod (pod has %v)", p.i, p.inPod, devs)
	}
	if in("", p.nic.RDMA) {
		failf("pod %d: after ADD %s is still in the host", p.i, p.nic.RDMA)
	}
	p.attached = true
}

func (p *stressPod) del(c *libcni.CNIConfig, netnsFirst bool, rng *rand.Rand) {
	st.dels.Add(1)
	rt := p.rt()
	if netnsFirst {
		fault("pod netns deleted before DEL")
		p.destroy()
		// containerd passes no netns once it is gone; CRI-O the old path.
		// host-device cannot work without one, so with the old path only
		// rdma-netns is called, as the chain's first DEL.
		if rng.IntN(2) == 0 {
			rt.NetNS = ""
		} else {
			r := rig.Exec(rig.Call{Verb: "DEL", ContainerID: p.id, Netns: rt.NetNS, IfName: "net1",
				Stdin: pluginEntry(p.list)})
			if r.Failed() {
				failf("pod %d: rdma-netns DEL after its netns was deleted: %s", p.i, r.Msg())
			}
			rt.NetNS = ""
		}
	}
	if err := rig.DelChain(c, p.list, rt); err != nil {
		failf("pod %d DEL: %v", p.i, err)
	}
	p.destroy()
	missing, err := rig.WaitHome([]rig.NIC{p.nic}, 5*time.Second)
	if err != nil || len(missing) > 0 {
		failf("pod %d (DEL after netns deletion: %v): after DEL not back in the host: %v %v; %s", p.i, netnsFirst, missing, err, where())
	}
	p.attached = false
}

func (p *stressPod) destroy() {
	if p.pod != nil {
		if err := p.pod.Destroy(); err != nil {
			failf("pod %d: deleting its netns: %v", p.i, err)
		}
		p.pod = nil
	}
}

// pluginEntry is the rdma-netns entry of a chain as libcni would hand it
// over (without prevResult, as on DEL after a lost cache).
func pluginEntry(l *libcni.NetworkConfigList) []byte {
	conf, err := libcni.InjectConf(l.Plugins[len(l.Plugins)-1], map[string]any{"name": l.Name, "cniVersion": l.CNIVersion})
	if err != nil {
		return nil
	}
	return conf.Bytes
}

// where describes the node for failure messages: host devices, pods.
func where() string {
	rdma, _ := rig.RDMAIn("")
	nets, _ := rig.NetdevsIn("")
	entries, _ := os.ReadDir("/run/netns")
	var pods []string
	for _, e := range entries {
		p := "/run/netns/" + e.Name()
		if e.Name() == "host" {
			continue
		}
		r, _ := rig.RDMAIn(p)
		n, _ := rig.NetdevsIn(p)
		pods = append(pods, fmt.Sprintf("%s rdma %v netdevs %v", e.Name(), r, n))
	}
	return fmt.Sprintf("host rdma %v netdevs %v; pods: %v", rdma, nets, pods)
}
