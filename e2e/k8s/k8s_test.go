//go:build e2e

package k8s

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

var (
	// stoppedKubeletCPU is the CPU time of kubelets a test stopped.
	stoppedKubeletCPU time.Duration
	// stoppedContainerdCPU is the CPU time of containerds a test killed.
	stoppedContainerdCPU time.Duration
	firstKubeletStart    time.Time
	ctd                  *cririg.Containerd
	kubelet              *node.Kubelet
	cs                   *kubernetes.Clientset
	restCfg              *rest.Config
	serviceForward       net.Listener
)

// boot is which boot of the node this run is (make e2e-k8s boots it twice
// on one disk, zz_reboot_test.go).
var boot = flag.String("k8s.boot", bootFirst, bootFirst+": a new node, rdma-netns installed as the README says and Multus set up; "+
	bootReboot+": the node of a first boot booted again on its disk (vm-run.sh --disk), nothing installed; "+
	bootJoin+": a further node (vm-run.sh --node 2..) joining the first node's cluster, serving the first node's tests until they stop it (twonode_test.go)")

const (
	bootFirst  = "first"
	bootReboot = "reboot"
	bootJoin   = "join"
)

func TestMain(m *testing.M) {
	flag.Parse()
	startWatchdog(node.VMTimeout)
	os.Exit(run(m))
}

// run brings the node up (containerd, kubelet) and waits for it to be
// Ready before the tests; the control plane is already up on the host.
func run(m *testing.M) int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		return 1
	}
	// Before anything is set up: a pair without its rails fails at once.
	if *requireRails && *boot != bootJoin {
		if why := node.RailsLayoutMissing(len(optimizedRails), railsNICs); why != "" {
			return fail("-k8s.rails-required", fmt.Errorf("this VM was booted without the rails' layout: %s. The Makefile asks for it under CI=true and whenever K8S_PAIR_OPTS has --rails: the layout was lost on the way to the guest (vm-pair.sh, vm-run.sh), and the job would run on one rail", why))
		}
	}
	// And the pairs boot without its PCIe roots and stand-in GPUs, rather
	// than TestDRAPairs skipping.
	if *requirePairs {
		if why := node.PairsLayoutMissing(pairsRoots, pairsCount/pairsRoots); why != "" {
			return fail("-k8s.pairs-required", fmt.Errorf("this VM was booted without the alignment layout: %s. make e2e-k8s's pairs boot asks for it (K8S_PAIRS: vm-run.sh --nics 8 --pcie-roots 2 --standin-gpus 2): it was lost on the way to the guest, and TestDRAPairs would have nothing to pair", why))
		}
	}
	if err := cririg.Setup(); err != nil {
		return fail("cri setup", err)
	}
	// rdma-netns is not on the node yet: the DaemonSet installs it, and
	// Multus's init container installs multus-shim.
	bin, err := cririg.TraceCNI("rdma-netns", "multus-shim")
	if err != nil {
		return fail("cni trace", err)
	}
	// containerd's log on the node's disk, as a node's journal keeps it:
	// after a reboot it still says what happened before.
	if ctd, err = cririg.Start(cririg.Options{CNIBinDir: bin, Log: "/var/log/containerd.log", Extra: node.ContainerdConfig}); err != nil {
		return fail("containerd", err)
	}
	// containerd, not the value now: a test may restart it.
	defer func() { ctd.Stop() }()
	if restCfg, err = clientcmd.BuildConfigFromFlags("", node.AdminKubeconfig); err != nil {
		return fail("admin kubeconfig", err)
	}
	if cs, err = kubernetes.NewForConfig(restCfg); err != nil {
		return fail("client", err)
	}
	if *nodes > 1 {
		if err := setupMgmt(); err != nil {
			return fail("management network", err)
		}
	}
	if *boot == bootJoin {
		// What the first node's tests will schedule here, in place before
		// kubelet registers: a pull would fail (no registry) and back off.
		if err := prepareJoin(); err != nil {
			return fail("join", err)
		}
	}
	if kubelet, err = node.StartKubelet(); err != nil {
		return fail("kubelet", err)
	}
	firstKubeletStart = kubelet.Started
	// kubelet, not the value now: a test may restart it.
	defer func() { kubelet.Stop() }()
	// The kubernetes Service's address on the node, for Multus's daemon
	// (in-cluster config), standing in for kube-proxy, which a node runs
	// from every boot on.
	if serviceForward, err = node.ServiceForward(); err != nil {
		return fail("kubernetes Service", err)
	}
	defer serviceForward.Close()
	if *boot == bootReboot {
		return runRebooted(m)
	}
	if *boot == bootJoin {
		return runJoined()
	}
	// The other nodes serve until this one's tests are done.
	defer stopNodes()
	// The node registers NotReady: its default network (conf/containerd's
	// net.d) chains rdma-netns, which is not installed yet. The DaemonSet
	// runs anyway (host network, and it tolerates the not-ready taint) and
	// installs it; then the node goes Ready.
	if err := waitNode(4*time.Minute, false); err != nil {
		return fail("node", fmt.Errorf("%v\nkubelet log:\n%s", err, kubelet.LogTail(40)))
	}
	fmt.Printf("node %s registered %s after kubelet started\n", node.Name, time.Since(kubelet.Started).Round(time.Second))
	if err := install(); err != nil {
		return fail("install rdma-netns", fmt.Errorf("%v\nkubelet log:\n%s", err, kubelet.LogTail(30)))
	}
	if err := waitNode(4*time.Minute, true); err != nil {
		return fail("node", fmt.Errorf("%v\nkubelet log:\n%s", err, kubelet.LogTail(40)))
	}
	fmt.Printf("node %s Ready %s after kubelet started\n", node.Name, time.Since(kubelet.Started).Round(time.Second))
	if err := setupMultus(); err != nil {
		return fail("multus", err)
	}
	if *demo != "" {
		if *nodes > 1 {
			if err := prepareJobDemo(); err != nil {
				return fail("the demo's two-node job", err)
			}
		}
		return runDemo(*demo)
	}
	rc := m.Run()
	printCalls()
	printCPU()
	return rc
}

