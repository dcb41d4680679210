package nriplugin

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"

	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/logtest"
	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
)

// The runtime launches a copy of this test binary from its plugin
// directory (TestLaunchedByRuntime): it then runs as the plugin, against
// the fake kernel, with the lock and log file the test put next to it.
func TestMain(m *testing.M) {
	if _, ok := launchedAs(); ok {
		kernel, shm, visibleNetns = fakeKernel{}, noShm{}, nil
		sameAsHost = func() func(string) (bool, error) { return nil }
		dir := filepath.Dir(os.Args[0])
		os.Exit(Main([]string{"--lock", filepath.Join(dir, "lock"), "--log-file", filepath.Join(dir, "plugin.log")}, io.Discard))
	}
	os.Exit(m.Run())
}

func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// Pre-installed as /opt/nri/plugins/10-rdma-netns-nri with its
// configuration in /etc/nri/conf.d: the runtime (containerd's own NRI
// code) launches the plugin while starting, the plugin registers on the
// connection it was handed, under the runtime's name for it, takes its
// flags from the configuration, reports the containers created before it
// and adjusts the next one, marking it. The DaemonSet's instance stands
// by meanwhile, and serves once the runtime stops and the launched one
// exits.
func TestLaunchedByRuntime(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-rdma-netns-nri"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := "# written by rdma-netns install\n--memlock 64Gi\n--shm-size 2Gi\n--log-level debug --log-file " + filepath.Join(dir, "plugin.log") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "10-rdma-netns-nri.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := testPod("rdma-pod", "/run/netns/rdma-pod", nil)
	old := &api.Container{Id: "old", Name: "old", PodSandboxId: "rdma-pod"}
	nrilogOff()
	socket := filepath.Join(dir, "nri.sock")
	r, err := adaptation.New("fake-runtime", "v0", func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, []*api.PodSandbox{pod}, []*api.Container{old})
		return err
	}, func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil },
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(dir), adaptation.WithPluginConfigPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	// Start returns once the launched plugin registered, was configured
	// and synchronized, as containerd's start does before it serves CRI.
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			r.Stop()
		}
	}()
	log := filepath.Join(dir, "plugin.log")
	adj := create(t, r, pod, "nccl", true)
	if rl := adj.GetRlimits(); len(rl) != 1 || rl[0].Soft != 64<<30 {
		t.Fatalf("rlimits %v, want the configuration's 64Gi memlock; log:\n%s", rl, readFile(log))
	}
	by := adj.GetAnnotations()[AnnotationAdjustedBy]
	if !strings.HasPrefix(by, "10-rdma-netns-nri, pid ") || !strings.HasSuffix(by, "launched by the runtime") {
		t.Fatalf("annotation %s = %q, want the launched instance's name", AnnotationAdjustedBy, by)
	}
	l := readFile(log)
	for _, want := range []string{"configuration from the runtime: memlock 64Gi, /dev/shm 2Gi", "team-a/rdma-pod/old (rxe0): created while rdma-netns-nri was not serving"} {
		if !strings.Contains(l, want) {
			t.Fatalf("the plugin's log lacks %q:\n%s", want, l)
		}
	}

	// The DaemonSet's instance, on another socket so that it could serve
	// were it not for the lock, stands by.
	logs := &logtest.Buffer{}
	ds := &plugin{adj: &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: noShm{}}, log: logging.NewWriter(logs, "info"), who: "50-rdma-netns"}
	other := filepath.Join(t.TempDir(), "nri.sock")
	r2 := runtime(t, other, []*api.PodSandbox{pod}, nil)
	defer r2.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ds.log, filepath.Join(dir, "lock"), ds.who, stubs(ds, other, "50")) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the DaemonSet's instance stands by", func() bool { return strings.Contains(logs.String(), "standing by") })
	if adj := create(t, r2, pod, "while-standing-by", false); len(adj.GetLinux().GetDevices()) > 0 {
		t.Fatalf("the instance standing by adjusted a container; log:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "launched by the runtime holds "+filepath.Join(dir, "lock")) {
		t.Fatalf("standing by without naming the holder:\n%s", logs)
	}

	// The runtime stops (it kills what it launched): the lock is free and
	// the DaemonSet's instance serves.
	r.Stop()
	stopped = true
	if adj := create(t, r2, pod, "after", true); adj.GetAnnotations()[AnnotationAdjustedBy] != "50-rdma-netns" {
		t.Fatalf("after the launched plugin ended, adjusted by %q; log:\n%s", adj.GetAnnotations()[AnnotationAdjustedBy], logs)
	}
}

