package podadjust

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// fakeKernel answers from a map of netns path -> what the kernel would
// say from inside it, and counts the questions. Its netns mode is mode,
// or modeErr.
type fakeKernel struct {
	in      map[string]*rdmans.VerbsNodes
	err     error
	asked   []string
	mode    string
	modeErr error
}

func (k *fakeKernel) NetnsMode() (string, error) { return k.mode, k.modeErr }

func (k *fakeKernel) VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error) {
	k.asked = append(k.asked, nsPath)
	if k.err != nil {
		return nil, k.err
	}
	if v, ok := k.in[nsPath]; ok {
		return v, nil
	}
	return &rdmans.VerbsNodes{}, nil
}

// fakeShm is a set of tmpfs mounts by path.
type fakeShm struct {
	size      map[string]uint64
	resizeErr error
	resized   []string
}

func (s *fakeShm) Size(path string) (uint64, error) {
	n, ok := s.size[path]
	if !ok {
		return 0, errors.New("not a tmpfs mount")
	}
	return n, nil
}

func (s *fakeShm) Resize(path string, n uint64) error {
	if s.resizeErr != nil {
		return s.resizeErr
	}
	s.size[path] = n
	s.resized = append(s.resized, path)
	return nil
}

const (
	sandboxID = "5f2c0ffee"
	podNetns  = "/var/run/netns/cni-1234"
	shmPath   = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/" + sandboxID + "/shm"
)

func uverbs(n uint32) *rdmans.CharDev {
	return &rdmans.CharDev{Name: "uverbs" + string(rune('0'+n)), Major: 231, Minor: 192 + n}
}

var rdmaCM = &rdmans.CharDev{Name: "rdma_cm", Major: 10, Minor: 122}

// world is a node with pod netns podNetns holding rxe1 (uverbs1), another
// pod's netns holding rxe2 (uverbs2), and the sandbox's tmpfs at 64 MiB.
func world() (*Adjuster, *fakeKernel, *fakeShm) {
	k := &fakeKernel{mode: rdmans.ModeExclusive, in: map[string]*rdmans.VerbsNodes{
		podNetns:                   {Devices: []rdmans.VerbsNode{{Device: "rxe1", Uverbs: uverbs(1)}}, RdmaCM: rdmaCM},
		"/var/run/netns/cni-other": {Devices: []rdmans.VerbsNode{{Device: "rxe2", Uverbs: uverbs(2)}}, RdmaCM: rdmaCM},
	}}
	s := &fakeShm{size: map[string]uint64{shmPath: 64 << 20, "/dev/shm": 8 << 30}}
	return &Adjuster{Policy: DefaultPolicy, Kernel: k, Shm: s}, k, s
}

func pod(annotations map[string]string, memLimit int64) *api.PodSandbox {
	p := &api.PodSandbox{
		Id: sandboxID, Name: "trainer-0", Namespace: "team-a", Annotations: annotations,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{
			{Type: "ipc"}, {Type: "uts"}, {Type: "network", Path: podNetns},
		}},
	}
	if memLimit > 0 {
		p.Linux.PodResources = &api.LinuxResources{Memory: &api.LinuxMemory{Limit: api.Int64(memLimit)}}
	}
	return p
}

func container(shmSource string, memLimit int64) *api.Container {
	c := &api.Container{Id: "c1", Name: "nccl", PodSandboxId: sandboxID, Linux: &api.LinuxContainer{}}
	if shmSource != "" {
		c.Mounts = []*api.Mount{
			{Destination: "/etc/hosts", Source: "/var/lib/containerd/sandboxes/" + sandboxID + "/hosts", Type: "bind"},
			{Destination: "/dev/shm", Source: shmSource, Type: "bind", Options: []string{"rbind", "ro"}},
		}
	}
	if memLimit > 0 {
		c.Linux.Resources = &api.LinuxResources{Memory: &api.LinuxMemory{Limit: api.Int64(memLimit)}}
	}
	return c
}

func devicePaths(adj *api.ContainerAdjustment) []string {
	var out []string
	for _, d := range adj.GetLinux().GetDevices() {
		out = append(out, d.Path)
	}
	return out
}

func memlock(adj *api.ContainerAdjustment) []*api.POSIXRlimit {
	var out []*api.POSIXRlimit
	for _, r := range adj.GetRlimits() {
		if r.Type == "RLIMIT_MEMLOCK" {
			out = append(out, r)
		}
	}
	return out
}

