package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// demo is `make demo`'s main part: pods made by containerd over CRI, as
// kubelet makes them, on the conf/containerd setup (one runtime handler,
// i.e. RuntimeClass, per RDMA NIC). Each step prints what a user would
// look at.
func demo(args []string) error {
	d := &demoRun{ctx: context.Background(), t0: time.Now()}
	return d.run()
}

type demoRun struct {
	ctx context.Context
	ctd *cririg.Containerd
	t0  time.Time
}

func (d *demoRun) step(format string, a ...any) {
	fmt.Printf("\n== %s\n", fmt.Sprintf(format, a...))
	d.t0 = time.Now()
}

func (d *demoRun) took() { fmt.Printf("   (%.2f s)\n", time.Since(d.t0).Seconds()) }

func say(format string, a ...any) {
	for _, l := range strings.Split(strings.TrimRight(fmt.Sprintf(format, a...), "\n"), "\n") {
		fmt.Println("   " + l)
	}
}

func sh(argv ...string) string {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s%v", out, err)
	}
	return string(out)
}

// calls prints the CNI calls containerd made since the last ResetCalls.
func calls() {
	cs, err := cririg.Calls()
	if err != nil {
		say("(trace: %v)", err)
		return
	}
	for _, c := range cs {
		netns := c.Netns
		if netns == "" {
			netns = "(none)"
		}
		say("containerd -> %-11s %-6s CNI_IFNAME=%-4s CNI_NETNS=%s", c.Plugin, c.Command, c.IfName, netns)
	}
	cririg.ResetCalls()
}

type demoPod struct {
	name string
	net  cririg.Network
	pod  *cririg.Pod
	ctr  *cririg.Container
}

func (d *demoRun) run() error {
	d.step("Setting up: containerd %s with conf/containerd's files, images imported (no registry)", "v2.2.1")
	if err := cririg.Setup(); err != nil {
		return err
	}
	bin, err := cririg.TraceCNI()
	if err != nil {
		return err
	}
	// The trace only logs the calls, to show them; the plugins are the
	// ones in /opt/cni/bin.
	if d.ctd, err = cririg.Start(cririg.Options{CNIBinDir: bin}); err != nil {
		return err
	}
	defer d.ctd.Stop()
	v, err := d.ctd.Runtime.Version(d.ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return err
	}
	say("runtime %s %s, CRI %s", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	handlers, err := cririg.Handlers()
	if err != nil {
		return err
	}
	for _, h := range append([]string{""}, handlers...) {
		n, err := cririg.NetworkOf(h)
		if err != nil {
			return err
		}
		name := h
		if name == "" {
			name = "(default)"
		}
		say("runtime handler %-10s network %-9s host-device %s (RDMA device %s), %s, then rdma-netns", name, n.Name, n.Netdev, n.RDMA, n.IP)
	}
	d.took()

	d.step("CRI Status: containerd asks the default network's chain for STATUS")
	cririg.ResetCalls()
	ready, reason, msg, err := d.ctd.NetworkReady(d.ctx)
	if err != nil {
		return err
	}
	calls()
	say("NetworkReady=%v %s %s", ready, reason, msg)
	say("RDMA subsystem: %s", strings.TrimSpace(sh(rig.RdmaTool, "system", "show")))
	d.took()

	a := &demoPod{name: "rdma-a"}
	b := &demoPod{name: "rdma-b"}
	for i, p := range []*demoPod{a, b} {
		h := handlers[i]
		if p.net, err = cririg.NetworkOf(h); err != nil {
			return err
		}
		d.step("RunPodSandbox %s with runtimeClassName %s (runtime handler %s)", p.name, h, h)
		if p.pod, err = d.ctd.RunPod(d.ctx, cririg.PodSpec{Name: p.name, Namespace: "demo", Handler: h}); err != nil {
			return err
		}
		calls()
		say("sandbox %.12s, netns %s", p.pod.ID, p.pod.Netns)
		say("in the pod:  %s", strings.TrimSpace(sh(rig.IPTool, "netns", "exec", netnsName(p.pod), rig.IPTool, "-br", "addr", "show", "eth0")))
		say("in the pod:  %s", strings.TrimSpace(sh(rig.IPTool, "netns", "exec", netnsName(p.pod), rig.RdmaTool, "link")))
		devs, _ := rig.RDMAIn("")
		say("on the host: RDMA devices %s (no %s)", strings.Join(devs, " "), p.net.RDMA)
		d.took()
	}

	d.step("Containers: the tools image, given the pod's /dev/infiniband nodes and IPC_LOCK, as an RDMA device plugin and a pod spec do")
	for _, p := range []*demoPod{a, b} {
		nodes, err := cririg.VerbsDevices(p.pod.Netns, p.net.RDMA)
		if err != nil {
			return err
		}
		if p.ctr, err = d.ctd.RunContainer(d.ctx, p.pod, cririg.ContainerSpec{Name: "tools", Devices: nodes, AddCaps: []string{"IPC_LOCK"}}); err != nil {
			return err
		}
		r, err := d.ctd.Exec(d.ctx, p.ctr, time.Minute, "ibv_devices")
		if err != nil {
			return err
		}
		say("%s: devices %s; ibv_devices in the container:", p.name, strings.Join(nodes, " "))
		say("%s", r.Stdout)
	}
	d.took()

	d.step("RDMA traffic between the containers: ibv_rc_pingpong (100 x 4 KiB round trips), %s -> %s", b.name, a.name)
	out, err := d.pair(a, b, rig.PingPongArgs(a.net.RDMA, 4096, 100, ""), rig.PingPongArgs(b.net.RDMA, 4096, 100, a.net.IP))
	if err != nil {
		return err
	}
	say("%s", out)
	d.took()

	d.step("RDMA writes: ib_write_bw (200 x 64 KiB RDMA WRITEs), %s -> %s's memory", b.name, a.name)
	// perftest's clock calibration sometimes fails under the VM's emulated
	// CPU and reports 0 MB/s although every write completed: run it again.
	for try := 0; try < 3; try++ {
		out, err = d.pair(a, b, rig.WriteBWArgs(a.net.RDMA, 65536, 200, ""), rig.WriteBWArgs(b.net.RDMA, 65536, 200, a.net.IP))
		if err != nil {
			return err
		}
		if !strings.Contains(out, "Correlation coefficient r^2") {
			break
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "#bytes") || strings.Contains(l, "65536") {
			say("%s", l)
		}
	}
	d.took()

	// rping connects through rdma_cm (the container's /dev/infiniband/rdma_cm),
	// as MPI and UCX do (NCCL does not).
	d.step("rdma_cm: rping (3 pings over a connection rdma_cm resolved and set up), %s -> %s", b.name, a.name)
	if out, err = d.rping(a, b, 3); err != nil {
		return err
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "ping data") {
			say("%s", strings.TrimSpace(l))
		}
	}
	d.took()

	d.step("The pods are deleted: StopPodSandbox (containers killed, then CNI DEL), RemovePodSandbox")
	for _, p := range []*demoPod{a, b} {
		if err := d.ctd.StopPod(d.ctx, p.pod.ID); err != nil {
			return err
		}
		if err := d.ctd.RemovePod(d.ctx, p.pod.ID); err != nil {
			return err
		}
	}
	calls()
	d.took()

	d.step("Back on the host: both RDMA devices, usable again; no attachment record left")
	if err := home(10 * time.Second); err != nil {
		return err
	}
	devs, _ := rig.RDMAIn("")
	say("RDMA devices: %s", strings.Join(devs, " "))
	for _, l := range strings.Split(sh("ibv_devinfo", "-d", a.net.RDMA), "\n") {
		if strings.Contains(l, "hca_id") || strings.Contains(l, "state:") || strings.Contains(l, "link_layer") {
			say("ibv_devinfo on the host: %s", strings.TrimSpace(l))
		}
	}
	say("records in %s: %d", cririg.RecordsDir, len(rig.Records(cririg.RecordsDir)))
	d.took()
	fmt.Printf("\nDone: containerd gave each pod its NIC and RDMA device, the containers\nexchanged RDMA traffic, and stopping the pods brought both devices back.\n")
	return nil
}

