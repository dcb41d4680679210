//go:build e2e

// Package nri_test runs rdma-netns-nri under containerd (NRI on its
// default socket) in the test VM, with pods created over CRI as kubelet
// does: the unprivileged pod of conf/pod-nccl.yaml gets what verbs needs
// from the plugin alone.
package nri_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/cri/nririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

const (
	doctorBin = cririg.CNIBinDir + "/rdma-netns"
	// plainHandler runs pods on a network whose eth0 is a dummy netdev
	// (host-device moves it in, static gives it the address containerd
	// wants): no RDMA device in their netns.
	plainHandler = "plain"
	plainConfDir = cririg.Dir + "/plain.d"
	plainNetdev  = "nriplain0"
	// sharedHandler runs pods, in the shared-mode VM, on a NIC of their
	// own whose chain has rdma-netns with allowSharedMode: ADD succeeds
	// and the pod's netns sees every RDMA device of the node.
	sharedHandler = "shared-ok"
	sharedConfDir = cririg.Dir + "/shared-ok.d"
)

// plainRuntime adds the plain handler to containerd's config.
var plainRuntime = runtimeConf(plainHandler, plainConfDir)

// runtimeConf is containerd's config of a runtime handler whose pods get
// the network of the conflist in confDir.
func runtimeConf(handler, confDir string) string {
	return fmt.Sprintf(`[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
  runtime_type = 'io.containerd.runc.v2'
  cni_conf_dir = %[2]q
  cni_max_conf_num = 1
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
  NoPivotRoot = true`, handler, confDir)
}

var (
	ctd    *cririg.Containerd
	plugin *nririg.Plugin
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if err := cririg.Setup(); err != nil {
		fmt.Fprintln(os.Stderr, "cri setup:", err)
		return 1
	}
	if err := os.MkdirAll(plainConfDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if out, err := exec.Command(rig.IPTool, "link", "add", plainNetdev, "type", "dummy").CombinedOutput(); err != nil && !strings.Contains(string(out), "exists") {
		fmt.Fprintf(os.Stderr, "dummy netdev: %v: %s\n", err, out)
		return 1
	}
	if err := os.WriteFile(filepath.Join(plainConfDir, "plain.conflist"), []byte(`{"cniVersion": "1.1.0", "name": "plain", "plugins": [
  {"type": "host-device", "device": "`+plainNetdev+`", "ipam": {"type": "static", "addresses": [{"address": "10.100.250.2/24"}]}}]}`), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	extra := plainRuntime
	if cririg.NetnsMode() == "shared" {
		if err := writeSharedNetwork(); err != nil {
			fmt.Fprintln(os.Stderr, "shared-mode network:", err)
			return 1
		}
		extra += "\n" + runtimeConf(sharedHandler, sharedConfDir)
	}
	var err error
	if ctd, err = cririg.Start(cririg.Options{Extra: extra}); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		return 1
	}
	// Sandboxes an earlier suite left in containerd's state (one killed
	// mid-way, say) hold NICs these tests need: stop and remove them, as
	// kubelet does with pods that should not exist.
	if err := ctd.Cleanup(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "leftover sandboxes:", err)
	}
	if plugin, err = nririg.StartPlugin(); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-netns-nri:", err)
		ctd.Stop()
		return 1
	}
	rc := m.Run()
	if err := ctd.Cleanup(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		rc = 1
	}
	plugin.Stop()
	if err := ctd.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop containerd:", err)
	}
	if rc != 0 {
		fmt.Println("=== rdma-netns-nri log ===")
		fmt.Print(nririg.PluginLog.Since(0))
	}
	return rc
}

// writeSharedNetwork writes the shared-ok handler's network: the VM's
// last NIC (no other handler's) with host-device, then rdma-netns with
// allowSharedMode.
func writeSharedNetwork() error {
	nics, err := rig.Layout()
	if err != nil {
		return err
	}
	if len(nics) < 4 {
		return fmt.Errorf("want a fourth NIC (vm-run.sh --nics 4), the VM has %d", len(nics))
	}
	if err := os.MkdirAll(sharedConfDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(sharedConfDir, "shared-ok.conflist"), []byte(`{"cniVersion": "1.1.0", "name": "shared-ok", "plugins": [
  {"type": "host-device", "device": "`+nics[len(nics)-1].Netdev+`", "ipam": {"type": "static", "addresses": [{"address": "10.100.251.2/24"}]}},
  {"type": "rdma-netns", "allowSharedMode": true}]}`), 0o644)
}