// A container of a pod holding rxe1 gets uverbs1 (not the other pod's
// uverbs2) and rdma_cm with the kernel's numbers, unlimited memlock, and
// the pod's /dev/shm grows to the node default.
func TestAdjustRDMAPod(t *testing.T) {
	a, k, s := world()
	adj, d := a.Adjust(pod(nil, 0), container(shmPath, 0))
	if adj == nil {
		t.Fatalf("not adjusted: %s", d)
	}
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"}) {
		t.Fatalf("devices %v, want exactly uverbs1 and rdma_cm", got)
	}
	for i, want := range []rdmans.CharDev{*uverbs(1), *rdmaCM} {
		dev := adj.Linux.Devices[i]
		if dev.Type != "c" || dev.Major != int64(want.Major) || dev.Minor != int64(want.Minor) || dev.FileMode.Get().Perm() != 0o666 {
			t.Errorf("device %s = %s %d:%d mode %v, want c %d:%d 0666", dev.Path, dev.Type, dev.Major, dev.Minor, dev.FileMode.Get(), want.Major, want.Minor)
		}
	}
	if m := memlock(adj); len(m) != 1 || m[0].Soft != math.MaxUint64 || m[0].Hard != math.MaxUint64 {
		t.Fatalf("memlock %v, want one unlimited", m)
	}
	if s.size[shmPath] != 1<<30 || !slices.Equal(s.resized, []string{shmPath}) {
		t.Fatalf("shm %v resized %v, want the sandbox's tmpfs at 1Gi", s.size, s.resized)
	}
	if s.size["/dev/shm"] != 8<<30 {
		t.Fatal("the node's /dev/shm changed")
	}
	if !slices.Equal(k.asked, []string{podNetns}) {
		t.Fatalf("kernel asked about %v, want the pod's netns only", k.asked)
	}
	if d.Outcome != Adjusted || !strings.Contains(d.String(), "rxe1") || !strings.Contains(d.Shm, "1Gi") {
		t.Fatalf("decision %q", d)
	}
	// The pod's second container: same devices, /dev/shm already at size.
	adj, d = a.Adjust(pod(nil, 0), container(shmPath, 0))
	if len(devicePaths(adj)) != 2 || len(s.resized) != 1 || !strings.Contains(d.Shm, "already") {
		t.Fatalf("second container: devices %v, resized %v, shm %q", devicePaths(adj), s.resized, d.Shm)
	}
}

// Pods without an RDMA device, opted out or in the host's netns are never
// touched, not even their /dev/shm.
func TestAdjustLeavesOthersAlone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pod     func() *api.PodSandbox
		self    bool
		selfErr error
		err     error
		asked   bool
		outcome Outcome
		reason  string
	}{
		{"no RDMA device", func() *api.PodSandbox {
			p := pod(nil, 0)
			p.Linux.Namespaces[2].Path = "/var/run/netns/cni-empty"
			return p
		}, false, nil, nil, true, NoDevice, "no RDMA device"},
		{"opted out", func() *api.PodSandbox { return pod(map[string]string{AnnotationNRI: Skip}, 0) }, false, nil, nil, false, OptedOut, "opts out"},
		{"host network", func() *api.PodSandbox {
			p := pod(nil, 0)
			p.Linux.Namespaces = p.Linux.Namespaces[:2]
			return p
		}, false, nil, nil, false, HostNetwork, "host network"},
		{"netns path opens the host's", func() *api.PodSandbox { return pod(nil, 0) }, true, nil, nil, false, HostNetwork, "the host's"},
		{"kernel cannot answer", func() *api.PodSandbox { return pod(nil, 0) }, false, nil, errors.New("enter netns: no such file"), true, NetnsUnknown, "no such file"},
		{"cannot tell the netns from the host's", func() *api.PodSandbox { return pod(nil, 0) }, false, errors.New("not a network namespace"), nil, false, NetnsUnknown, "cannot tell whether"},
		{"no Linux section", func() *api.PodSandbox { return &api.PodSandbox{Id: sandboxID} }, false, nil, nil, false, HostNetwork, "host network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, k, s := world()
			k.err = tc.err
			a.SameAsSelf = func(string) (bool, error) { return tc.self, tc.selfErr }
			adj, d := a.Adjust(tc.pod(), container(shmPath, 0))
			if adj != nil {
				t.Fatalf("adjusted: %+v", adj)
			}
			if d.Outcome != tc.outcome || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("outcome %d %q, want %d saying %q", d.Outcome, d.Reason, tc.outcome, tc.reason)
			}
			if (len(k.asked) > 0) != tc.asked {
				t.Fatalf("kernel asked %v", k.asked)
			}
			if len(s.resized) > 0 {
				t.Fatalf("/dev/shm resized: %v", s.resized)
			}
		})
	}
}