// A launched plugin that finds the lock held past its wait does not serve.
func TestLaunchedLockHeld(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "lock")
	lk, _, err := tryLock(lock, "50-rdma-netns, pid 1")
	if err != nil || lk == nil {
		t.Fatalf("tryLock: %v", err)
	}
	defer lk.release()
	start := time.Now()
	l, holder, err := waitLock(lock, "10-rdma-netns-nri", 300*time.Millisecond)
	if l != nil || err != nil || holder != "50-rdma-netns, pid 1" {
		t.Fatalf("waitLock = %v, %q, %v; want no lock, the holder's line", l, holder, err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("waitLock gave up before its time")
	}
	lk.release()
	if l, _, err := waitLock(lock, "10-rdma-netns-nri", time.Second); l == nil || err != nil {
		t.Fatalf("lock not free after release: %v", err)
	}
}

func TestParseConfig(t *testing.T) {
	o, err := parseConfig("# comment\n--memlock=unlimited  --shm-size 4Gi\n\n--log-level warn # trailing\n")
	if err != nil || o.Memlock != "unlimited" || o.ShmSize != "4Gi" || o.LogLevel != "warn" {
		t.Fatalf("parseConfig = %+v, %v", o, err)
	}
	for conf, want := range map[string]string{
		"--socket /run/nri.sock": "--socket",
		"--index 20":             "--index",
		"--lock /tmp/l":          "--lock",
		"--check-config /x":      "--check-config",
		"--shm":                  "flag provided but not defined",
		"--memlock lots":         "--memlock",
		"stray":                  "unexpected argument",
	} {
		if _, err := parseConfig(conf); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseConfig(%q) = %v, want an error with %q", conf, err, want)
		}
	}
}