func netnsName(p *cririg.Pod) string {
	return p.Netns[strings.LastIndex(p.Netns, "/")+1:]
}

// pair runs a verbs server in srv's container and its client in cli's,
// and returns the client's output.
func (d *demoRun) pair(srv, cli *demoPod, server, client []string) (string, error) {
	var wg sync.WaitGroup
	var sres cririg.ExecResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sres, serr = d.ctd.Exec(d.ctx, srv.ctr, 2*time.Minute, server...)
	}()
	if err := d.ctd.WaitListening(d.ctx, srv.ctr, 18515, 30*time.Second); err != nil {
		return "", err
	}
	cres, cerr := d.ctd.Exec(d.ctx, cli.ctr, 2*time.Minute, client...)
	wg.Wait()
	if cerr != nil || serr != nil {
		return "", fmt.Errorf("client: %v\n%s%s\nserver: %v\n%s%s", cerr, cres.Stdout, cres.Stderr, serr, sres.Stdout, sres.Stderr)
	}
	return cres.Stdout + cres.Stderr, nil
}

// rping runs rping's server in srv's container and its client in cli's:
// the server listens through rdma_cm, not on a TCP port, so the client
// starts a moment later.
func (d *demoRun) rping(srv, cli *demoPod, count int) (string, error) {
	n := fmt.Sprint(count)
	var wg sync.WaitGroup
	var sres cririg.ExecResult
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sres, serr = d.ctd.Exec(d.ctx, srv.ctr, time.Minute, "rping", "-s", "-a", srv.net.IP, "-C", n)
	}()
	time.Sleep(1500 * time.Millisecond)
	cres, cerr := d.ctd.Exec(d.ctx, cli.ctr, time.Minute, "rping", "-c", "-a", srv.net.IP, "-C", n, "-v")
	wg.Wait()
	if cerr != nil || serr != nil {
		return "", fmt.Errorf("rping client: %v\n%s%s\nserver: %v\n%s%s", cerr, cres.Stdout, cres.Stderr, serr, sres.Stdout, sres.Stderr)
	}
	return cres.Stdout, nil
}