// In shared mode every netns sees every RDMA device, so "the pod's netns
// holds rxe1" proves nothing: a pod holding rxe1, like any other, gets no
// device, no memlock and no /dev/shm; so does every pod when the mode
// cannot be read. The reason names the fix.
func TestAdjustNothingOutsideExclusiveMode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    string
		modeErr error
		say     string
	}{
		{"shared", rdmans.ModeShared, nil, "shared netns mode"},
		{"unreadable", "", errors.New("the kernel's RDMA subsystem does not answer"), "cannot read the RDMA netns mode"},
		{"unknown answer", "bogus", nil, "bogus netns mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, k, s := world()
			k.mode, k.modeErr = tc.mode, tc.modeErr
			for _, netns := range []string{podNetns, "/var/run/netns/cni-plain"} {
				p := pod(nil, 0)
				p.Linux.Namespaces[2].Path = netns
				adj, d := a.Adjust(p, container(shmPath, 0))
				if adj != nil {
					t.Fatalf("pod in %s adjusted in %s mode: devices %v, memlock %v", netns, tc.name, devicePaths(adj), memlock(adj))
				}
				if d.Outcome != NotExclusive || !strings.Contains(d.Reason, tc.say) || !strings.Contains(d.Reason, "netns_mode=0") {
					t.Fatalf("outcome %d %q, want NotExclusive saying %q and the fix", d.Outcome, d.Reason, tc.say)
				}
			}
			if len(s.resized) > 0 || len(k.asked) > 0 {
				t.Fatalf("/dev/shm resized %v, kernel asked about %v", s.resized, k.asked)
			}
			if a.NotExclusive() == "" {
				t.Fatal("NotExclusive says nothing")
			}
		})
	}
}

