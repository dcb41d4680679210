//go:build e2e

// Package nri_test runs rdma-netns-nri under containerd 2.2.1 (NRI on its
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
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

const (
	pluginBin = "/usr/local/bin/rdma-netns-nri"
	pluginLog = cririg.Dir + "/rdma-netns-nri.log"
	doctorBin = cririg.CNIBinDir + "/rdma-netns"
	// plainHandler runs pods on a network whose eth0 is a dummy netdev
	// (host-device moves it in, static gives it the address containerd
	// wants): no RDMA device in their netns.
	plainHandler = "plain"
	plainConfDir = cririg.Dir + "/plain.d"
	plainNetdev  = "nriplain0"
	// The uid the tests' workloads run as: no root, no capability.
	workloadUID = 1000
)

// plainRuntime adds the plain handler to containerd's config.
var plainRuntime = fmt.Sprintf(`[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
  runtime_type = 'io.containerd.runc.v2'
  cni_conf_dir = %[2]q
  cni_max_conf_num = 1
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
  NoPivotRoot = true`, plainHandler, plainConfDir)

var (
	ctd    *cririg.Containerd
	plugin *pluginProc
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if vmMode() != "exclusive" {
		fmt.Println("nri: the exclusive-mode VM's tests; skipped")
		return 0
	}
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
	var err error
	if ctd, err = cririg.Start(cririg.Options{Extra: plainRuntime}); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		return 1
	}
	// Sandboxes an earlier suite left in containerd's state (one killed
	// mid-way, say) hold NICs these tests need: stop and remove them, as
	// kubelet does with pods that should not exist.
	if err := ctd.Cleanup(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "leftover sandboxes:", err)
	}
	if plugin, err = startPlugin(); err != nil {
		fmt.Fprintln(os.Stderr, "rdma-netns-nri:", err)
		ctd.Stop()
		return 1
	}
	rc := m.Run()
	if err := ctd.Cleanup(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		rc = 1
	}
	plugin.stop()
	if err := ctd.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop containerd:", err)
	}
	if rc != 0 {
		fmt.Println("=== rdma-netns-nri log ===")
		data, _ := os.ReadFile(pluginLog)
		fmt.Print(string(data))
	}
	return rc
}

func vmMode() string {
	data, _ := os.ReadFile("/etc/vm.conf")
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VM_NETNS_MODE="); ok {
			return v
		}
	}
	return ""
}