// waitNode waits for the node to be registered, and Ready if ready; it
// gives up at once if kubelet exits.
func waitNode(timeout time.Duration, ready bool) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !kubelet.Alive() {
			return fmt.Errorf("kubelet exited")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := cs.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		cancel()
		if err == nil && !ready {
			return nil
		}
		if err == nil {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("node %s not registered or Ready after %v", node.Name, timeout)
}

// DaemonSet is conf/daemonset.yaml's DaemonSet.
const (
	dsNamespace = "kube-system"
	dsName      = "rdma-netns"
	dsSelector  = "app.kubernetes.io/name=rdma-netns"
)

// install installs rdma-netns as the README says: the image imported (in
// place of a pull), conf/daemonset.yaml applied with only its image
// changed (e2e/k8s/overlays/daemonset), and waits for its pod to be Ready.
func install() error {
	started := time.Now()
	if err := node.ImportImage(node.ManifestDir + "/rdma-netns-image.tar"); err != nil {
		return err
	}
	data, err := os.ReadFile(node.ManifestDir + "/daemonset.yaml")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := apply(ctx, data); err != nil {
		return fmt.Errorf("apply conf/daemonset.yaml: %v", err)
	}
	if _, err := waitDaemonSetPod(ctx, ""); err != nil {
		return err
	}
	fmt.Printf("rdma-netns DaemonSet's pod Ready %s after the import and apply began\n", time.Since(started).Round(time.Second))
	return nil
}

// waitDaemonSetPod waits for the DaemonSet to have one pod on each node,
// every one Ready, whose containers run image (any if ""), and returns
// this node's. After an upgrade the old pods are gone first (the
// DaemonSet replaces them).
func waitDaemonSetPod(ctx context.Context, image string) (*corev1.Pod, error) {
	pods, err := waitDaemonSetPods(ctx, image)
	if err != nil {
		return nil, err
	}
	return pods[node.Name], nil
}

// waitDaemonSetPods is waitDaemonSetPod returning every node's pod, by
// node name.
func waitDaemonSetPods(ctx context.Context, image string) (map[string]*corev1.Pod, error) {
	var last string
	var ready map[string]*corev1.Pod
	// Six minutes: the chart's upgrade replaces the pod while two pods
	// exchange traffic and the binary is read every 100 ms; its new pod
	// was Ready 1m51s after helm upgrade returned on a node alone
	// (2026-11-28), more than 4 minutes beside a second emulated node.
	err := cririg.Wait(6*time.Minute, "the DaemonSet's pods Ready", func() (bool, error) {
		var done bool
		ready, done, last = daemonSetPodsReady(ctx, image)
		return done, nil
	})
	if err != nil {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return nil, fmt.Errorf("%v\nlast: %s\n%s%s%s", err, last, chartPodsState(dsSelector), eventsOf(c, dsNamespace, dsName), nodesState())
	}
	return ready, nil
}

// daemonSetPodsReady looks once at the DaemonSet's pods: done when there
// is one on each node, every one Ready, whose containers run image (any
// if ""); why says what is not yet so.
func daemonSetPodsReady(ctx context.Context, image string) (ready map[string]*corev1.Pod, done bool, why string) {
	pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx, metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil {
		return nil, false, fmt.Sprintf("listing the DaemonSet's pods: %v", err)
	}
	if len(pods.Items) != *nodes {
		return nil, false, fmt.Sprintf("%d pods, want %d: %s", len(pods.Items), *nodes, podsText(pods.Items))
	}
	ready = map[string]*corev1.Pod{}
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			if image != "" && c.Image != image {
				return nil, false, fmt.Sprintf("%s on %s runs %s, want %s", p.Name, p.Spec.NodeName, c.Image, image)
			}
		}
		if !podReady(&p) {
			return nil, false, "not Ready: " + podsText([]corev1.Pod{p})
		}
		ready[p.Spec.NodeName] = &p
	}
	return ready, ready[node.Name] != nil, ""
}