// The pod's /dev/shm: the policy's size, the annotation's, or the
// runtime's; never above the memory limit; only the sandbox's tmpfs; only
// ever grown.
func TestAdjustShm(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ann       map[string]string
		podLimit  int64
		ctrLimit  int64
		source    string
		have      uint64
		policy    uint64
		resizeErr error
		want      uint64 // size afterwards
		say       string
		warn      string
	}{
		{"node default", nil, 0, 0, shmPath, 64 << 20, 1 << 30, nil, 1 << 30, "node default", ""},
		{"annotation chooses", map[string]string{AnnotationShmSize: "16Gi"}, 0, 0, shmPath, 64 << 20, 1 << 30, nil, 16 << 30, "annotation", ""},
		{"annotation keeps 64MiB", map[string]string{AnnotationShmSize: Keep}, 0, 0, shmPath, 64 << 20, 1 << 30, nil, 64 << 20, "kept", ""},
		{"node keeps", nil, 0, 0, shmPath, 64 << 20, 0, nil, 64 << 20, "kept", ""},
		{"capped at the pod's limit", map[string]string{AnnotationShmSize: "16Gi"}, 4 << 30, 8 << 30, shmPath, 64 << 20, 1 << 30, nil, 4 << 30, "the pod's memory limit", ""},
		{"capped at the container's limit without pod resources", nil, 0, 512 << 20, shmPath, 64 << 20, 1 << 30, nil, 512 << 20, "the container's memory limit", ""},
		{"limit above the policy", nil, 64 << 30, 0, shmPath, 64 << 20, 1 << 30, nil, 1 << 30, "node default", ""},
		{"never shrunk", map[string]string{AnnotationShmSize: "128Mi"}, 0, 0, shmPath, 2 << 30, 1 << 30, nil, 2 << 30, "already", ""},
		{"bad annotation: node default", map[string]string{AnnotationShmSize: "lots"}, 0, 0, shmPath, 64 << 20, 1 << 30, nil, 1 << 30, "node default", "ignored"},
		{"hostIPC: the node's /dev/shm", nil, 0, 0, "/dev/shm", 8 << 30, 1 << 30, nil, 8 << 30, "not from the pod sandbox", ""},
		{"the pod's own emptyDir", nil, 0, 0, "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/dshm", 64 << 20, 1 << 30, nil, 64 << 20, "not from the pod sandbox", ""},
		{"no /dev/shm mount", nil, 0, 0, "", 64 << 20, 1 << 30, nil, 64 << 20, "no /dev/shm", ""},
		{"CRI-O's sandbox tmpfs", nil, 0, 0, "/run/containers/storage/overlay-containers/" + sandboxID + "/userdata/shm", 64 << 20, 1 << 30, nil, 1 << 30, "node default", ""},
		{"names the sandbox outside the sandbox roots", nil, 0, 0, "/var/lib/other/" + sandboxID + "/shm", 64 << 20, 1 << 30, nil, 64 << 20, "not from the pod sandbox", ""},
		{"another sandbox's tmpfs", nil, 0, 0, "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/other/" + sandboxID, 64 << 20, 1 << 30, nil, 64 << 20, "not from the pod sandbox", ""},
		{"unlimited tmpfs", nil, 0, 0, shmPath, Unlimited, 1 << 30, nil, Unlimited, "unlimited already", ""},
		{"sandbox tmpfs gone", nil, 0, 0, "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/" + sandboxID + "/gone", 0, 1 << 30, nil, 0, "unchanged", "cannot measure"},
		{"remount refused", nil, 0, 0, shmPath, 64 << 20, 1 << 30, errors.New("operation not permitted"), 64 << 20, "unchanged at 64Mi", "not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _, s := world()
			a.Policy.ShmSize = tc.policy
			s.resizeErr = tc.resizeErr
			src := tc.source
			if src != "" && src != "/dev/shm" && tc.have > 0 {
				s.size[src] = tc.have // mounted, at that size
			}
			adj, d := a.Adjust(pod(tc.ann, tc.podLimit), container(src, tc.ctrLimit))
			if adj == nil || len(devicePaths(adj)) != 2 {
				t.Fatalf("an RDMA pod must get its devices whatever happens to /dev/shm: %s", d)
			}
			got := s.size[src]
			if src == "" {
				got = s.size[shmPath]
			}
			if got != tc.want {
				t.Errorf("size %s, want %s (%s)", FormatSize(got), FormatSize(tc.want), d.Shm)
			}
			if !strings.Contains(d.Shm, tc.say) {
				t.Errorf("shm decision %q, want it to say %q", d.Shm, tc.say)
			}
			warned := strings.Join(d.Warnings, "; ")
			if (tc.warn == "") != (warned == "") || !strings.Contains(warned, tc.warn) {
				t.Errorf("warnings %q, want %q", warned, tc.warn)
			}
		})
	}
}

func TestAdjustMemlockPolicy(t *testing.T) {
	a, _, _ := world()
	a.Policy.Memlock = Memlock{Keep: true}
	adj, _ := a.Adjust(pod(nil, 0), container(shmPath, 0))
	if len(memlock(adj)) != 0 {
		t.Fatalf("keep: memlock %v", memlock(adj))
	}
	a.Policy.Memlock = Memlock{Bytes: 64 << 30}
	adj, d := a.Adjust(pod(nil, 0), container(shmPath, 0))
	if m := memlock(adj); len(m) != 1 || m[0].Soft != 64<<30 || m[0].Hard != 64<<30 || d.Memlock != "64Gi" {
		t.Fatalf("64Gi: memlock %v, decision %q", m, d.Memlock)
	}
}

// A device without a uverbs node (ib_uverbs not loaded) and a kernel
// without rdma_cm: the rest is still given, and the decision says what
// is missing.
func TestAdjustMissingNodes(t *testing.T) {
	a, k, _ := world()
	k.in[podNetns] = &rdmans.VerbsNodes{Devices: []rdmans.VerbsNode{{Device: "rxe1"}, {Device: "mlx5_3", Uverbs: uverbs(3)}}}
	adj, d := a.Adjust(pod(nil, 0), container(shmPath, 0))
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/infiniband/uverbs3"}) {
		t.Fatalf("devices %v", got)
	}
	w := strings.Join(d.Warnings, "; ")
	if !strings.Contains(w, "no uverbs node for rxe1") || !strings.Contains(w, "rdma_cm") || len(memlock(adj)) != 1 {
		t.Fatalf("decision %s", d)
	}
}