// pluginProc is rdma-netns-nri running as it does on a node, its log
// appended to pluginLog across restarts.
type pluginProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startPlugin starts the plugin with the DaemonSet's flags and waits
// until the runtime has synchronized it.
func startPlugin() (*pluginProc, error) {
	before := logLines()
	f, err := os.OpenFile(pluginLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(pluginBin, "--socket", cririg.NRISocket, "--memlock", "unlimited", "--shm-size", "1Gi", "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &pluginProc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	if err := waitLog(before, "at connection", 30*time.Second); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

func (p *pluginProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

func (p *pluginProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

func logLines() int {
	data, _ := os.ReadFile(pluginLog)
	return strings.Count(string(data), "\n")
}

// waitLog waits for a line containing s after the first skip lines.
func waitLog(skip int, s string, timeout time.Duration) error {
	return cririg.Wait(timeout, "rdma-netns-nri logs "+strconv.Quote(s), func() (bool, error) {
		return strings.Contains(logSince(skip), s), nil
	})
}

func logSince(skip int) string {
	data, _ := os.ReadFile(pluginLog)
	lines := strings.SplitAfter(string(data), "\n")
	if skip > len(lines) {
		return ""
	}
	return strings.Join(lines[skip:], "")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return c
}

// podOpts are what kubelet would put in the sandbox config besides the
// rig's defaults.
type podOpts struct {
	annotations map[string]string
	memLimit    int64 // the pod's memory limit (the sum kubelet computes)
}

// runPod is RunPodSandbox with annotations and the pod's resources; it
// stops and removes the pod when the test ends.
func runPod(t *testing.T, name, handler string, o podOpts) *cririg.Pod {
	t.Helper()
	spec := cririg.PodSpec{Name: name, Namespace: "nri-test", Handler: handler}
	cfg := cririg.SandboxConfig(spec)
	cfg.Annotations = o.annotations
	if o.memLimit > 0 {
		cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: o.memLimit}
	}
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		t.Fatal(err)
	}
	resp, err := ctd.Runtime.RunPodSandbox(ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %q): %v", name, handler, err)
	}
	p := &cririg.Pod{ID: resp.PodSandboxId, Spec: spec, Config: cfg}
	t.Cleanup(func() {
		ctd.StopPod(context.Background(), p.ID)
		ctd.RemovePod(context.Background(), p.ID)
	})
	if p.Netns, err = ctd.PodNetns(ctx(t), p.ID); err != nil {
		t.Fatal(err)
	}
	return p
}

// containerConfig is an unprivileged container as a plain pod spec makes
// it: no device, no capability (all dropped), no volume, not root.
func containerConfig(name string, devices ...string) *runtimeapi.ContainerConfig {
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: cririg.ToolsImage},
		Command:  []string{"sleep", "86400"},
		LogPath:  name + ".log",
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				Capabilities:     &runtimeapi.Capability{DropCapabilities: []string{"ALL"}},
				RunAsUser:        &runtimeapi.Int64Value{Value: workloadUID},
				NoNewPrivs:       true,
				ReadonlyRootfs:   true,
				NamespaceOptions: &runtimeapi.NamespaceOption{},
			},
		},
	}
	for _, d := range devices {
		cfg.Devices = append(cfg.Devices, &runtimeapi.Device{ContainerPath: d, HostPath: d, Permissions: "rw"})
	}
	return cfg
}

// runContainer is CreateContainer then StartContainer.
func runContainer(t *testing.T, pod *cririg.Pod, cfg *runtimeapi.ContainerConfig) *cririg.Container {
	t.Helper()
	created, err := ctd.Runtime.CreateContainer(ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod.ID, Config: cfg, SandboxConfig: pod.Config})
	if err != nil {
		t.Fatalf("CreateContainer %s in %s: %v", cfg.Metadata.Name, pod.Spec.Name, err)
	}
	if _, err := ctd.Runtime.StartContainer(ctx(t), &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatalf("StartContainer %s in %s: %v", cfg.Metadata.Name, pod.Spec.Name, err)
	}
	return &cririg.Container{ID: created.ContainerId, Pod: pod}
}