// podsText says, per pod, where it is and how far it got: its phase,
// whether it is being deleted, and each container's state.
func podsText(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "\n  %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		if p.DeletionTimestamp != nil {
			fmt.Fprintf(&b, ", deleting since %s", p.DeletionTimestamp.Format(time.TimeOnly))
		}
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "; %s ready=%v restarts=%d %s", c.Name, c.Ready, c.RestartCount, containerStateText(c.State))
		}
	}
	return b.String()
}

func containerStateText(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(time.TimeOnly)
	case s.Terminated != nil:
		return fmt.Sprintf("terminated (%s, exit %d)", s.Terminated.Reason, s.Terminated.ExitCode)
	case s.Waiting != nil:
		return fmt.Sprintf("waiting (%s: %s)", s.Waiting.Reason, s.Waiting.Message)
	}
	return "no state"
}

// chartPodsState is what a failed wait for the pods of selector reports,
// read with a context of its own (the wait's may have run out): each
// pod's state and events.
func chartPodsState(selector string) string {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(dsNamespace).List(c, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("pods %s: %v\n", selector, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "pods %s:%s\nevents:\n", selector, podsText(pods.Items))
	for _, p := range pods.Items {
		b.WriteString(eventsOf(c, dsNamespace, p.Name))
	}
	return b.String()
}

// nodesState gives each node's Ready condition and kubelet's last
// heartbeat: it tells a node that stopped answering from a pod that is
// slow to start.
func nodesState() string {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes, err := cs.CoreV1().Nodes().List(c, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("nodes: %v\n", err)
	}
	var b strings.Builder
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				fmt.Fprintf(&b, "node %s Ready=%s (%s), kubelet's last heartbeat %s, now %s\n",
					n.Name, cond.Status, cond.Reason, cond.LastHeartbeatTime.Format(time.TimeOnly), time.Now().Format(time.TimeOnly))
			}
		}
	}
	return b.String()
}

// Multus's DaemonSet (deployments/multus-daemonset-thick.yml).
const (
	multusSelector  = "name=multus"
	multusContainer = "kube-multus"
)

