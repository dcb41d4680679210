// Command rdma-netns-nri-demo is the end of `make demo`: two pods created
// over CRI by containerd, each holding its RDMA device, whose containers
// ask for nothing (no privilege, capability, device or volume, not root),
// get from rdma-netns-nri what verbs needs and exchange RDMA traffic. It
// runs in the test VM after the CRI part of the demo (scripts/guest/demo.sh).
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/cri/nririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-netns-nri-demo:", err)
		os.Exit(1)
	}
}

var t0 = time.Now()

func step(title string) {
	fmt.Printf("\n== %s\n", title)
	t0 = time.Now()
}

func took() { fmt.Printf("   (%.2f s)\n", time.Since(t0).Seconds()) }

func indent(s string) {
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		fmt.Println("   " + l)
	}
}

type pod struct {
	pod *cririg.Pod
	ctr *cririg.Container
	net cririg.Network
}

func run() error {
	ctx := context.Background()
	if err := cririg.Setup(); err != nil {
		return err
	}
	ctd, err := cririg.Start(cririg.Options{})
	if err != nil {
		return err
	}
	defer ctd.Stop()
	defer ctd.Cleanup(ctx)

	step("The NRI plugin (the DaemonSet's nri container) connects to containerd's NRI socket")
	before := nririg.LogLines()
	plugin, err := nririg.StartPlugin()
	if err != nil {
		return err
	}
	defer plugin.Stop()
	indent(grepLog(before, "connected to", "at connection"))
	took()

	var pods []pod
	for _, p := range []struct{ name, handler string }{{"trainer-0", "rdma-eth1"}, {"trainer-1", "rdma-eth2"}} {
		step(fmt.Sprintf("Pod %s (RuntimeClass %s) with one container that asks for nothing: uid %d, every capability dropped, no device, no volume", p.name, p.handler, nririg.WorkloadUID))
		n, err := cririg.NetworkOf(p.handler)
		if err != nil {
			return err
		}
		before := nririg.LogLines()
		cp, err := ctd.RunPod(ctx, cririg.PodSpec{Name: p.name, Namespace: "demo", Handler: p.handler})
		if err != nil {
			return err
		}
		c, err := ctd.RunContainer(ctx, cp, nririg.Unprivileged("nccl"))
		if err != nil {
			return err
		}
		fmt.Printf("   rdma-netns moved %s into the pod; rdma-netns-nri said:\n", n.RDMA)
		indent(grepLog(before, "demo/"+p.name+"/"))
		pods = append(pods, pod{cp, c, n})
		took()
	}

	a, b := pods[0], pods[1]
	step("Inside trainer-0's container: only its device's uverbs node and rdma_cm, memlock unlimited, a 1 GiB /dev/shm, no capability")
	r, err := ctd.Exec(ctx, a.ctr, time.Minute, "sh", "-c",
		`id; ls -l /dev/infiniband; echo "ulimit -l: $(ulimit -l)"; df -h /dev/shm | tail -1; grep CapEff /proc/self/status; ibv_devices`)
	if err != nil {
		return err
	}
	indent(r.Stdout)
	took()

	step(fmt.Sprintf("RDMA traffic between the unprivileged containers: ibv_rc_pingpong (100 x 4 KiB round trips) from trainer-1 (%s) to trainer-0 (%s)", b.net.RDMA, a.net.RDMA))
	out, err := pair(ctx, ctd, a, b, rig.PingPongArgs(a.net.RDMA, 4096, 100, ""), rig.PingPongArgs(b.net.RDMA, 4096, 100, a.net.IP))
	if err != nil {
		return err
	}
	indent(out)
	took()

	step("RDMA writes: ib_write_bw (200 x 64 KiB) from trainer-1 into trainer-0's registered memory (memlock: unlimited, no IPC_LOCK)")
	out, err = pair(ctx, ctd, a, b, rig.WriteBWArgs(a.net.RDMA, 65536, 200, ""), rig.WriteBWArgs(b.net.RDMA, 65536, 200, a.net.IP))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "#bytes") || strings.HasPrefix(strings.TrimSpace(l), "65536") {
			indent(l)
		}
	}
	took()

	step("The pods are stopped and removed: the devices go back to the host")
	for _, p := range pods {
		if err := ctd.StopPod(ctx, p.pod.ID); err != nil {
			return err
		}
		if err := ctd.RemovePod(ctx, p.pod.ID); err != nil {
			return err
		}
	}
	time.Sleep(300 * time.Millisecond)
	host, err := rig.RDMAIn("")
	if err != nil {
		return err
	}
	fmt.Printf("   host RDMA devices: %s\n", strings.Join(host, " "))
	took()

	fmt.Printf("\nDone: pods that asked only for their network ran verbs traffic, unprivileged.\n")
	return nil
}

// pair runs a verbs server in a's container and its client in b's.
func pair(ctx context.Context, ctd *cririg.Containerd, a, b pod, server, client []string) (string, error) {
	var wg sync.WaitGroup
	var serr error
	var sout string
	wg.Add(1)
	go func() {
		defer wg.Done()
		r, err := ctd.Exec(ctx, a.ctr, 2*time.Minute, server...)
		sout, serr = r.Stdout+r.Stderr, err
	}()
	err := cririg.Wait(30*time.Second, server[0]+" listening", func() (bool, error) {
		r, err := ctd.Exec(ctx, a.ctr, 10*time.Second, "cat", "/proc/net/tcp", "/proc/net/tcp6")
		return strings.Contains(r.Stdout, ":4853 00000000:0000 0A") || strings.Contains(r.Stdout, ":4853 00000000000000000000000000000000:0000 0A"), err
	})
	if err != nil {
		return "", err
	}
	r, cerr := ctd.Exec(ctx, b.ctr, 2*time.Minute, client...)
	wg.Wait()
	if cerr != nil || serr != nil {
		return "", fmt.Errorf("client: %v\n%s%s\nserver: %v\n%s", cerr, r.Stdout, r.Stderr, serr, sout)
	}
	return r.Stdout + r.Stderr, nil
}

// grepLog is the plugin's log lines after skip that contain any of words,
// without their time stamps.
func grepLog(skip int, words ...string) string {
	var out []string
	for _, l := range strings.Split(nririg.LogSince(skip), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				if _, rest, ok := strings.Cut(l, " "); ok {
					l = rest
				}
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