// Sizes are read as Kubernetes writes quantities.
func TestParse(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "4096": 4096, "64Mi": 64 << 20, "512Mi": 512 << 20, "16Gi": 16 << 30, "1Ti": 1 << 40,
		"2k": 2000, "1G": 1e9, "2G": 2e9, " 8Ki ": 8 << 10, "1.5Gi": 1536 << 20, "1e9": 1e9, "0.5Ki": 512, "1.0001": 2} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "-1Gi", "16GB", "2K", "lots", "99999999999999999999", "17179869184Ti", "1e30"} {
		if n, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, n)
		}
	}
	if n, err := ParseShmSize("keep"); err != nil || n != 0 {
		t.Errorf("ParseShmSize(keep) = %d, %v", n, err)
	}
	if _, err := ParseShmSize("0"); err == nil {
		t.Error("a /dev/shm of size 0 (unlimited tmpfs) accepted")
	}
	for in, want := range map[string]Memlock{"unlimited": {Unlimited: true}, "-1": {Unlimited: true}, "keep": {Keep: true}, "64Mi": {Bytes: 64 << 20}, "1.5Gi": {Bytes: 1536 << 20}} {
		if got, err := ParseMemlock(in); err != nil || got != want {
			t.Errorf("ParseMemlock(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	if _, err := ParseMemlock("infinite"); err == nil {
		t.Error("ParseMemlock(infinite) accepted")
	}
	for n, want := range map[uint64]string{0: "0", 1000: "1000", 64 << 20: "64Mi", 1536 << 20: "1536Mi", 16 << 30: "16Gi"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %s, want %s", n, got, want)
		}
	}
}

// A container that already has memlock at least the policy's (the
// runtime's default spec, or an NRI plugin that ran first) keeps it, one
// that has less is raised; device nodes it already has are not added
// again. The runtime fails a container whose rlimit or device two plugins
// set.
func TestAdjustLeavesWhatTheContainerHas(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  Memlock
		rlimits []*api.POSIXRlimit
		set     bool
		say     string
	}{
		{"unlimited already", Memlock{Unlimited: true}, []*api.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: math.MaxUint64, Hard: math.MaxUint64}}, false, "unlimited already"},
		{"more than the policy", Memlock{Bytes: 64 << 30}, []*api.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: 128 << 30, Hard: 128 << 30}}, false, "128Gi already"},
		{"less than the policy", Memlock{Unlimited: true}, []*api.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: 64 << 10, Hard: 64 << 10}}, true, "unlimited"},
		{"the last entry counts", Memlock{Unlimited: true}, []*api.POSIXRlimit{
			{Type: "RLIMIT_MEMLOCK", Soft: math.MaxUint64, Hard: math.MaxUint64}, {Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 1024},
			{Type: "RLIMIT_MEMLOCK", Soft: 8 << 20, Hard: 8 << 20}}, true, "unlimited"},
		{"other rlimits only", Memlock{Unlimited: true}, []*api.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 1024}}, true, "unlimited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _, _ := world()
			a.Policy.Memlock = tc.policy
			c := container(shmPath, 0)
			c.Rlimits = tc.rlimits
			adj, d := a.Adjust(pod(nil, 0), c)
			if got := len(memlock(adj)) == 1; got != tc.set || d.Memlock != tc.say {
				t.Fatalf("memlock set %v (%v), decision %q; want set %v, %q", got, memlock(adj), d.Memlock, tc.set, tc.say)
			}
		})
	}
	a, _, _ := world()
	c := container(shmPath, 0)
	c.Linux.Devices = []*api.LinuxDevice{{Path: "/dev/infiniband/uverbs1", Type: "c", Major: 231, Minor: 193}}
	adj, d := a.Adjust(pod(nil, 0), c)
	if got := devicePaths(adj); !slices.Equal(got, []string{"/dev/infiniband/rdma_cm"}) || !slices.Equal(d.Kept, []string{"/dev/infiniband/uverbs1"}) {
		t.Fatalf("devices added %v, kept %v; want rdma_cm added and uverbs1 kept", got, d.Kept)
	}
	if !strings.Contains(d.String(), "had /dev/infiniband/uverbs1 already") {
		t.Fatalf("decision %q does not say uverbs1 was there", d)
	}
}