// setupMultus deploys Multus's thick plugin as its users do: the node's
// cluster network in place (the primary network Multus delegates eth0 to),
// Multus's image imported (nothing is pulled) and its own manifest applied
// with the image, the init container's mount and the daemon's limits
// changed (e2e/k8s/overlays/multus says why). Its init
// container installs multus-shim in /opt/cni/bin; its daemon, a
// host-network pod, reaches the API server through the kubernetes Service
// (in-cluster config; node.ServiceForward stands in for kube-proxy) and
// writes 00-multus.conf, which containerd then runs for every pod.
func setupMultus() error {
	started := time.Now()
	if err := node.InstallClusterNetwork(); err != nil {
		return err
	}
	if err := node.ImportImage(node.ManifestDir + "/multus-image.tar"); err != nil {
		return err
	}
	data, err := os.ReadFile(node.ManifestDir + "/multus.yaml")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := apply(ctx, data); err != nil {
		return fmt.Errorf("apply Multus's multus-daemonset-thick.yml: %v", err)
	}
	var last string
	err = cririg.Wait(4*time.Minute, "Multus's daemon Ready and 00-multus.conf written", func() (bool, error) {
		// Each look is bounded on its own, so that one request stuck on
		// the API server's connection cannot outlast the wait.
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		pods, err := cs.CoreV1().Pods(dsNamespace).List(c, metav1.ListOptions{LabelSelector: multusSelector})
		if err != nil || len(pods.Items) != *nodes {
			last = fmt.Sprintf("%d pods, want %d (%v)", len(pods.Items), *nodes, err)
			return false, nil
		}
		for _, p := range pods.Items {
			last = fmt.Sprintf("%s on %s: %s init %+v containers %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
			if !podReady(&p) {
				return false, nil
			}
		}
		// Other nodes' conf: the two-node test asks them (nodeHost).
		conf, _ := os.ReadFile(node.MultusConf)
		return strings.Contains(string(conf), `"multus-shim"`), nil
	})
	if err != nil {
		// What the node did meanwhile: the pod's events, the daemon's log,
		// and kubelet's own account (an init container that never ended
		// shows there, not in the API server).
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pods, _ := cs.CoreV1().Pods(dsNamespace).List(c, metav1.ListOptions{LabelSelector: multusSelector})
		evs := ""
		for _, p := range pods.Items {
			evs += eventsOf(c, dsNamespace, p.Name) + "log:\n" + multusLog(c)
		}
		return fmt.Errorf("%v\nlast: %s\nevents:\n%s\nkubelet log:\n%s", err, last, evs, kubelet.LogTail(40))
	}
	fmt.Printf("Multus's daemon Ready and 00-multus.conf written %s after the import and apply began\n", time.Since(started).Round(time.Second))
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// multusLog is the log of this node's Multus daemon (what `kubectl logs`
// shows, through the API server and kubelet).
func multusLog(ctx context.Context) string {
	pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx, metav1.ListOptions{LabelSelector: multusSelector, FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil || len(pods.Items) != 1 {
		return fmt.Sprintf("no Multus daemon pod (%v)", err)
	}
	out, err := cs.CoreV1().Pods(dsNamespace).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{Container: multusContainer}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("logs of %s: %v", pods.Items[0].Name, err)
	}
	return string(out)
}

// printCPU prints the CPU time kubelet and containerd used in the
// emulated VM over the whole run (the node's share of the cluster's cost;
// the control plane's is printed on the host).
func printCPU() {
	if d, err := cluster.CPUTime(kubelet.Pid()); err == nil {
		fmt.Printf("CPU kubelet    %.1fs over %s\n", (d + stoppedKubeletCPU).Seconds(), time.Since(firstKubeletStart).Round(time.Second))
	}
	if d, err := cluster.CPUTime(ctd.Pid()); err == nil {
		fmt.Printf("CPU containerd %.1fs over %s\n", (d + stoppedContainerdCPU).Seconds(), time.Since(firstKubeletStart).Round(time.Second))
	}
}

// printCalls prints how often kubelet's runtime called each CNI plugin
// with each command (the notes on what a real node does).
func printCalls() {
	cririg.PrintCallCounts("CNI calls containerd made for kubelet during the Kubernetes tests")
	printMultusCalls()
}

// printMultusCalls prints what Multus's daemon did for multus-shim, read
// from its log: the requests it served, by command, and the delegates it
// ran (ADD and DEL of each network; the NAD's chain runs as one delegate).
func printMultusCalls() {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	counts := map[string]int{}
	for _, l := range strings.Split(multusLog(c), "\n") {
		for _, cmd := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS"} {
			if strings.Contains(l, "] "+cmd+" finished CNI request") {
				counts["request "+cmd]++
			}
		}
		for _, cmd := range []string{"Add", "Del"} {
			_, rest, ok := strings.Cut(l, "] "+cmd+": ")
			if f := strings.SplitN(rest, ":", 5); ok && len(f) == 5 {
				network, _, _ := strings.Cut(f[3], "(")
				counts["delegate "+network+" "+strings.ToUpper(cmd)]++
			}
		}
	}
	fmt.Println("=== What Multus's daemon did for multus-shim (its log) ===")
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Printf("%-40s %d\n", k, counts[k])
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

// sandboxOf finds the CRI sandbox kubelet made for a pod, by the labels
// kubelet puts on it.
func sandboxOf(t *testing.T, ns, name string) *runtimeapi.PodSandbox {
	t.Helper()
	resp, err := ctd.Runtime.ListPodSandbox(ctx(t), &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{
			"io.kubernetes.pod.namespace": ns,
			"io.kubernetes.pod.name":      name,
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Items) != 1 {
		t.Fatalf("pod %s/%s: want one ready sandbox, containerd has %d", ns, name, len(resp.Items))
	}
	return resp.Items[0]
}

// createPod creates a pod, retrying while the namespace's default service
// account does not exist yet (the controller-manager makes it after start).
func createPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	var last error
	err := cririg.Wait(time.Minute, "create pod "+pod.Name, func() (bool, error) {
		_, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx(t), pod, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) {
			last = err
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("%v (last: %v)", err, last)
	}
}

// waitRunning waits for the pod to be Running and returns how long that took.
func waitRunning(t *testing.T, ns, name string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last *corev1.Pod
	err := cririg.Wait(timeout, "pod "+ns+"/"+name+" Running", func() (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("%v\nstatus: %+v\nevents:\n%s\nkubelet log:\n%s", err, last.Status, events(t, ns, name), kubelet.LogTail(30))
	}
	return time.Since(start)
}

// events lists the pod's events, as `kubectl describe pod` shows them.
func events(t *testing.T, ns, name string) string {
	t.Helper()
	return eventsOf(ctx(t), ns, name)
}

func eventsOf(ctx context.Context, ns, name string) string {
	list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	s := ""
	for _, e := range list.Items {
		s += fmt.Sprintf("  %s %s %s: %s\n", e.Type, e.Reason, e.Source.Component, e.Message)
	}
	return s
}

// eventTimeline lists the pod's events from since on, each with its
// first and last time after since and its count: where a wait went.
func eventTimeline(t *testing.T, ns, name string, since time.Time) string {
	t.Helper()
	evs, err := eventsSince(t, ns, name, "", since)
	if err != nil {
		return err.Error()
	}
	return timelineText(evs, since)
}

// failedSince is the pod's events of that reason last seen at or after
// since, as eventTimeline shows them (empty: none).
func failedSince(t *testing.T, ns, name, reason string, since time.Time) string {
	t.Helper()
	evs, err := eventsSince(t, ns, name, reason, since)
	if err != nil {
		t.Fatal(err)
	}
	return timelineText(evs, since)
}

// eventsSince is the pod's events (of reason, unless "") last seen at or
// after since, the first seen first.
func eventsSince(t *testing.T, ns, name, reason string, since time.Time) ([]corev1.Event, error) {
	t.Helper()
	sel := "involvedObject.name=" + name
	if reason != "" {
		sel += ",reason=" + reason
	}
	list, err := cs.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	evs := slices.DeleteFunc(list.Items, func(e corev1.Event) bool { return eventLast(e).Before(since.Truncate(time.Second)) })
	slices.SortStableFunc(evs, func(a, b corev1.Event) int { return eventFirst(a).Compare(eventFirst(b)) })
	return evs, nil
}

func timelineText(evs []corev1.Event, since time.Time) string {
	s := ""
	for _, e := range evs {
		msg := e.Message
		if len(msg) > 160 {
			msg = msg[:160] + "..."
		}
		s += fmt.Sprintf("  %+.0fs..%+.0fs x%d %s %s: %q\n", eventFirst(e).Sub(since).Seconds(), eventLast(e).Sub(since).Seconds(), max(e.Count, 1), e.Reason, e.Source.Component, msg)
	}
	return s
}

// eventLast is when the event was last seen (its first time for one
// seen once).
func eventLast(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return eventFirst(e)
}

func eventFirst(e corev1.Event) time.Time {
	if !e.FirstTimestamp.IsZero() {
		return e.FirstTimestamp.Time
	}
	return e.EventTime.Time
}

// deletePod deletes the pod and waits until the API server no longer has it.
func deletePod(t *testing.T, ns, name string, opts metav1.DeleteOptions) {
	t.Helper()
	if err := cs.CoreV1().Pods(ns).Delete(ctx(t), name, opts); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	err := cririg.Wait(2*time.Minute, "pod "+ns+"/"+name+" gone", func() (bool, error) {
		_, err := cs.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// deletePods deletes the pods names of ns all at once, then waits for
// each to be gone: pods on different nodes end in parallel, as a job
// controller's do.
func deletePods(t *testing.T, ns string, opts metav1.DeleteOptions, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := cs.CoreV1().Pods(ns).Delete(ctx(t), name, opts); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		deletePod(t, ns, name, opts)
	}
}

// waitHome waits for dev to be back in the host netns.
func waitHome(t *testing.T, dev string) {
	t.Helper()
	rig.WaitDevicesHome(t, 30*time.Second, dev)
}