func sh(t *testing.T, c *cririg.Container, script string) string {
	t.Helper()
	r, err := ctd.Exec(ctx(t), c, time.Minute, "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(r.Stdout)
}

// what is what a container has of the three.
type what struct {
	nodes   []string // /dev/infiniband
	memlock string   // ulimit -l
	shmKiB  int      // /dev/shm size
	capEff  string
}

func inspect(t *testing.T, c *cririg.Container) what {
	t.Helper()
	out := sh(t, c, `echo nodes: $(ls /dev/infiniband 2>/dev/null); ulimit -l; df -k /dev/shm | tail -1; grep CapEff /proc/self/status`)
	lines := strings.Split(out, "\n")
	if len(lines) != 4 {
		t.Fatalf("unexpected output:\n%s", out)
	}
	var w what
	w.nodes = strings.Fields(strings.TrimPrefix(lines[0], "nodes:"))
	w.memlock = strings.TrimSpace(lines[1])
	if f := strings.Fields(lines[2]); len(f) > 1 {
		w.shmKiB, _ = strconv.Atoi(f[1])
	}
	w.capEff = strings.TrimSpace(strings.TrimPrefix(lines[3], "CapEff:"))
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

func network(t *testing.T, handler string) cririg.Network {
	t.Helper()
	n, err := cririg.NetworkOf(handler)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantAdjusted checks a container has exactly its pod's nodes, unlimited
// memlock, no capability and a /dev/shm of shmKiB.
func wantAdjusted(t *testing.T, c *cririg.Container, shmKiB int) what {
	t.Helper()
	w := inspect(t, c)
	want := nodesOf(t, c.Pod)
	if !slices.Equal(w.nodes, want) || w.memlock != "unlimited" || w.shmKiB != shmKiB || w.capEff != "0000000000000000" {
		t.Fatalf("container of %s: /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB, CapEff %s; want %v, unlimited, %d KiB, no capability\nplugin log:\n%s",
			c.Pod.Spec.Name, w.nodes, w.memlock, w.shmKiB, w.capEff, want, shmKiB, logSince(0))
	}
	return w
}

// wantUntouched checks a container got none of the three.
func wantUntouched(t *testing.T, c *cririg.Container) {
	t.Helper()
	w := inspect(t, c)
	if len(w.nodes) != 0 || w.memlock == "unlimited" || w.shmKiB != 64<<10 {
		t.Fatalf("container of %s was adjusted: /dev/infiniband %v, ulimit -l %s, /dev/shm %d KiB", c.Pod.Spec.Name, w.nodes, w.memlock, w.shmKiB)
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

// doctor runs `rdma-netns doctor --pid` for the container's process.
func doctor(t *testing.T, c *cririg.Container) (findings []struct{ Severity, Check, Reason, Remedy string }, code int) {
	t.Helper()
	out, err := exec.Command(doctorBin, "doctor", "--json", "--pid", strconv.Itoa(containerPid(t, c))).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Findings []struct{ Severity, Check, Reason, Remedy string } `json:"findings"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	return r.Findings, code
}

// A pod holding its RDMA device whose containers ask for nothing: each
// unprivileged container (uid 1000, every capability dropped, no device,
// no volume) sees the uverbs node of the pod's device and rdma_cm and no
// other, has unlimited memlock and a 1 GiB /dev/shm that the pod's
// containers share; the doctor finds nothing missing; and two such pods
// exchange ibv_rc_pingpong and ib_write_bw traffic (seed-000's workload,
// which failed with "Couldn't register MR" without memlock).
func TestUnprivilegedPods(t *testing.T) {
	a := runPod(t, "nri-a", "rdma-eth1", podOpts{})
	b := runPod(t, "nri-b", "rdma-eth2", podOpts{})
	aw := runContainer(t, a, containerConfig("worker"))
	as := runContainer(t, a, containerConfig("sidecar"))
	bw := runContainer(t, b, containerConfig("worker"))
	var nodes int
	for _, c := range []*cririg.Container{aw, as, bw} {
		w := wantAdjusted(t, c, 1<<20)
		nodes = len(w.nodes)
	}
	all, _ := filepath.Glob("/dev/infiniband/uverbs*")
	t.Logf("each container sees %d of the node's %d uverbs nodes plus rdma_cm: %v", nodes-1, len(all), inspect(t, aw).nodes)

	// More than 64 MiB fits, and the sidecar sees what the worker wrote.
	sh(t, aw, "dd if=/dev/zero of=/dev/shm/nccl-seg bs=1M count=100 2>/dev/null")
	if out := sh(t, as, "ls -l /dev/shm/nccl-seg"); !strings.Contains(out, strconv.Itoa(100<<20)) {
		t.Fatalf("the sidecar does not see the worker's 100 MiB segment: %s", out)
	}
	if out := sh(t, bw, "ls /dev/shm"); out != "" {
		t.Fatalf("pod b sees pod a's /dev/shm: %s", out)
	}
	sh(t, aw, "rm /dev/shm/nccl-seg")

	findings, code := doctor(t, aw)
	for _, f := range findings {
		if f.Check == "nri" || f.Severity != "ok" && f.Check != "shm" {
			t.Errorf("doctor: %s %s: %s", f.Severity, f.Check, f.Reason)
		}
	}
	if code != 0 {
		t.Errorf("doctor exit %d for an adjusted container", code)
	}

	na, nb := network(t, "rdma-eth1"), network(t, "rdma-eth2")
	pp := pingPong(t, aw, bw, na, nb, 4096, 100)
	t.Logf("ibv_rc_pingpong between unprivileged containers: %d bytes, %d iters, %.2f usec/iter", pp.Bytes, pp.Iters, pp.UsecPerIter)
	wb := writeBW(t, aw, bw, na, nb, 65536, 100)
	t.Logf("ib_write_bw between unprivileged containers: %d iters of %d bytes, average %.2f MB/s", wb.Iters, wb.Bytes, wb.AverageMBps)
}

// A pod without an RDMA device and a pod that opts out get none of it,
// and the doctor says what the opted-out one lacks; the pod annotation
// sizes /dev/shm, capped at the pod's memory limit, or keeps 64 MiB.
func TestPolicy(t *testing.T) {
	plain := runPod(t, "nri-plain", plainHandler, podOpts{})
	if devs, err := rig.RDMAIn(plain.Netns); err != nil || len(devs) != 0 {
		t.Fatalf("the plain pod holds %v (%v)", devs, err)
	}
	wantUntouched(t, runContainer(t, plain, containerConfig("web")))

	out := runPod(t, "nri-skip", "rdma-eth1", podOpts{annotations: map[string]string{"rdma-netns.io/nri": "skip"}})
	oc := runContainer(t, out, containerConfig("worker"))
	wantUntouched(t, oc)
	findings, code := doctor(t, oc)
	lacks := ""
	for _, f := range findings {
		if f.Check == "nri" {
			lacks = f.Reason + " / " + f.Remedy
		}
	}
	if code != 1 || !strings.Contains(lacks, "lacks 3 of the 3") || !strings.Contains(lacks, "rdma-netns-nri") {
		t.Fatalf("doctor for the opted-out pod: exit %d, nri finding %q", code, lacks)
	}

	capped := runPod(t, "nri-capped", "rdma-eth2", podOpts{annotations: map[string]string{"rdma-netns.io/shm-size": "512Mi"}, memLimit: 256 << 20})
	wantAdjusted(t, runContainer(t, capped, containerConfig("worker")), 256<<10)

	kept := runPod(t, "nri-kept", "", podOpts{annotations: map[string]string{"rdma-netns.io/shm-size": "keep"}})
	wantAdjusted(t, runContainer(t, kept, containerConfig("worker")), 64<<10)
}

// Exclusive mode, not the device cgroup, keeps pods apart: a container
// handed every uverbs node of the node by hand opens only its own pod's.
func TestIsolation(t *testing.T) {
	pod := runPod(t, "nri-iso", "rdma-eth1", podOpts{})
	all, _ := filepath.Glob("/dev/infiniband/uverbs*")
	c := runContainer(t, pod, containerConfig("greedy", all...))
	out := sh(t, c, `for f in /dev/infiniband/uverbs*; do if (exec 3<>"$f") 2>/dev/null; then echo "$f"; fi; done`)
	own := nodesOf(t, pod)
	if strings.Fields(out) == nil || len(strings.Fields(out)) != 1 || filepath.Base(out) != own[len(own)-1] {
		t.Fatalf("of %d uverbs nodes the container opened %q; want only its pod's %v", len(all), out, own)
	}
	t.Logf("handed all %d uverbs nodes, the container opened only %s", len(all), out)
}

// The plugin killed while pods run: their containers keep what they got;
// a container created meanwhile starts without it (and the doctor says
// so); the restarted plugin reports the running containers and adjusts
// the next ones. containerd killed and restarted: the plugin connects to
// the new one by itself.
func TestRestarts(t *testing.T) {
	pod := runPod(t, "nri-restart", "rdma-eth1", podOpts{})
	first := runContainer(t, pod, containerConfig("first"))
	wantAdjusted(t, first, 1<<20)

	plugin.kill()
	wantAdjusted(t, first, 1<<20)
	bare := runContainer(t, pod, containerConfig("while-down"))
	w := inspect(t, bare)
	if len(w.nodes) != 0 || w.memlock == "unlimited" {
		t.Fatalf("a container created without the plugin got %v, memlock %s", w.nodes, w.memlock)
	}
	if w.shmKiB != 1<<20 {
		t.Fatalf("/dev/shm of the pod is %d KiB in a later container, want the pod's 1 GiB: it is the pod's", w.shmKiB)
	}

	before := logLines()
	var err error
	if plugin, err = startPlugin(); err != nil {
		t.Fatal(err)
	}
	if l := logSince(before); !strings.Contains(l, "nri-test/nri-restart/first") || !strings.Contains(l, "nri-test/nri-restart/while-down") {
		t.Fatalf("the restarted plugin did not report the running containers:\n%s", l)
	}
	wantAdjusted(t, runContainer(t, pod, containerConfig("after-plugin-restart")), 1<<20)

	before = logLines()
	if ctd, err = ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := waitLog(before, "at connection", 30*time.Second); err != nil {
		t.Fatalf("%v:\n%s", err, logSince(before))
	}
	t.Logf("after containerd's restart the plugin reconnected:\n%s", logSince(before))
	wantAdjusted(t, first, 1<<20)
	wantAdjusted(t, runContainer(t, pod, containerConfig("after-runtime-restart")), 1<<20)
}

// serve runs a verbs server in c in the background until its TCP port
// (18515) listens.
func serve(t *testing.T, c *cririg.Container, argv []string) func() (string, error) {
	t.Helper()
	var wg sync.WaitGroup
	var out string
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var r cririg.ExecResult
		r, err = ctd.Exec(context.Background(), c, 2*time.Minute, argv...)
		out = r.Stdout + r.Stderr
	}()
	werr := cririg.Wait(30*time.Second, argv[0]+" listening", func() (bool, error) {
		r, err := ctd.Exec(ctx(t), c, 10*time.Second, "cat", "/proc/net/tcp", "/proc/net/tcp6")
		return strings.Contains(r.Stdout, ":4853 00000000:0000 0A") || strings.Contains(r.Stdout, ":4853 00000000000000000000000000000000:0000 0A"), err
	})
	if werr != nil {
		t.Fatal(werr)
	}
	return func() (string, error) {
		wg.Wait()
		return out, err
	}
}

func pingPong(t *testing.T, srv, cli *cririg.Container, sn, cn cririg.Network, size, iters int) rig.PingPong {
	t.Helper()
	wait := serve(t, srv, rig.PingPongArgs(sn.RDMA, size, iters, ""))
	r, cerr := ctd.Exec(ctx(t), cli, 2*time.Minute, rig.PingPongArgs(cn.RDMA, size, iters, sn.IP)...)
	sout, serr := wait()
	if cerr != nil || serr != nil {
		t.Fatalf("ibv_rc_pingpong: client: %v\n%s%s\nserver: %v\n%s", cerr, r.Stdout, r.Stderr, serr, sout)
	}
	pp, err := rig.ParsePingPong(r.Stdout + r.Stderr)
	if err != nil || pp.Iters != iters {
		t.Fatalf("ibv_rc_pingpong: %+v, %v", pp, err)
	}
	return pp
}

// writeBW repeats a run whose clock calibration failed under the VM's
// emulated CPU (every write completed, 0 MB/s reported).
func writeBW(t *testing.T, srv, cli *cririg.Container, sn, cn cririg.Network, size, iters int) rig.WriteBW {
	t.Helper()
	for try := 0; ; try++ {
		wait := serve(t, srv, rig.WriteBWArgs(sn.RDMA, size, iters, ""))
		r, cerr := ctd.Exec(ctx(t), cli, 2*time.Minute, rig.WriteBWArgs(cn.RDMA, size, iters, sn.IP)...)
		sout, serr := wait()
		out := r.Stdout + r.Stderr
		if cerr != nil || serr != nil {
			t.Fatalf("ib_write_bw: client: %v\n%s\nserver: %v\n%s", cerr, out, serr, sout)
		}
		if strings.Contains(out, "Correlation coefficient r^2") && try < 2 {
			continue
		}
		bw, err := rig.ParseWriteBW(out)
		if err != nil || bw.Iters != iters || bw.Bytes != size {
			t.Fatalf("ib_write_bw: %+v, %v:\n%s", bw, err, out)
		}
		return bw
	}
}
