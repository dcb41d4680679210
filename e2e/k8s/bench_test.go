//go:build e2e

package k8s

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// benchRounds is how many pods of each kind TestBenchPodStart starts
// (make bench-k8s); 0 skips it, as make e2e-k8s does.
var benchRounds = flag.Int("k8s.bench", 0, "TestBenchPodStart: pods to start with and without rdma-netns in the NAD's chain, interleaved (0: skip)")

// TestBenchPodStart prints the time from pod create to Running under
// kubelet and Multus (thick), for a pod on a NAD whose chain is host-device
// then rdma-netns and for one whose chain is host-device alone, on the same
// NIC, interleaved (the order alternates each round) so that the machine's
// load falls on both alike: the medians' difference is what rdma-netns adds
// to a pod's start as a user sees it. Figures only, nothing timed is
// asserted; each pod must still come up with its device where it belongs.
func TestBenchPodStart(t *testing.T) {
	if *benchRounds == 0 {
		t.Skip("a benchmark: make bench-k8s runs it (-k8s.bench N)")
	}
	dev := rdmaOf(t, "eth1")
	nad(t, "default", "bench-rdma", "eth1", "10.100.101.1/29", "")
	plain := `{"cniVersion": "1.1.0", "name": "bench-plain", "plugins": [
  {"type": "host-device", "device": "eth1", "ipam": {"type": "static", "addresses": [{"address": "10.100.101.1/29"}]}}]}`
	if err := apply(ctx(t), []byte(fmt.Sprintf("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: bench-plain\n  namespace: default\nspec:\n  config: %q\n", plain))); err != nil {
		t.Fatal(err)
	}
	kinds := []string{"bench-rdma", "bench-plain"}
	times := map[string][]time.Duration{}
	stops := map[string][]time.Duration{}
	for i := 0; i < *benchRounds; i++ {
		order := kinds
		if i%2 == 1 {
			order = []string{kinds[1], kinds[0]}
		}
		for _, k := range order {
			name := fmt.Sprintf("%s-%d", k, i)
			start, stop := benchPod(t, name, k, dev, k == "bench-rdma")
			times[k] = append(times[k], start)
			stops[k] = append(stops[k], stop)
			t.Logf("%s: Running %s after create, gone with eth1 home %s after delete", name, start.Round(time.Millisecond), stop.Round(time.Millisecond))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pod create -> Running and delete -> gone (kubelet %s, Multus thick, containerd), %d pods of each, interleaved\n", kubeletVersion(t), *benchRounds)
	fmt.Fprintf(&b, "%-44s %10s %10s %10s %14s\n", "NAD chain", "start p50", "min", "max", "delete p50")
	label := map[string]string{"bench-rdma": "host-device, rdma-netns", "bench-plain": "host-device"}
	for _, k := range kinds {
		s := stats(times[k])
		fmt.Fprintf(&b, "%-44s %9.2fs %9.2fs %9.2fs %13.2fs\n", label[k], s.p50, s.min, s.max, stats(stops[k]).p50)
	}
	fmt.Fprintf(&b, "rdma-netns adds %.2fs to the median pod start\n", stats(times["bench-rdma"]).p50-stats(times["bench-plain"]).p50)
	fmt.Printf("=== K8S BENCH BEGIN ===\n%s=== K8S BENCH END ===\n", b.String())
}

// benchPod creates a tools pod on the NAD network, waits (watching, not
// polling) for it to be Running, checks where the RDMA device is, deletes
// it and waits for it to be gone and eth1 back on the host.
func benchPod(t *testing.T, name, network, dev string, moved bool) (start, stop time.Duration) {
	t.Helper()
	pod := toolsPod("default", name, network)
	w, err := cs.CoreV1().Pods("default").Watch(ctx(t), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	createPod(t, pod)
	timeout := time.After(3 * time.Minute)
wait:
	for {
		select {
		case ev := <-w.ResultChan():
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning {
				start = time.Since(created)
				break wait
			}
		case <-timeout:
			w.Stop()
			t.Fatalf("pod %s not Running after 3m\nevents:\n%s", name, events(t, "default", name))
		}
	}
	w.Stop()
	netns := mustNetns(t, "default", name)
	in, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Contains(in, dev); got != moved {
		t.Fatalf("pod %s (%s): its netns has RDMA devices %v; %s in it: %v, want %v", name, network, in, dev, got, moved)
	}
	deleted := time.Now()
	zero := int64(0)
	deletePod(t, "default", name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err := cririg.Wait(time.Minute, "eth1 back on the host", func() (bool, error) {
		links, err := rig.NetdevsIn("")
		return rig.Contains(links, "eth1"), err
	}); err != nil {
		t.Fatal(err)
	}
	waitHome(t, dev)
	return start, time.Since(deleted)
}

type summary struct{ p50, min, max float64 }

func stats(ds []time.Duration) summary {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return summary{}
	}
	return summary{p50: s[len(s)/2].Seconds(), min: s[0].Seconds(), max: s[len(s)-1].Seconds()}
}

func kubeletVersion(t *testing.T) string {
	n, err := cs.CoreV1().Nodes().Get(ctx(t), "localhost", metav1.GetOptions{})
	if err != nil {
		return "?"
	}
	return n.Status.NodeInfo.KubeletVersion
}
