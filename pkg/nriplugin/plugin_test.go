package nriplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/logtest"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// fakeKernel: the netns /run/netns/rdma-pod holds rxe0 (uverbs0); the
// mode is exclusive unless mode says otherwise.
type fakeKernel struct{ mode string }

func (k fakeKernel) NetnsMode() (string, error) {
	if k.mode == "" {
		return rdmans.ModeExclusive, nil
	}
	return k.mode, nil
}

func (fakeKernel) VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error) {
	if nsPath != "/run/netns/rdma-pod" {
		return &rdmans.VerbsNodes{}, nil
	}
	return &rdmans.VerbsNodes{
		Devices: []rdmans.VerbsNode{{Device: "rxe0", Uverbs: &rdmans.CharDev{Name: "uverbs0", Major: 231, Minor: 192}}},
		RdmaCM:  &rdmans.CharDev{Name: "rdma_cm", Major: 10, Minor: 122},
	}, nil
}

type noShm struct{}

func (noShm) Size(string) (uint64, error) { return 64 << 20, nil }
func (noShm) Resize(string, uint64) error { return nil }

func testPod(id, netns string, ann map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: id, Name: id, Namespace: "team-a", Annotations: ann,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "network", Path: netns}}}}
}

// nrilogOff silences the runtime side's own chatter.
func nrilogOff() { nrilog.Set(nriLogger{logging.Discard()}) }