// A netns path the plugin cannot see (another mount namespace's) and an
// OCI network entry without a path (a new netns the runtime made) are
// found through the pod's pid, /proc/<pid>/ns/net, and the kernel's answer
// from there decides; without a pid the pod gets nothing and the decision
// says why; a pid whose netns is the host's gets nothing.
func TestAdjustFindsTheNetnsThroughThePodPid(t *testing.T) {
	const viaPid = "/proc/4242/ns/net"
	for _, tc := range []struct {
		name    string
		path    string
		pid     uint32
		host    bool
		asked   string
		outcome Outcome
		say     string
	}{
		{"path not visible", podNetns, 4242, false, viaPid, Adjusted, ""},
		{"no path: a new netns", "", 4242, false, viaPid, Adjusted, ""},
		{"path not visible, no pid", podNetns, 0, false, "", NetnsUnknown, podNetns + " is not visible"},
		{"no path, no pid", "", 0, false, "", NetnsUnknown, "new network namespace without a path"},
		{"the pid's netns is the host's", podNetns, 4242, true, "", HostNetwork, viaPid + ") is the host's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, k, _ := world()
			k.in[viaPid] = k.in[podNetns]
			a.Visible = func(p string) bool { return p != podNetns }
			a.SameAsSelf = func(p string) (bool, error) { return tc.host && p == viaPid, nil }
			p := pod(nil, 0)
			p.Linux.Namespaces[2].Path, p.Pid = tc.path, tc.pid
			adj, d := a.Adjust(p, container(shmPath, 0))
			if d.Outcome != tc.outcome || !strings.Contains(d.Reason, tc.say) {
				t.Fatalf("outcome %d %q, want %d saying %q", d.Outcome, d.Reason, tc.outcome, tc.say)
			}
			if tc.outcome == Adjusted && (len(devicePaths(adj)) != 2 || d.Netns != viaPid) {
				t.Fatalf("devices %v from netns %s, want uverbs1 and rdma_cm from %s", devicePaths(adj), d.Netns, viaPid)
			}
			if want := []string{tc.asked}; tc.asked != "" && !slices.Equal(k.asked, want) || tc.asked == "" && len(k.asked) > 0 {
				t.Fatalf("kernel asked about %v, want %q", k.asked, tc.asked)
			}
		})
	}
}

// A pod may ask for a /dev/shm up to the node's cap (DefaultPolicy:
// 16Gi) and no more: one asking more is refused, whatever its memory
// limit, with a reason that names the annotation, the size it asked, the
// cap and the flag, and nothing is given or resized. "keep" and a size at
// the cap are not refused.
func TestAdjustShmAboveTheNodeCap(t *testing.T) {
	for _, tc := range []struct {
		ann      string
		podLimit int64
		refused  bool
	}{
		{"17Gi", 0, true},
		{"1Ti", 0, true},
		{"1Ti", 8 << 30, true}, // the memory limit would cap it; the pod still asked more than the node allows
		{"16Gi", 0, false},
		{"16Gi", 4 << 30, false},
		{Keep, 0, false},
	} {
		t.Run(tc.ann, func(t *testing.T) {
			a, _, s := world()
			adj, d := a.Adjust(pod(map[string]string{AnnotationShmSize: tc.ann}, tc.podLimit), container(shmPath, 0))
			if !tc.refused {
				if adj == nil || d.Outcome != Adjusted {
					t.Fatalf("refused a pod within the cap: %s", d)
				}
				return
			}
			if adj != nil || d.Outcome == Adjusted {
				t.Fatalf("a pod asking %s of /dev/shm was adjusted: %s (shm now %s)", tc.ann, d, FormatSize(s.size[shmPath]))
			}
			if len(s.resized) != 0 {
				t.Errorf("refused, yet /dev/shm resized: %v", s.resized)
			}
			for _, want := range []string{AnnotationShmSize, tc.ann, "16Gi", "--max-shm-size"} {
				if !strings.Contains(d.Reason, want) {
					t.Errorf("reason %q does not name %q", d.Reason, want)
				}
			}
		})
	}
}