// exclusiveOnly skips a test of the exclusive-mode VM elsewhere.
func exclusiveOnly(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// runPod runs the pod of spec (in namespace nri-test); it stops and
// removes the pod when the test ends.
func runPod(t *testing.T, spec cririg.PodSpec) *cririg.Pod {
	t.Helper()
	spec.Namespace = "nri-test"
	p, err := ctd.RunPod(ctx(t), spec)
	if p != nil {
		t.Cleanup(func() {
			ctd.StopPod(context.Background(), p.ID)
			ctd.RemovePod(context.Background(), p.ID)
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// unprivileged is a container as a plain pod spec makes it.
func unprivileged(name string, devices ...string) cririg.ContainerSpec {
	return nririg.Unprivileged(name, devices...)
}

func runContainer(t *testing.T, pod *cririg.Pod, spec cririg.ContainerSpec) *cririg.Container {
	t.Helper()
	c, err := ctd.RunContainer(ctx(t), pod, spec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runWorkers runs a pod of each spec in namespace nri-test all at once, as
// a node starts its pods, each with an unprivileged container "worker",
// and returns the workers and how long each took to be created and
// started. A pod or container that fails fails t; the pods are removed at
// the end of the test.
func runWorkers(t *testing.T, specs []cririg.PodSpec) ([]*cririg.Container, []time.Duration) {
	t.Helper()
	ctrs := make([]*cririg.Container, len(specs))
	took := make([]time.Duration, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, sp := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp.Namespace = "nri-test"
			p, err := ctd.RunPod(context.Background(), sp)
			if p != nil {
				t.Cleanup(func() {
					ctd.StopPod(context.Background(), p.ID)
					ctd.RemovePod(context.Background(), p.ID)
				})
			}
			if errs[i] = err; err != nil {
				return
			}
			start := time.Now()
			ctrs[i], errs[i] = ctd.RunContainer(context.Background(), p, unprivileged("worker"))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ctrs, took
}

func sh(t *testing.T, c *cririg.Container, script string) string {
	t.Helper()
	r, err := ctd.Exec(ctx(t), c, time.Minute, "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(r.Stdout)
}

type what = nririg.What

func inspect(t *testing.T, c *cririg.Container) what {
	t.Helper()
	w, err := nririg.Inspect(ctx(t), ctd, c)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// nodesOf are the /dev/infiniband names a verbs workload of the pod needs,
// as the kernel names them from inside the pod's netns.
func nodesOf(t *testing.T, pod *cririg.Pod) []string {
	t.Helper()
	v, err := rdmans.Netlink{}.VerbsNodesIn(pod.Netns)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range v.Devices {
		out = append(out, d.Uverbs.Name)
	}
	out = append(out, v.RdmaCM.Name)
	slices.Sort(out)
	return out
}

// wantAdjusted checks a container has exactly its pod's nodes, unlimited
// memlock, no capability and a /dev/shm of shmKiB.
func wantAdjusted(t *testing.T, c *cririg.Container, shmKiB int) what {
	t.Helper()
	w := inspect(t, c)
	want := nodesOf(t, c.Pod)
	if !slices.Equal(w.Nodes, want) || w.Memlock != "unlimited" || w.ShmKiB != shmKiB || w.CapEff != "0000000000000000" {
		t.Fatalf("container of %s: /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB, CapEff %s; want %v, unlimited, %d KiB, no capability\nplugin log:\n%s",
			c.Pod.Spec.Name, w.Nodes, w.Memlock, w.ShmKiB, w.CapEff, want, shmKiB, nririg.PluginLog.Since(0))
	}
	return w
}

// wantUntouched checks a container got none of the three.
func wantUntouched(t *testing.T, c *cririg.Container) {
	t.Helper()
	w := inspect(t, c)
	if len(w.Nodes) != 0 || w.Memlock == "unlimited" || w.ShmKiB != 64<<10 {
		t.Fatalf("container of %s was adjusted: /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB", c.Pod.Spec.Name, w.Nodes, w.Memlock, w.ShmKiB)
	}
}

// containerPid is the container's init process on the node.
func containerPid(t *testing.T, c *cririg.Container) int {
	t.Helper()
	st, err := ctd.Runtime.ContainerStatus(ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: c.ID, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("container %s: no pid in the verbose status (%v)", c.ID, err)
	}
	return info.Pid
}

// runDoctor runs `rdma-netns doctor ARGS --json`.
func runDoctor(t *testing.T, args ...string) ([]doctor.Finding, int) {
	t.Helper()
	r, code, err := doctorrun.JSON(doctorBin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return r.Findings, code
}

// pidArg is the doctor's --pid for the container's process.
func pidArg(t *testing.T, c *cririg.Container) string {
	return strconv.Itoa(containerPid(t, c))
}

// A pod holding its RDMA device whose containers ask for nothing: each
// unprivileged container (uid 1000, every capability dropped, no device,
// no volume) sees the uverbs node of the pod's device and rdma_cm and no
// other, has unlimited memlock and a 1 GiB /dev/shm that the pod's
// containers share; the doctor finds nothing missing; and two such pods
// exchange ibv_rc_pingpong and ib_write_bw traffic (seed-000's workload,
// which failed with "Couldn't register MR" without memlock). A container
// handed every uverbs node by hand still opens only its pod's.
func TestUnprivilegedPods(t *testing.T) {
	exclusiveOnly(t)
	a := runPod(t, cririg.PodSpec{Name: "nri-a", Handler: "rdma-eth1"})
	b := runPod(t, cririg.PodSpec{Name: "nri-b", Handler: "rdma-eth2"})
	aw := runContainer(t, a, unprivileged("worker"))
	as := runContainer(t, a, unprivileged("sidecar"))
	bw := runContainer(t, b, unprivileged("worker"))
	var nodes int
	for _, c := range []*cririg.Container{aw, as, bw} {
		w := wantAdjusted(t, c, 1<<20)
		nodes = len(w.Nodes)
	}
	all, _ := filepath.Glob("/dev/infiniband/uverbs*")
	t.Logf("each container sees %d of the node's %d uverbs nodes plus rdma_cm: %v", nodes-1, len(all), inspect(t, aw).Nodes)

	// More than 64 MiB fits, and the sidecar sees what the worker wrote.
	sh(t, aw, "dd if=/dev/zero of=/dev/shm/nccl-seg bs=1M count=100 2>/dev/null")
	if out := sh(t, as, "ls -l /dev/shm/nccl-seg"); !strings.Contains(out, strconv.Itoa(100<<20)) {
		t.Fatalf("the sidecar does not see the worker's 100 MiB segment: %s", out)
	}
	if out := sh(t, bw, "ls /dev/shm"); out != "" {
		t.Fatalf("pod b sees pod a's /dev/shm: %s", out)
	}
	sh(t, aw, "rm /dev/shm/nccl-seg")

	findings, code := runDoctor(t, "--pid", pidArg(t, aw))
	by := ""
	for _, f := range findings {
		if f.Check == "nri" || f.Severity != "ok" && f.Check != "shm" {
			t.Errorf("doctor: %s %s: %s", f.Severity, f.Check, f.Reason)
		}
		if f.Check == "nri-adjusted" {
			by = f.Reason
		}
	}
	if !strings.Contains(by, "by rdma-netns-nri 50-rdma-netns") {
		t.Errorf("doctor --pid does not name the instance that adjusted the container: %q", by)
	}
	if code != 0 {
		t.Errorf("doctor exit %d for an adjusted container", code)
	}

	na, nb := cririg.MustNetworkOf(t, "rdma-eth1"), cririg.MustNetworkOf(t, "rdma-eth2")
	pp, wb := ctd.MustExchange(t, ctx, cririg.Endpoint{Ctr: aw, Net: na}, cririg.Endpoint{Ctr: bw, Net: nb}, 100)
	t.Logf("ibv_rc_pingpong between unprivileged containers: %d bytes, %d iters, %.2f usec/iter", pp.Bytes, pp.Iters, pp.UsecPerIter)
	t.Logf("ib_write_bw between unprivileged containers: %d iters of %d bytes, average %.2f MB/s", wb.Iters, wb.Bytes, wb.AverageMBps)

	// Isolation: exclusive mode, not the device cgroup, keeps pods apart.
	// A container handed every uverbs node of the node by hand opens only
	// its own pod's.
	greedy := runContainer(t, a, unprivileged("greedy", all...))
	out := sh(t, greedy, `for f in /dev/infiniband/uverbs*; do if (exec 3<>"$f") 2>/dev/null; then echo "$f"; fi; done`)
	own := nodesOf(t, a)
	if len(strings.Fields(out)) != 1 || filepath.Base(out) != own[len(own)-1] {
		t.Fatalf("of %d uverbs nodes the container opened %q; want only its pod's %v", len(all), out, own)
	}
	t.Logf("handed all %d uverbs nodes, a container opened only %s", len(all), out)
}

// A pod without an RDMA device and a pod that opts out get none of it,
// and the doctor says what the opted-out one lacks; the pod annotation
// sizes /dev/shm, capped at the pod's memory limit, or keeps 64 MiB.
func TestPolicy(t *testing.T) {
	exclusiveOnly(t)
	// The four pods start together (each on its own network).
	specs := []cririg.PodSpec{
		{Name: "nri-plain", Handler: plainHandler},
		{Name: "nri-skip", Handler: "rdma-eth1", Annotations: map[string]string{"rdma-netns.io/nri": "skip"}},
		{Name: "nri-capped", Handler: "rdma-eth2", Annotations: map[string]string{"rdma-netns.io/shm-size": "512Mi"}, MemLimit: 256 << 20},
		{Name: "nri-kept", Annotations: map[string]string{"rdma-netns.io/shm-size": "keep"}},
	}
	ctrs, _ := runWorkers(t, specs)
	plain, skipped, capped, kept := ctrs[0], ctrs[1], ctrs[2], ctrs[3]

	if devs, err := rig.RDMAIn(plain.Pod.Netns); err != nil || len(devs) != 0 {
		t.Fatalf("the plain pod holds %v (%v)", devs, err)
	}
	wantUntouched(t, plain)
	wantUntouched(t, skipped)
	findings, code := runDoctor(t, "--pid", pidArg(t, skipped))
	lacks := ""
	for _, f := range findings {
		if f.Check == "nri" {
			lacks = f.Reason + " / " + f.Remedy
		}
	}
	if code != 1 || !strings.Contains(lacks, "lacks 3 of the 3") || !strings.Contains(lacks, "rdma-netns-nri") {
		t.Fatalf("doctor for the opted-out pod: exit %d, nri finding %q", code, lacks)
	}
	wantAdjusted(t, capped, 256<<10)
	wantAdjusted(t, kept, 64<<10)
}

// A pod holding an RDMA device that asks for more /dev/shm than the node
// allows (the plugin's default --max-shm-size, 16Gi) gets no container:
// containerd fails the creation with the plugin's message, the one kubelet
// puts in the pod's events, and the plugin's log names the container.
func TestShmAboveTheCap(t *testing.T) {
	exclusiveOnly(t)
	before := nririg.PluginLog.Lines()
	pod := runPod(t, cririg.PodSpec{Name: "nri-greedy", Handler: "rdma-eth1", Annotations: map[string]string{"rdma-netns.io/shm-size": "32Gi"}})
	c, err := ctd.RunContainer(ctx(t), pod, unprivileged("worker"))
	if err == nil {
		t.Fatalf("a container of a pod asking 32Gi of /dev/shm was created: %+v", inspect(t, c))
	}
	t.Logf("containerd: %v", err)
	for _, want := range []string{"rdma-netns.io/shm-size: 32Gi", "--max-shm-size 16Gi", "nri.maxShmSize"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("containerd's error does not say %q", want)
		}
	}
	if l := nririg.PluginLog.Since(before); !strings.Contains(l, "nri-test/nri-greedy/worker: refused") {
		t.Errorf("the plugin's log does not name the refused container:\n%s", l)
	}
}

// The plugin killed while pods run: their containers keep what they got;
// a container created meanwhile starts without it (and the doctor says
// so); the restarted plugin reports the running containers and adjusts
// the next ones. containerd killed and restarted: the plugin connects to
// the new one by itself.
func TestRestarts(t *testing.T) {
	exclusiveOnly(t)
	pod := runPod(t, cririg.PodSpec{Name: "nri-restart", Handler: "rdma-eth1"})
	first := runContainer(t, pod, unprivileged("first"))
	wantAdjusted(t, first, 1<<20)

	plugin.Kill()
	wantAdjusted(t, first, 1<<20)
	bare := runContainer(t, pod, unprivileged("while-down"))
	w := inspect(t, bare)
	if len(w.Nodes) != 0 || w.Memlock == "unlimited" {
		t.Fatalf("a container created without the plugin got %v, memlock %s", w.Nodes, w.Memlock)
	}
	if w.ShmKiB != 1<<20 {
		t.Fatalf("/dev/shm of the pod is %d KiB in a later container, want the pod's 1 GiB: it is the pod's", w.ShmKiB)
	}

	before := nririg.PluginLog.Lines()
	var err error
	if plugin, err = nririg.StartPlugin(); err != nil {
		t.Fatal(err)
	}
	if l := nririg.PluginLog.Since(before); !strings.Contains(l, "nri-test/nri-restart/first") || !strings.Contains(l, "nri-test/nri-restart/while-down") {
		t.Fatalf("the restarted plugin did not report the running containers:\n%s", l)
	}
	wantAdjusted(t, runContainer(t, pod, unprivileged("after-plugin-restart")), 1<<20)

	before = nririg.PluginLog.Lines()
	if ctd, err = ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := nririg.PluginLog.Wait(before, "at connection", 30*time.Second); err != nil {
		t.Fatalf("%v:\n%s", err, nririg.PluginLog.Since(before))
	}
	t.Logf("after containerd's restart the plugin reconnected:\n%s", nririg.PluginLog.Since(before))
	wantAdjusted(t, first, 1<<20)
	wantAdjusted(t, runContainer(t, pod, unprivileged("after-runtime-restart")), 1<<20)
}

// In shared mode every netns sees every RDMA device, so the plugin gives
// nothing to anyone: a pod on a plain network and a pod whose chain has
// rdma-netns with allowSharedMode, both of whose netns see the node's RDMA
// devices, get no device node, containerd's memlock and containerd's
// 64 MiB /dev/shm, asked from inside their containers; the plugin said so
// once when it connected, with the fix (each container's decision, at
// debug, names shared mode too).
func TestSharedModeNothingForAnyone(t *testing.T) {
	if cririg.NetnsMode() != "shared" {
		t.Skip("the shared-mode VM's test")
	}
	plain := runContainer(t, runPod(t, cririg.PodSpec{Name: "nri-shared-plain", Handler: plainHandler}), unprivileged("worker"))
	rdma := runContainer(t, runPod(t, cririg.PodSpec{Name: "nri-shared-rdma", Handler: sharedHandler}), unprivileged("worker"))
	memlock := ctd.MustMemlockKiB(t)
	for _, c := range []*cririg.Container{plain, rdma} {
		devs, err := rig.RDMAIn(c.Pod.Netns)
		if err != nil || len(devs) == 0 {
			t.Fatalf("the netns of %s sees no RDMA device (%v): shared mode is not what this test runs in", c.Pod.Spec.Name, err)
		}
		w := inspect(t, c)
		t.Logf("%s: netns sees %v; container has /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB", c.Pod.Spec.Name, devs, w.Nodes, w.Memlock, w.ShmKiB)
		if len(w.Nodes) != 0 || w.Memlock != memlock || w.ShmKiB != 64<<10 {
			t.Errorf("container of %s: /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB; want none, containerd's %s, 64 MiB\nplugin log:\n%s",
				c.Pod.Spec.Name, w.Nodes, w.Memlock, w.ShmKiB, memlock, nririg.PluginLog.Since(0))
		}
	}
	l := nririg.PluginLog.Since(0)
	if strings.Count(l, "ERROR the RDMA subsystem is in shared netns mode") != 1 || !strings.Contains(l, "netns_mode=0") {
		t.Errorf("the plugin's log does not say shared mode and its fix once, at connection:\n%s", l)
	}
	for _, c := range []*cririg.Container{plain, rdma} {
		if !strings.Contains(l, c.Pod.Spec.Name+"/worker: not adjusted: the RDMA subsystem is in shared netns mode") {
			t.Errorf("the plugin's log has no decision for %s naming shared mode:\n%s", c.Pod.Spec.Name, l)
		}
	}
}
