//go:build e2e

package k8s

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// What the chart's tests use in the guest (scripts/k8s/payload.sh ships them).
const (
	helmBin = "/usr/local/bin/helm"
	// chartDir is conf/helm/rdma-netns as the payload ships it.
	chartDir = node.ManifestDir + "/chart"
	release  = "rdma-netns"
	// imageRepo is the image make image builds for the suite; the tag
	// "e2e" is this checkout's, "upgrade-from" an earlier commit's
	// (scripts/k8s/image-at.sh, K8S_UPGRADE_FROM).
	imageRepo     = "rdma-netns.test/rdma-netns"
	newTag        = "e2e"
	oldTag        = "upgrade-from"
	oldImageTar   = node.ManifestDir + "/rdma-netns-image-upgrade-from.tar"
	cniBinary     = "/opt/cni/bin/rdma-netns"
	nriPreinstall = "/opt/nri/plugins/10-rdma-netns-nri"
	nriConf       = "/etc/nri/conf.d/10-rdma-netns-nri.conf"
)

// helm runs the helm CLI against the cluster with the admin's kubeconfig,
// as an operator would, and returns its output.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := helmCmd(args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("helm %s: %s", args[0], time.Since(start).Round(100*time.Millisecond))
	return string(out)
}

// helmCmd is the helm CLI with args, against the cluster with the admin's
// kubeconfig.
func helmCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(helmBin, append(args, "--kubeconfig", node.AdminKubeconfig)...)
	// helm keeps its cache and configuration under $HOME, which the guest
	// does not have.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME=/run/helm/cache",
		"HELM_CONFIG_HOME=/run/helm/config", "HELM_DATA_HOME=/run/helm/data")
	return cmd
}

// helmInstall is `helm install` of the chart into kube-system with the
// suite's image (tag) and the values given (key=value), waiting for the
// DaemonSet's pod to be Ready.
func helmInstall(t *testing.T, tag string, set ...string) *corev1.Pod {
	t.Helper()
	start := time.Now()
	helm(t, installArgs(tag, set...)...)
	p := waitDSPod(t, tag)
	t.Logf("helm install -> the DaemonSet pod Ready: %s", time.Since(start).Round(100*time.Millisecond))
	return p
}

