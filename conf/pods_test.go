package conf

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/pkg/podadjust"
)

func loadPod(t *testing.T, file string) *corev1.Pod {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(file, data)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%s: %d objects, %v", file, len(objs), err)
	}
	return objs[0].obj.(*corev1.Pod)
}

// byHand lists what a pod asks for by hand that rdma-netns-nri gives:
// privilege, capabilities, device plugin resources, volumes on /dev/shm.
func byHand(pod *corev1.Pod) []string {
	var out []string
	if len(pod.Spec.Volumes) > 0 {
		out = append(out, "volumes")
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if sc := c.SecurityContext; sc != nil {
			if sc.Privileged != nil && *sc.Privileged {
				out = append(out, c.Name+": privileged")
			}
			if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
				out = append(out, fmt.Sprintf("%s: capabilities %v", c.Name, sc.Capabilities.Add))
			}
		}
		for r := range c.Resources.Limits {
			if !slices.Contains([]corev1.ResourceName{"cpu", "memory", "nvidia.com/gpu"}, r) {
				out = append(out, c.Name+": resource "+string(r))
			}
		}
		for _, m := range c.VolumeMounts {
			out = append(out, c.Name+": mount "+m.MountPath)
		}
	}
	return out
}

// pod-nccl.yaml is the pod as users write it with the NRI plugin: its
// network, its GPUs and nothing else for RDMA; pod-nccl-by-hand.yaml, for
// runtimes without NRI, asks for each of the three by hand.
func TestNCCLPods(t *testing.T) {
	pod := loadPod(t, "pod-nccl.yaml")
	if extra := byHand(pod); len(extra) > 0 {
		t.Errorf("pod-nccl.yaml asks by hand for %v: with rdma-netns-nri it needs only its network", extra)
	}
	if pod.Annotations[podadjust.AnnotationNRI] == podadjust.Skip {
		t.Error("pod-nccl.yaml opts out of the NRI plugin")
	}
	if v, ok := pod.Annotations[podadjust.AnnotationShmSize]; ok {
		n, err := podadjust.ParseShmSize(v)
		if err != nil {
			t.Error(err)
		}
		if limit := pod.Spec.Containers[0].Resources.Limits.Memory().Value(); n > uint64(limit) {
			t.Errorf("shm-size %s above the memory limit %d: the plugin caps it, so the example would promise too much", v, limit)
		}
		if n > podadjust.DefaultPolicy.MaxShmSize {
			t.Errorf("shm-size %s above the plugin's default --max-shm-size %s: the example would be refused", v, podadjust.FormatSize(podadjust.DefaultPolicy.MaxShmSize))
		}
	}
	nets, err := networksOf(pod)
	if err != nil || len(nets) == 0 {
		t.Errorf("pod-nccl.yaml has no network annotation (%v)", err)
	}

	hand := strings.Join(byHand(loadPod(t, "pod-nccl-by-hand.yaml")), "; ")
	for _, want := range []string{"IPC_LOCK", "mount /dev/shm", "resource rdma/"} {
		if !strings.Contains(hand, want) {
			t.Errorf("pod-nccl-by-hand.yaml lacks %s (has %s)", want, hand)
		}
	}
}

// checkPodAnnotations: the rdma-netns.io/ annotations a pod carries are
// ones rdma-netns-nri reads, with values it accepts.
func checkPodAnnotations(pod *corev1.Pod) error {
	for k, v := range pod.Annotations {
		if !strings.HasPrefix(k, "rdma-netns.io/") {
			continue
		}
		switch k {
		case podadjust.AnnotationNRI:
			if v != podadjust.Skip {
				return fmt.Errorf("annotation %s: %q, the plugin knows only %q", k, v, podadjust.Skip)
			}
		case podadjust.AnnotationShmSize:
			if _, err := podadjust.ParseShmSize(v); err != nil {
				return fmt.Errorf("annotation %s: %v", k, err)
			}
		default:
			return fmt.Errorf("annotation %s is not one rdma-netns-nri reads (%s, %s)", k, podadjust.AnnotationNRI, podadjust.AnnotationShmSize)
		}
	}
	return nil
}

func TestPodAnnotationsRejects(t *testing.T) {
	for ann, want := range map[string]string{
		"rdma-netns.io/shm-size: 16GB": "shm-size",
		"rdma-netns.io/nri: off":       "knows only",
		"rdma-netns.io/shmsize: 1Gi":   "not one rdma-netns-nri reads",
		"rdma-netns.io/shm-size: keep": "",
	} {
		k, v, _ := strings.Cut(ann, ": ")
		err := checkPodAnnotations(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{k: v}}})
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", ann, err, want)
		}
	}
}