// runtime is containerd's side of NRI (the same adaptation package
// containerd links), on a socket of the test's.
func runtime(t *testing.T, socket string, pods []*api.PodSandbox, ctrs []*api.Container) *adaptation.Adaptation {
	t.Helper()
	nrilogOff()
	dir := t.TempDir()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	r, err := adaptation.New("fake-runtime", "v0", sync, update, adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// create asks the runtime to create a container, as the CRI plugin does,
// until a connected plugin adjusts it or the time is up.
func create(t *testing.T, r *adaptation.Adaptation, pod *api.PodSandbox, name string, wantAdjusted bool) *api.ContainerAdjustment {
	t.Helper()
	ctr := &api.Container{Id: name, Name: name, PodSandboxId: pod.Id, Linux: &api.LinuxContainer{}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: pod, Container: ctr})
		if err != nil {
			t.Fatalf("CreateContainer %s: %v", name, err)
		}
		adj := resp.GetAdjust()
		if len(adj.GetLinux().GetDevices()) > 0 || !wantAdjusted || time.Now().After(deadline) {
			return adj
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Through the runtime's own side of NRI: a container of a pod holding an
// RDMA device gets its nodes and memlock, one of a pod without gets
// nothing; the existing containers are reported at connection; when the
// runtime restarts, the plugin connects again by itself and adjusts the
// containers created after.
func TestPluginAgainstRuntime(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	rdmaPod := testPod("rdma-pod", "/run/netns/rdma-pod", nil)
	plainPod := testPod("plain-pod", "/run/netns/plain-pod", nil)
	existing := []*api.Container{{Id: "old", Name: "old", PodSandboxId: "rdma-pod"}, {Id: "web", Name: "web", PodSandboxId: "plain-pod"}}
	r := runtime(t, socket, []*api.PodSandbox{rdmaPod, plainPod}, existing)

	logs := &logtest.Buffer{}
	p := &plugin{adj: &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: noShm{}}, log: logging.NewWriter(logs, "info")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The runtime process dying closes its end of every plugin
	// connection; the in-process runtime's Stop does not, so the test
	// closes them for it.
	var mu sync.Mutex
	var conns []net.Conn
	dial := stub.WithDialer(func(path string) (net.Conn, error) {
		c, err := net.Dial("unix", path)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	})
	go func() {
		if err := run(ctx, p.log, "", "", stubs(p, socket, "50", dial)); err != nil {
			t.Error(err)
		}
		close(done)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the plugin did not stop when asked")
		}
	}()

	adj := create(t, r, rdmaPod, "nccl", true)
	var paths []string
	for _, d := range adj.GetLinux().GetDevices() {
		paths = append(paths, d.Path)
	}
	if !slices.Equal(paths, []string{"/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"}) {
		t.Fatalf("devices %v; log:\n%s", paths, logs)
	}
	if rl := adj.GetRlimits(); len(rl) != 1 || rl[0].Type != "RLIMIT_MEMLOCK" || rl[0].Soft != ^uint64(0) {
		t.Fatalf("rlimits %v", rl)
	}
	if adj := create(t, r, plainPod, "web2", false); len(adj.GetLinux().GetDevices()) > 0 || len(adj.GetRlimits()) > 0 || len(adj.GetMounts()) > 0 {
		t.Fatalf("a pod without an RDMA device was adjusted: %v", adj)
	}
	if l := logs.String(); !strings.Contains(l, "2 container(s) existed; 1 in pods holding RDMA devices: 0 adjusted by rdma-netns-nri, 1 lacking") ||
		!strings.Contains(l, "team-a/rdma-pod/old (rxe0): created while rdma-netns-nri was not serving, runs without /dev/infiniband/uverbs0, /dev/infiniband/rdma_cm") || strings.Contains(l, "plain-pod/web (") {
		t.Fatalf("existing containers not reported as expected:\n%s", l)
	}

	// The runtime restarts: it drops the connection, then listens anew.
	r.Stop()
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	r = runtime(t, socket, []*api.PodSandbox{rdmaPod}, nil)
	defer r.Stop()
	if adj := create(t, r, rdmaPod, "after-restart", true); len(adj.GetLinux().GetDevices()) != 2 {
		t.Fatalf("not adjusted after the runtime restarted; log:\n%s", logs)
	}
	if l := logs.String(); !strings.Contains(l, "retrying in") || strings.Count(l, "connected to fake-runtime") < 2 {
		t.Fatalf("log does not show the reconnection:\n%s", l)
	}
}

// Without a runtime the plugin keeps trying, and stops when told to.
func TestRunRetriesUntilStopped(t *testing.T) {
	logs := &logtest.Buffer{}
	p := &plugin{adj: &podadjust.Adjuster{Kernel: fakeKernel{}, Shm: noShm{}}, log: logging.NewWriter(logs, "info")}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := run(ctx, p.log, "", "", stubs(p, filepath.Join(t.TempDir(), "nri.sock"), "50")); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("run did not return when its context ended")
	}
	if n := strings.Count(logs.String(), "retrying in"); n < 2 {
		t.Fatalf("%d retries in 1.2s, want at least 2:\n%s", n, logs)
	}
}

func TestMainFlags(t *testing.T) {
	for _, args := range [][]string{{"--memlock", "lots"}, {"--shm-size", "0"}, {"--shm-size", "2GB"}, {"--shm-size", "17Gi"}, {"--max-shm-size", "0"},
		{"--max-shm-size", "keep"}, {"--max-shm-size", "512Mi"}, {"--index", "5"}, {"--socket", "nri.sock"}, {"stray"},
		{"--log-level", "verbose"}, {"--sandbox-root", "/run/containerd/io.containerd.grpc.v1.cri/sandboxes,relative"}} {
		var stderr bytes.Buffer
		if code := Main(args, &stderr); code != 2 || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("%v: exit %d, want 2 (usage error) naming %s; stderr:\n%s", args, code, args[0], stderr.String())
		}
	}
	o := Options{Socket: "/run/nri.sock", Memlock: "1.5Gi", ShmSize: "2G", MaxShmSize: "4Gi", SandboxRoots: "/run/k3s/containerd/io.containerd.grpc.v1.cri/sandboxes/", Index: "50", LogLevel: "debug"}
	if p, err := o.Policy(); err != nil || p.Memlock.Bytes != 1536<<20 || p.ShmSize != 2e9 || p.MaxShmSize != 4<<30 || !slices.Equal(p.SandboxRoots, []string{"/run/k3s/containerd/io.containerd.grpc.v1.cri/sandboxes"}) {
		t.Errorf("Policy() = %+v, %v", p, err)
	}
	var stderr bytes.Buffer
	if code := Main([]string{"--help"}, &stderr); code != 0 || !strings.Contains(stderr.String(), "rdma-netns.io/shm-size") {
		t.Errorf("--help: exit %d, usage:\n%s", code, stderr.String())
	}
}

