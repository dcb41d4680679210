// Package podadjust decides what a container of a pod whose network
// namespace holds RDMA devices needs besides the device itself, as an NRI
// container adjustment: the uverbs node of each of the pod's devices and
// rdma_cm (with the device cgroup rule that comes with them), a memlock
// limit that lets verbs register memory, and a /dev/shm of a useful size
// shared by the pod's containers. The kernel, asked from inside the pod's
// netns, says whether the pod holds RDMA devices and which nodes are
// theirs; the pod's annotations and the node's Policy say the rest.
package podadjust

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Annotations a pod may carry (on the pod, so every container of it gets
// the same treatment: they share /dev/shm).
const (
	// AnnotationNRI set to "skip" leaves every container of the pod as the
	// runtime made it, RDMA device or not.
	AnnotationNRI = "rdma-netns.io/nri"
	// AnnotationShmSize sets the pod's /dev/shm size, a Kubernetes
	// quantity ("16Gi", "1.5Gi", "2G", "1e9", bytes), or "keep" to leave
	// the runtime's (64 MiB). Never above the pod's memory limit; a pod
	// asking more than the node's Policy.MaxShmSize is refused.
	AnnotationShmSize = "rdma-netns.io/shm-size"
	// Skip is the value of AnnotationNRI that opts a pod out.
	Skip = "skip"
	// Keep is the value of a size that leaves the runtime's setting.
	Keep = "keep"
)

// Policy is the node's default, set by the plugin's flags.
type Policy struct {
	// Memlock is the RLIMIT_MEMLOCK (soft and hard) containers get.
	Memlock Memlock
	// ShmSize is the /dev/shm size of a pod without AnnotationShmSize;
	// 0 leaves the runtime's.
	ShmSize uint64
	// MaxShmSize is the most a pod may ask for with AnnotationShmSize: a
	// pod asking more is refused (its containers are not created). 0
	// lets no pod choose a size (only keep).
	MaxShmSize uint64
	// SandboxRoots are the directories under which the runtime keeps a
	// directory per pod sandbox, named by its ID, holding the pod's shm
	// tmpfs. Only a /dev/shm from there is resized.
	SandboxRoots []string
}

// The runtimes' sandbox roots with their default state directories:
// containerd's CRI plugin keeps a sandbox's tmpfs at <root>/<ID>/shm,
// CRI-O (containers/storage's runroot) at <root>/<ID>/userdata/shm.
const (
	ContainerdSandboxRoot = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes"
	CRIOSandboxRoot       = "/run/containers/storage/overlay-containers"
)

// DefaultPolicy: unlimited memlock (pinned pages are still charged to the
// pod's memory cgroup, so the pod's memory limit still bounds them) and
// 1 GiB of /dev/shm, the size below which `rdma-netns doctor` warns.
//
// A pod may ask for up to 16 GiB of /dev/shm, the size conf/pod-nccl.yaml
// and the doctor's remedy suggest for a NCCL worker. The pod's memory
// limit bounds what the tmpfs really holds (its pages are charged to the
// memory cgroup of the container that writes them), but a pod without a
// limit would be bounded by nothing, and tmpfs pages, unlike a process's,
// are not freed when the OOM killer ends the writer: they stay until the
// pod goes. The cap keeps one such pod from taking most of a node's memory
// as /dev/shm; a node running larger jobs raises it.
var DefaultPolicy = Policy{Memlock: Memlock{Unlimited: true}, ShmSize: 1 << 30, MaxShmSize: 16 << 30,
	SandboxRoots: []string{ContainerdSandboxRoot, CRIOSandboxRoot}}

// Memlock is a memlock setting: keep the runtime's, unlimited, or a size.
type Memlock struct {
	Keep      bool
	Unlimited bool
	Bytes     uint64
}

// Limit is the rlimit value to set (RLIM_INFINITY for unlimited).
func (m Memlock) Limit() uint64 {
	if m.Unlimited {
		return math.MaxUint64
	}
	return m.Bytes
}

func (m Memlock) String() string {
	switch {
	case m.Keep:
		return Keep
	case m.Unlimited:
		return "unlimited"
	}
	return FormatSize(m.Bytes)
}

// ParseMemlock reads "unlimited", "keep" or a size.
func ParseMemlock(s string) (Memlock, error) {
	switch strings.TrimSpace(s) {
	case "unlimited", "-1":
		return Memlock{Unlimited: true}, nil
	case Keep:
		return Memlock{Keep: true}, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return Memlock{}, fmt.Errorf("memlock %q: want unlimited, keep or a size: %v", s, err)
	}
	return Memlock{Bytes: n}, nil
}

// ParseShmSize reads a /dev/shm size: a size, or "keep" (0).
func ParseShmSize(s string) (uint64, error) {
	if strings.TrimSpace(s) == Keep {
		return 0, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("/dev/shm size %q: want keep or a size: %v", s, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("/dev/shm size %q: a tmpfs of size 0 is unlimited; say keep to leave the runtime's", s)
	}
	return n, nil
}

// ParseMaxShmSize reads the cap on the /dev/shm a pod may ask for: a size
// above 0.
func ParseMaxShmSize(s string) (uint64, error) {
	n, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("/dev/shm cap %q: want a size: %v", s, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("/dev/shm cap %q: want a size above 0 (to let pods ask for no more than the node's default, make it the default size)", s)
	}
	return n, nil
}

// maxSize bounds the sizes ParseSize accepts (below 8 EiB): the parser
// clamps a binary-suffixed quantity beyond it to it.
var maxSize = resource.NewQuantity(math.MaxInt64, resource.BinarySI)

// ParseSize reads a size as Kubernetes writes quantities, with
// apimachinery's parser: bytes, a binary (Ki, Mi, Gi, Ti, Pi, Ei) or
// decimal (k, M, G, T, P, E) suffix, a decimal fraction (1.5Gi) or an
// exponent (1e9). A fraction of a byte rounds up, as Kubernetes does for
// memory.
func ParseSize(s string) (uint64, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	switch {
	case err != nil:
		return 0, fmt.Errorf("not a Kubernetes quantity such as 16Gi, 1.5Gi, 2G, 1e9")
	case q.Sign() < 0:
		return 0, fmt.Errorf("negative")
	case q.Cmp(*maxSize) >= 0:
		return 0, fmt.Errorf("too large")
	}
	return uint64(q.Value()), nil
}

// FormatSize prints a size in the largest binary unit that divides it.
func FormatSize(n uint64) string {
	for _, u := range []struct {
		s string
		m uint64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatUint(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatUint(n, 10)
}