// At connection: a container the plugin marked is reported as adjusted, one
// created without it as lacking its nodes and memlock (read from the
// kernel's /proc/PID/limits), and every such pod's /dev/shm is grown.
func TestExistingReport(t *testing.T) {
	proc := t.TempDir()
	os.MkdirAll(filepath.Join(proc, "42"), 0o755)
	os.WriteFile(filepath.Join(proc, "42", "limits"), []byte("Limit                     Soft Limit           Hard Limit           Units\nMax locked memory         8388608              8388608              bytes\n"), 0o644)
	shm := &countShm{}
	a := &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: shm}
	pod := testPod("rdma-pod", "/run/netns/rdma-pod", nil)
	shmMount := []*api.Mount{{Destination: "/dev/shm", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/rdma-pod/shm", Type: "bind"}}
	ctrs := []*api.Container{
		{Id: "a", Name: "marked", PodSandboxId: "rdma-pod", Mounts: shmMount, Annotations: map[string]string{AnnotationAdjustedBy: "10-rdma-netns-nri, pid 7, launched by the runtime"}},
		{Id: "b", Name: "bare", PodSandboxId: "rdma-pod", Pid: 42, Mounts: shmMount},
	}
	var text []string
	for _, l := range existing(a, []*api.PodSandbox{pod}, ctrs, proc) {
		text = append(text, l.text)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{
		"team-a/rdma-pod/marked (rxe0): adjusted at its creation by 10-rdma-netns-nri, pid 7",
		"team-a/rdma-pod/bare (rxe0): created while rdma-netns-nri was not serving, runs without /dev/infiniband/uverbs0, /dev/infiniband/rdma_cm, memlock 8Mi",
		"2 in pods holding RDMA devices: 1 adjusted by rdma-netns-nri, 1 lacking",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("report lacks %q:\n%s", want, all)
		}
	}
	if shm.resized != 1<<30 {
		t.Errorf("the pod's /dev/shm was resized to %d, want 1 GiB", shm.resized)
	}
}

// At connection, a running pod that asks for more /dev/shm than the node
// allows (created while the plugin was away, or under a higher cap) keeps
// its /dev/shm as it is, and the log says why.
func TestExistingAboveTheCap(t *testing.T) {
	shm := &countShm{}
	a := &podadjust.Adjuster{Policy: podadjust.DefaultPolicy, Kernel: fakeKernel{}, Shm: shm}
	pod := testPod("rdma-pod", "/run/netns/rdma-pod", map[string]string{podadjust.AnnotationShmSize: "1Ti"})
	ctrs := []*api.Container{{Id: "b", Name: "bare", PodSandboxId: "rdma-pod",
		Mounts: []*api.Mount{{Destination: "/dev/shm", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/rdma-pod/shm", Type: "bind"}}}}
	var text []string
	for _, l := range existing(a, []*api.PodSandbox{pod}, ctrs, t.TempDir()) {
		text = append(text, l.text)
	}
	if all := strings.Join(text, "\n"); !strings.Contains(all, "team-a/rdma-pod/bare (rxe0): created while rdma-netns-nri was not serving") ||
		!strings.Contains(all, "/dev/shm left as it is: rdma-netns-nri: the pod's annotation rdma-netns.io/shm-size: 1Ti") {
		t.Errorf("report:\n%s", all)
	}
	if shm.resized != 0 {
		t.Errorf("the pod's /dev/shm was resized to %d above the cap", shm.resized)
	}
}

// countShm is a 64 MiB tmpfs that remembers its last resize.
type countShm struct{ resized uint64 }

func (s *countShm) Size(string) (uint64, error) {
	if s.resized > 0 {
		return s.resized, nil
	}
	return 64 << 20, nil
}
func (s *countShm) Resize(_ string, n uint64) error { s.resized = n; return nil }

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.conf"), filepath.Join(dir, "bad.conf")
	os.WriteFile(good, []byte("--shm-size 2Gi\n"), 0o644)
	os.WriteFile(bad, []byte("--shm-size 2 GB\n"), 0o644)
	var out strings.Builder
	if code := Main([]string{"--check-config", good}, &out); code != 0 || !strings.HasPrefix(out.String(), ConfigOK+" memlock unlimited, /dev/shm 2Gi") {
		t.Fatalf("good file: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := Main([]string{"--check-config", bad}, &out); code != 1 || !strings.Contains(out.String(), "unexpected argument \"GB\"") {
		t.Fatalf("bad file: exit %d, %q", code, out.String())
	}
}

// The doctor reads the annotations the plugin writes and its lock (it
// links no NRI code, so it has its own copy of their names).
func TestDoctorKnowsThePlugin(t *testing.T) {
	if doctor.NRIAdjustedBy != AnnotationAdjustedBy || doctor.NRIWarnings != AnnotationWarnings {
		t.Fatalf("doctor reads %q and %q, the plugin writes %q and %q", doctor.NRIAdjustedBy, doctor.NRIWarnings, AnnotationAdjustedBy, AnnotationWarnings)
	}
	if doctor.RealEnv("/sys", "/var/lib/cni/rdma-netns").NRILock != DefaultLock {
		t.Fatal("the doctor looks for the plugin's lock elsewhere")
	}
}

// A default /dev/shm above the cap a pod may ask for is a configuration
// error, on the command line and in the runtime's configuration file.
func TestShmSizeAboveTheCap(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "10-rdma-netns-nri.conf")
	os.WriteFile(conf, []byte("--shm-size 2Gi\n"), 0o644)
	var out strings.Builder
	if code := Main([]string{"--shm-size", "32Gi", "--check-config", conf}, &out); code != 2 || !strings.Contains(out.String(), "--shm-size 32Gi") || !strings.Contains(out.String(), "--max-shm-size 16Gi") {
		t.Errorf("--shm-size 32Gi with the default cap: exit %d, %q; want 2 naming both flags", code, out.String())
	}
	if _, err := parseConfig("--shm-size 32Gi\n"); err == nil || !strings.Contains(err.Error(), "--max-shm-size") {
		t.Errorf("parseConfig(--shm-size 32Gi) = %v, want an error naming --max-shm-size", err)
	}
}