// installArgs is helm's command line installing the chart with the image
// of tag and the values set.
func installArgs(tag string, set ...string) []string {
	args := []string{"install", release, chartDir, "-n", dsNamespace,
		"--set", "image.repository=" + imageRepo, "--set", "image.tag=" + tag}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// helmUninstall is `helm uninstall` and waits for the DaemonSet's pod to go.
func helmUninstall(t *testing.T) {
	t.Helper()
	helm(t, "uninstall", release, "-n", dsNamespace, "--wait", "--timeout", "2m")
	waitNoDSPod(t)
}

// waitDSPod waits for the DaemonSet's one pod to run the image of tag and
// be Ready, and returns it.
func waitDSPod(t *testing.T, tag string) *corev1.Pod {
	t.Helper()
	p, err := waitDaemonSetPod(ctx(t), imageRepo+":"+tag)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitNoDSPod(t *testing.T) {
	t.Helper()
	err := cririg.Wait(2*time.Minute, "no rdma-netns DaemonSet pod", func() (bool, error) {
		pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx(t), metav1.ListOptions{LabelSelector: dsSelector})
		return err == nil && len(pods.Items) == 0, err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// removeApplied deletes what `kubectl apply -f conf/daemonset.yaml`
// created in TestMain (`kubectl delete -f`), so that helm can own the
// same objects; like helm uninstall it leaves the node's files.
func removeApplied(t *testing.T) {
	t.Helper()
	if out, err := helmCmd("status", release, "-n", dsNamespace).CombinedOutput(); err == nil {
		t.Logf("release %s already installed:\n%s", release, out)
		helmUninstall(t)
		return
	}
	err := cs.AppsV1().DaemonSets(dsNamespace).Delete(ctx(t), dsName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	waitNoDSPod(t)
	removeAppliedRBAC(t)
}

// removeAppliedRBAC deletes the exporter's ServiceAccount and the
// ClusterRoles and bindings conf/daemonset.yaml holds: helm refuses to
// install over objects it does not own.
func removeAppliedRBAC(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(node.ManifestDir + "/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		name := obj.GetName()
		switch obj.GetKind() {
		case "ServiceAccount":
			err = cs.CoreV1().ServiceAccounts(obj.GetNamespace()).Delete(ctx(t), name, metav1.DeleteOptions{})
		case "ClusterRole":
			err = cs.RbacV1().ClusterRoles().Delete(ctx(t), name, metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			err = cs.RbacV1().ClusterRoleBindings().Delete(ctx(t), name, metav1.DeleteOptions{})
		default:
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s: %v", obj.GetKind(), name, err)
		}
	}
}

// containersOf maps the pod's containers to whether they are Ready.
func containersOf(p *corev1.Pod) map[string]bool {
	ready := map[string]bool{}
	for _, c := range p.Status.ContainerStatuses {
		ready[c.Name] = c.Ready
	}
	return ready
}

func wantContainers(t *testing.T, p *corev1.Pod, want ...string) {
	t.Helper()
	got := containersOf(p)
	if len(got) != len(want) {
		t.Errorf("DaemonSet pod's containers %v, want %v", got, want)
	}
	for _, name := range want {
		if !got[name] {
			t.Errorf("container %s not ready: %v", name, got)
		}
	}
	for _, c := range p.Status.InitContainerStatuses {
		if term := c.State.Terminated; term == nil || term.ExitCode != 0 {
			t.Errorf("init container %s: %+v, want exited 0", c.Name, c.State)
		}
	}
}

// installed is the content of the CNI binary on the node.
func installed(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(cniBinary)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func short(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:6])
}

// waitNoRecords waits for the plugin's records to be gone: a pod's DEL
// removes its record after it returned the device.
func waitNoRecords(t *testing.T) {
	t.Helper()
	if err := cririg.Wait(time.Minute, "no attachment record left", func() (bool, error) {
		return len(rig.Records(cririg.RecordsDir)) == 0, nil
	}); err != nil {
		var recs []string
		for _, r := range rig.Records(cririg.RecordsDir) {
			data, _ := os.ReadFile(filepath.Join(cririg.RecordsDir, r))
			recs = append(recs, r+": "+string(data))
		}
		t.Errorf("%v:\n%s", err, strings.Join(recs, "\n"))
	}
}

// checkRDMAPod checks what a RuntimeClass pod holding dev (runClassPod
// checked its netns) has from inside its container with the NRI plugin:
// the device alone in ibv_devices, its uverbs node and rdma_cm in /dev/infiniband, memlock unlimited
// and /dev/shm of the chart's default shm size (1Gi).
func checkRDMAPod(t *testing.T, name, dev, uverbs string, nri bool) {
	t.Helper()
	if !nri {
		// libibverbs lists only devices whose /dev/infiniband node the
		// container has: without the NRI plugin the pod spec asks for them
		// (conf/pod-nccl-by-hand.yaml), so only the netns tells.
		return
	}
	out, stderr, err := execIn(t, "default", name, "tools", "ibv_devices")
	if devs := verbsDevices(out); err != nil || len(devs) != 1 || devs[0] != dev {
		t.Errorf("ibv_devices in pod %s: %v (%v) %s, want [%s]", name, devs, err, stderr, dev)
	}
	out, stderr, err = execIn(t, "default", name, "tools", "sh", "-c", "ls /dev/infiniband; ulimit -l; df -k /dev/shm | tail -1")
	f := strings.Fields(out)
	if err != nil || !rig.Contains(f, uverbs) || !rig.Contains(f, "rdma_cm") || !rig.Contains(f, "unlimited") {
		t.Errorf("pod %s: /dev/infiniband, ulimit -l: %q (%v) %s, want %s, rdma_cm and unlimited", name, out, err, stderr, uverbs)
	}
	if !rig.Contains(f, "1048576") {
		t.Errorf("pod %s: /dev/shm: %q, want 1048576 KiB (nri.shmSize 1Gi)", name, out)
	}
}

// runAndCheck runs a RuntimeClass pod on eth1, checks it and deletes it:
// the device comes back.
func runAndCheck(t *testing.T, name string, nri bool) {
	t.Helper()
	n, err := cririg.NetworkOf("rdma-eth1")
	if err != nil {
		t.Fatal(err)
	}
	uverbs := uverbsOf(t, n.RDMA)
	_, dev := runClassPod(t, name, "rdma-eth1")
	checkRDMAPod(t, name, dev, uverbs, nri)
	deletePod(t, "default", name, metav1.DeleteOptions{})
	waitHome(t, dev)
}

// The chart's life on a node, as an operator lives it: install with the
// defaults, with the NRI plugin off and with the exporter off; an upgrade
// to another build while two pods hold devices and exchange RDMA traffic;
// a rollback; and the uninstall with a pod still holding its device. It
// starts by removing TestMain's `kubectl apply` install and ends with the
// chart installed with its defaults, which render that same DaemonSet, as
// the other tests expect.
func TestHelm(t *testing.T) {
	removeApplied(t)
	if _, err := os.Stat(cniBinary); err != nil {
		t.Fatalf("deleting the applied DaemonSet removed %s: %v", cniBinary, err)
	}
	steps := []struct {
		name string
		run  func(*testing.T)
	}{
		{"InstallNRIOff", helmNRIOff},
		{"InstallExporterOff", helmExporterOff},
		{"UpgradeWithTraffic", helmUpgrade},
		{"Rollback", helmRollback},
		{"Uninstall", helmUninstallWithPod},
		// Last: it stays installed for the other tests.
		{"InstallDefaults", helmDefaults},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			// The next steps start from this one's state; the tests
			// after TestHelm start from the last one's.
			restoreDefaults(t)
			t.Fatalf("%s failed; the steps after it need its state", s.name)
		}
	}
}

// restoreDefaults leaves the node as TestHelm leaves it when it passes,
// after a step failed half-way: the step's pods deleted (they hold
// devices the next tests' pods need), any release uninstalled, and the
// chart installed with its defaults. Otherwise one failed step fails
// every later test that needs a device or the DaemonSet, each after its
// own deadline, and the boot's overall limit hides the first failure.
// It logs what it could not do and never fails t itself.
func restoreDefaults(t *testing.T) {
	t.Helper()
	c := context.Background()
	pods, err := cs.CoreV1().Pods("default").List(c, metav1.ListOptions{})
	if err != nil {
		t.Logf("restore: pods of namespace default: %v", err)
	} else {
		for _, p := range pods.Items {
			t.Logf("restore: deleting pod default/%s", p.Name)
			_ = cs.CoreV1().Pods("default").Delete(c, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	}
	err = cririg.Wait(3*time.Minute, "the pods of namespace default gone", func() (bool, error) {
		pods, err := cs.CoreV1().Pods("default").List(c, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Logf("restore: %v", err)
	}
	run := func(args ...string) {
		out, err := helmCmd(args...).CombinedOutput()
		t.Logf("restore: helm %s: %v\n%s", args[0], err, out)
	}
	run("uninstall", release, "-n", dsNamespace, "--wait", "--timeout", "2m")
	run(installArgs(newTag)...)
	if _, err := waitDaemonSetPod(c, imageRepo+":"+newTag); err != nil {
		t.Logf("restore: %v", err)
	}
}

// `helm install` with only the image set: the init container installs the
// binary (this build's) and pre-installs the NRI plugin, the exporter and
// NRI containers are Ready, and an RDMA pod gets its device, its device
// nodes, memlock and /dev/shm. The release stays installed.
func helmDefaults(t *testing.T) {
	before, _ := os.Stat(nriPreinstall) // an earlier install's, left
	p := helmInstall(t, newTag)
	wantContainers(t, p, "exporter", "nri")
	out, err := exec.Command(cniBinary).CombinedOutput()
	if !strings.Contains(string(out), "rdma-netns") {
		t.Errorf("installed rdma-netns does not run: %v\n%s", err, out)
	}
	if after, err := os.Stat(nriPreinstall); err != nil {
		t.Errorf("nri.preinstalled defaults to true, but the plugin is not in the runtime's directory: %v", err)
	} else if before != nil && os.SameFile(before, after) {
		t.Errorf("%s is the file an earlier install left, not this install's copy", nriPreinstall)
	}
	runAndCheck(t, "helm-defaults", true)
}

// nri.enabled=false: the DaemonSet runs the exporter alone, and a pod still
// gets its device (its device nodes and limits are then the pod's own
// business, conf/pod-nccl-by-hand.yaml). The NRI plugin an earlier
// install pre-installed into the runtime is not removed.
func helmNRIOff(t *testing.T) {
	p := helmInstall(t, newTag, "nri.enabled=false")
	wantContainers(t, p, "exporter")
	// What an install with the defaults pre-installed (TestMain's apply)
	// stays (conf/README.md says how to remove it): the runtime launches it
	// at its next start.
	if _, err := os.Stat(nriPreinstall); err != nil {
		t.Errorf("the earlier install's pre-installed NRI plugin: %v, want it left", err)
	}
	runAndCheck(t, "helm-nri-off", false)
	helmUninstall(t)
}

// exporter.enabled=false: the NRI container keeps the pod running, and a
// pod gets its device and what the NRI plugin gives.
func helmExporterOff(t *testing.T) {
	p := helmInstall(t, newTag, "exporter.enabled=false")
	wantContainers(t, p, "nri")
	runAndCheck(t, "helm-exporter-off", true)
	helmUninstall(t)
}

// binaries are the CNI binary of the two builds, read as each is
// installed.
var binaries = map[string][]byte{}

// `helm upgrade` from an earlier build to this one while two pods hold the
// devices of eth1 and eth2 and exchange RDMA traffic (ibv_rc_pingpong):
// the traffic goes on across the upgrade, the node's binary is replaced
// by a rename (the runtime never sees a partial file), and deleting the
// pods afterwards returns both devices: DEL by the new binary of what the
// old one recorded.
func helmUpgrade(t *testing.T) {
	if err := node.ImportImage(oldImageTar); err != nil {
		t.Fatal(err)
	}
	binaries[newTag] = installed(t) // the last install was this build's
	// The earlier build's NRI plugin has no --max-shm-size: the chart
	// leaves it out when the value is null (the upgrade reuses the values,
	// and the new build then caps at its default, 16Gi, the chart's). Its
	// exporter has neither --auth nor --cache-max-age: null leaves them
	// out too (plain HTTP, no ServiceAccount), and the upgrade sets them
	// again (conf's TestChartUpgradeTurnsExporterAuthOn).
	helmInstall(t, oldTag, "nri.maxShmSize=null", "exporter.auth.enabled=null", "exporter.cacheMaxAge=null")
	binaries[oldTag] = installed(t)
	if bytes.Equal(binaries[oldTag], binaries[newTag]) {
		t.Fatalf("the two builds install the same binary (%s): the upgrade would prove nothing", short(binaries[oldTag]))
	}
	srv, cli := trafficPods(t, "up-a", "up-b")
	traffic := startTraffic(t, srv, cli)
	defer traffic.stop()
	watch := watchBinary(t, binaries[oldTag], binaries[newTag])
	start := time.Now()
	helm(t, "upgrade", release, chartDir, "-n", dsNamespace, "--reuse-values", "--set", "image.tag="+newTag,
		"--set", "exporter.auth.enabled=true", "--set", "exporter.cacheMaxAge=2s")
	waitDSPod(t, newTag)
	t.Logf("helm upgrade -> the new DaemonSet pod Ready: %s", time.Since(start).Round(100*time.Millisecond))
	seen := watch.stop()
	t.Logf("binary watched across the upgrade: %s", seen)
	if got := installed(t); !bytes.Equal(got, binaries[newTag]) {
		t.Errorf("after the upgrade %s is %s, want the new build's %s", cniBinary, short(got), short(binaries[newTag]))
	}
	traffic.check(t, "after the upgrade")
	for _, ep := range []rig.Endpoint{srv, cli} {
		if in, err := rig.RDMAIn(ep.Netns); err != nil || len(in) != 1 || in[0] != ep.Dev {
			t.Errorf("RDMA devices of a pod after the upgrade: %v (%v), want [%s]", in, err, ep.Dev)
		}
	}
	traffic.stop()
	deletePod(t, "default", "up-a", metav1.DeleteOptions{})
	deletePod(t, "default", "up-b", metav1.DeleteOptions{})
	waitHome(t, srv.Dev)
	waitHome(t, cli.Dev)
	waitNoRecords(t)
}

// `helm rollback` to the first revision (the earlier build) with a pod
// that the new build attached: the old binary is back on the node, and
// deleting the pod returns its device (DEL by the old binary of the new
// one's record).
func helmRollback(t *testing.T) {
	_, dev := runClassPod(t, "rollback", "rdma-eth1")
	helm(t, "rollback", release, "1", "-n", dsNamespace)
	waitDSPod(t, oldTag)
	if got := installed(t); !bytes.Equal(got, binaries[oldTag]) {
		t.Errorf("after the rollback %s is %s, want the earlier build's %s", cniBinary, short(got), short(binaries[oldTag]))
	}
	deletePod(t, "default", "rollback", metav1.DeleteOptions{})
	waitHome(t, dev)
	waitNoRecords(t)
}

// `helm uninstall` with a pod holding its device: the DaemonSet and its pod
// go; the CNI binary stays in the CNI bin dir (the network configuration
// still names it, and the runtime runs it for the DEL of every pod that
// holds a device) and so does the NRI plugin the init container
// pre-installed into the runtime (the runtime starts it at its next
// start); deleting the pod afterwards returns the device.
func helmUninstallWithPod(t *testing.T) {
	_, dev := runClassPod(t, "uninstall", "rdma-eth1")
	helmUninstall(t)
	if _, err := cs.AppsV1().DaemonSets(dsNamespace).Get(ctx(t), dsName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DaemonSet %s after helm uninstall: %v, want not found", dsName, err)
	}
	for _, f := range []string{cniBinary, nriPreinstall, nriConf} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s after helm uninstall: %v, want it left", f, err)
		}
	}
	deletePod(t, "default", "uninstall", metav1.DeleteOptions{})
	waitHome(t, dev)
	waitNoRecords(t)
}

// trafficPods runs two RuntimeClass pods, on eth1 and eth2, and returns
// them as the server and client ends of verbs traffic.
func trafficPods(t *testing.T, a, b string) (srv, cli rig.Endpoint) {
	t.Helper()
	for _, p := range []struct {
		name, handler string
		ep            *rig.Endpoint
	}{{a, "rdma-eth1", &srv}, {b, "rdma-eth2", &cli}} {
		n, err := cririg.NetworkOf(p.handler)
		if err != nil {
			t.Fatal(err)
		}
		netns, dev := runClassPod(t, p.name, p.handler)
		*p.ep = rig.Endpoint{Netns: netns, Dev: dev, IP: n.IP}
	}
	return srv, cli
}

// binaryWatch is what watchBinary saw.
type binaryWatch struct {
	done chan struct{}
	res  chan string
}

// watchBinary watches the CNI binary while the DaemonSet replaces it: the
// inotify events on its name in the CNI bin dir (a rename shows as
// IN_MOVED_TO; a write in place as IN_CREATE, IN_MODIFY or
// IN_CLOSE_WRITE), and its content read over and over as the runtime
// would, each read being one of the two builds. A violation fails t.
func watchBinary(t *testing.T, builds ...[]byte) *binaryWatch {
	t.Helper()
	ev, err := newDirEvents(filepath.Dir(cniBinary), filepath.Base(cniBinary))
	if err != nil {
		t.Fatal(err)
	}
	w := &binaryWatch{done: make(chan struct{}), res: make(chan string, 1)}
	go func() {
		reads := map[string]int{}
		for {
			select {
			case <-w.done:
				events, err := ev.close()
				var bad []string
				for _, e := range events {
					if e != "IN_MOVED_TO" {
						bad = append(bad, e)
					}
				}
				s := fmt.Sprintf("events %v, reads %v", events, reads)
				switch {
				case err != nil:
					s += fmt.Sprintf("; inotify: %v", err)
					t.Error(s)
				case len(bad) != 0 || len(events) == 0:
					t.Errorf("%s was not replaced by one rename: %s", cniBinary, s)
				}
				if reads["neither build"] != 0 {
					t.Errorf("%s read as neither build (missing or partial): %s", cniBinary, s)
				}
				w.res <- s
				return
			default:
			}
			data, err := os.ReadFile(cniBinary)
			switch {
			case err != nil:
				reads["neither build"]++
			case bytes.Equal(data, builds[0]):
				reads["earlier build"]++
			case bytes.Equal(data, builds[1]):
				reads["this build"]++
			default:
				reads["neither build"]++
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return w
}

func (w *binaryWatch) stop() string {
	close(w.done)
	return <-w.res
}

// trafficRun is ibv_rc_pingpong between two pods, with more iterations
// than the test lasts: it runs until stopped.
type trafficRun struct {
	srv, cli *rig.Proc
	cliEP    rig.Endpoint
	stopped  bool
}

func startTraffic(t *testing.T, srv, cli rig.Endpoint) *trafficRun {
	t.Helper()
	const iters = 100000000
	// -e: wait for completions on the channel instead of polling the CQ,
	// which would keep both vCPUs of the emulated node busy and starve
	// kubelet and containerd during the upgrade.
	s, err := rig.StartServer(srv, append(rig.PingPongArgs(srv.Dev, 4096, iters, ""), "-e")...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rig.Start(rig.InPod(cli.Netns, append(rig.PingPongArgs(cli.Dev, 4096, iters, srv.IP), "-e")...))
	if err != nil {
		s.Kill()
		t.Fatal(err)
	}
	r := &trafficRun{srv: s, cli: c, cliEP: cli}
	r.check(t, "before the upgrade")
	return r
}

// flowing waits for the client's device to have sent more packets than
// since, with both ends running, and returns the count.
func (r *trafficRun) flowing(t *testing.T, when string, since int64) int64 {
	t.Helper()
	var n int64
	err := cririg.Wait(time.Minute, "RDMA traffic flowing "+when, func() (bool, error) {
		if r.srv.Exited() || r.cli.Exited() {
			return false, fmt.Errorf("ibv_rc_pingpong exited %s:\nserver: %s\nclient: %s", when, r.srv.Output(), r.cli.Output())
		}
		var err error
		n, err = rig.SentPackets(r.cliEP)
		return err == nil && n > since, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// check fails t unless the same traffic flows now: both ends still
// running, and the client's device sending.
func (r *trafficRun) check(t *testing.T, when string) {
	t.Helper()
	now, err := rig.SentPackets(r.cliEP)
	if err != nil {
		t.Fatal(err)
	}
	n := r.flowing(t, when, now)
	t.Logf("ibv_rc_pingpong running %s: %d RoCE packets sent by the client so far", when, n)
}

func (r *trafficRun) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.cli.Kill()
	r.srv.Kill()
}
