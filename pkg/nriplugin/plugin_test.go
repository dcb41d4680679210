package nriplugin

import (
	"bytes"
	"context"
	"errors"
	"net"
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

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// fakeKernel: the netns /run/netns/rdma-pod holds rxe0 (uverbs0).
type fakeKernel struct{}

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

// syncBuffer is a log that the plugin's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

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

	logs := &syncBuffer{}
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
	logs := &syncBuffer{}
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
	for _, args := range [][]string{{"--memlock", "lots"}, {"--shm-size", "0"}, {"--index", "5"}, {"--socket", "nri.sock"}, {"stray"}} {
		var stderr bytes.Buffer
		if code := Main(args, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage error); stderr:\n%s", args, code, stderr.String())
		}
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