// A stub that cannot be made at all ends the run with an error instead of
// retrying forever.
func TestRunStubError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := run(ctx, logging.Discard(), "", "", func(func()) (stub.Stub, error) { return nil, errors.New("no handler") })
	if err == nil || !strings.Contains(err.Error(), "cannot set up the NRI plugin: no handler") {
		t.Fatalf("run = %v, want the stub's error", err)
	}
}

// servePlugin runs plugin p against the runtime at socket until the test
// ends, and waits until the runtime has synchronized it.
func servePlugin(t *testing.T, p *plugin, socket string, logs *logtest.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, p.log, "", "", stubs(p, socket, "50"))
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "at connection") {
		if time.Now().After(deadline) {
			t.Fatalf("the plugin did not connect:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// In shared mode the plugin says once, when it connects, that it adjusts
// nothing and how to fix it; a container of a pod whose netns sees rxe0
// then gets nothing, and nothing is logged per container above debug.
func TestPluginSharedMode(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	rdmaPod := testPod("rdma-pod", "/run/netns/rdma-pod", nil)
	r := runtime(t, socket, nil, nil)
	defer r.Stop()
	logs := &logtest.Buffer{}
	p := &plugin{adj: &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{mode: rdmans.ModeShared}, Shm: noShm{}},
		log: logging.NewWriter(logs, "info")}
	servePlugin(t, p, socket, logs)
	for _, name := range []string{"nccl", "sidecar"} {
		if adj := create(t, r, rdmaPod, name, false); len(adj.GetLinux().GetDevices()) > 0 || len(adj.GetRlimits()) > 0 {
			t.Fatalf("a container was adjusted in shared mode: %v", adj)
		}
	}
	l := logs.String()
	if strings.Count(l, "shared netns mode") != 1 || !strings.Contains(l, "netns_mode=0") || strings.Contains(l, "nccl") {
		t.Fatalf("want the shared mode and its fix said once, at connection, and no line per container:\n%s", l)
	}
}

// A pod asking more /dev/shm than the node allows fails its container's
// creation: the runtime gets the plugin's error, which kubelet shows in
// the pod's events, and the node log names the pod. A pod within the cap
// is adjusted as usual.
func TestPluginRefusesShmAboveTheCap(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	greedy := testPod("rdma-pod", "/run/netns/rdma-pod", map[string]string{podadjust.AnnotationShmSize: "1Ti"})
	r := runtime(t, socket, nil, nil)
	defer r.Stop()
	logs := &logtest.Buffer{}
	p := &plugin{adj: &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: noShm{}}, log: logging.NewWriter(logs, "info")}
	servePlugin(t, p, socket, logs)
	ctr := &api.Container{Id: "nccl", Name: "nccl", PodSandboxId: greedy.Id, Linux: &api.LinuxContainer{}}
	resp, err := r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: greedy, Container: ctr})
	if err == nil {
		t.Fatalf("a container of a pod asking 1Ti of /dev/shm was created: %v", resp.GetAdjust())
	}
	for _, want := range []string{"rdma-netns.io/shm-size", "1Ti", "--max-shm-size 16Gi"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the runtime's error %q does not name %q", err, want)
		}
	}
	if l := logs.String(); !strings.Contains(l, "team-a/rdma-pod/nccl") || !strings.Contains(l, "1Ti") {
		t.Errorf("the node log does not name the refused container:\n%s", l)
	}
	within := testPod("rdma-pod", "/run/netns/rdma-pod", map[string]string{podadjust.AnnotationShmSize: "16Gi"})
	if adj := create(t, r, within, "ok", true); len(adj.GetLinux().GetDevices()) != 2 {
		t.Fatalf("a pod within the cap was not adjusted; log:\n%s", logs)
	}
}

// ulimitAdjuster stands for another NRI plugin that runs before ours
// (containerd's ulimit-adjuster sample, a device plugin's NRI side): it
// sets memlock and adds uverbs0 to every container.
type ulimitAdjuster struct{ synced chan struct{} }

func (u *ulimitAdjuster) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	close(u.synced)
	return nil, nil
}

func (u *ulimitAdjuster) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	adj.AddRlimit("RLIMIT_MEMLOCK", ^uint64(0), ^uint64(0))
	adj.AddDevice(&api.LinuxDevice{Path: "/dev/infiniband/uverbs0", Type: "c", Major: 231, Minor: 192})
	return adj, nil, nil
}

// Beside another plugin that set memlock unlimited and added uverbs0
// first, the runtime (containerd's NRI code, which fails a container
// whose rlimit or device two plugins set) creates the container: it has
// the other plugin's memlock and uverbs0, and our rdma_cm.
func TestPluginBesideAnotherPlugin(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "nri.sock")
	rdmaPod := testPod("rdma-pod", "/run/netns/rdma-pod", nil)
	r := runtime(t, socket, nil, nil)
	defer r.Stop()

	other := &ulimitAdjuster{synced: make(chan struct{})}
	st, err := stub.New(other, stub.WithPluginName("ulimit-adjuster"), stub.WithPluginIdx("10"), stub.WithSocketPath(socket),
		stub.WithLogger(nriLogger{logging.Discard()}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.Run(ctx)
	select {
	case <-other.synced:
	case <-time.After(10 * time.Second):
		t.Fatal("the other plugin did not connect")
	}
	logs := &logtest.Buffer{}
	p := &plugin{adj: &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: noShm{}}, log: logging.NewWriter(logs, "info")}
	servePlugin(t, p, socket, logs)

	ctr := &api.Container{Id: "nccl", Name: "nccl", PodSandboxId: rdmaPod.Id, Linux: &api.LinuxContainer{}}
	resp, err := r.CreateContainer(context.Background(), &api.CreateContainerRequest{Pod: rdmaPod, Container: ctr})
	if err != nil {
		t.Fatalf("the runtime failed the container: %v\nlog:\n%s", err, logs)
	}
	var paths []string
	for _, d := range resp.GetAdjust().GetLinux().GetDevices() {
		paths = append(paths, d.Path)
	}
	slices.Sort(paths)
	if !slices.Equal(paths, []string{"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"}) {
		t.Fatalf("devices %v, want the other plugin's uverbs0 and our rdma_cm", paths)
	}
	if rl := resp.GetAdjust().GetRlimits(); len(rl) != 1 || rl[0].Soft != ^uint64(0) {
		t.Fatalf("rlimits %v, want the other plugin's unlimited memlock only", rl)
	}
	if l := logs.String(); !strings.Contains(l, "had /dev/infiniband/uverbs0 already") || !strings.Contains(l, "memlock unlimited already") {
		t.Fatalf("the log does not say what the container had:\n%s", l)
	}
}

// The host's netns is told by identity, whatever the path; a path that is
// no netns, or a host netns that cannot be read, is an error (nothing is
// granted), not "another netns".
func TestHostNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns")
	}
	other, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(other)
	defer other.Close()
	otherPath := other.Path()
	host := hostNetns("/proc/self/ns/net")
	self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), os.Getpid())
	if same, err := host(self); !same || err != nil {
		t.Fatalf("%s: %v, %v; want the host's", self, same, err)
	}
	if same, err := host(otherPath); same || err != nil {
		t.Fatalf("a new netns: %v, %v; want another", same, err)
	}
	file := filepath.Join(t.TempDir(), "cni-gone")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := host(file); err == nil {
		t.Fatal("an empty file (a netns whose bind mount went away) was told apart from the host's")
	}
	if _, err := hostNetns("/nonexistent/ns/net")(otherPath); err == nil {
		t.Fatal("a host netns that cannot be read still told paths apart")
	}
}
