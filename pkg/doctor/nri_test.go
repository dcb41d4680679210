package doctor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// bundle writes a container's OCI spec as containerd's task directory
// holds it, in the netns at netns, with the given device paths and
// annotations, and its init pid.
func bundle(t *testing.T, taskDir, id, netns, pid string, devices []string, ann map[string]string) {
	t.Helper()
	spec := map[string]any{"annotations": ann}
	var devs []map[string]string
	for _, d := range devices {
		devs = append(devs, map[string]string{"path": d})
	}
	spec["linux"] = map[string]any{"namespaces": []map[string]string{{"type": "network", "path": netns}}, "devices": devs}
	data, _ := json.Marshal(spec)
	write(t, filepath.Join(taskDir, id, "config.json"), string(data))
	write(t, filepath.Join(taskDir, id, "init.pid"), pid)
}

func criAnn(pod, ctr string, extra map[string]string) map[string]string {
	a := map[string]string{criContainerType: "container", criPodNamespace: "team-a", criPodName: pod, criContainerName: ctr}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

// The node view lists the containers of RDMA pods that the NRI plugin
// did not adjust and that lack the pod's device nodes; an adjusted one
// and one given its nodes by hand are fine. In shared mode the plugin on
// the node is a FAIL.
func TestNRIMissedContainers(t *testing.T) {
	f := newNodeFixture(t)
	dir := t.TempDir()
	f.env.NRIPluginDir = filepath.Join(dir, "plugins")
	f.env.TaskDir = filepath.Join(dir, "tasks")
	f.env.NRILock = filepath.Join(dir, "lock")
	write(t, filepath.Join(f.env.NRIPluginDir, "10-rdma-netns-nri"), "")
	write(t, filepath.Join(f.env.NRIPluginDir, "20-other"), "")
	write(t, f.env.NRILock, "10-rdma-netns-nri, pid 77, launched by the runtime\n")
	podA := filepath.Join(f.netnsDir, "pod-a")
	bundle(t, f.env.TaskDir, "aaaaaaaaaaaaaaaa", podA, "40", nil, criAnn("pod-a", "adjusted", map[string]string{NRIAdjustedBy: "10-rdma-netns-nri"}))
	bundle(t, f.env.TaskDir, "bbbbbbbbbbbbbbbb", podA, "40", nil, criAnn("pod-a", "bare", nil))
	bundle(t, f.env.TaskDir, "cccccccccccccccc", podA, "40", []string{"/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"}, criAnn("pod-a", "by-hand", nil))
	bundle(t, f.env.TaskDir, "dddddddddddddddd", podA, "40", nil, map[string]string{criContainerType: "sandbox"})
	// A host-network pod's container (the DaemonSet's) joins the node's
	// netns, which shows every device: the plugin gives it nothing, so it
	// missed nothing.
	hostNetns := f.fp.netns("host")
	f.kernel.in[hostNetns] = f.kernel.in[""]
	bundle(t, f.env.TaskDir, "eeeeeeeeeeeeeeee", hostNetns, "1", nil, criAnn("rdma-netns-ds", "exporter", nil))

	r := CheckNode(f.env)
	missed := findingsOf(r, "nri-missed")
	if len(missed) != 1 || missed[0].Subject != "team-a/pod-a/bare" || missed[0].Severity != Warn ||
		!strings.Contains(missed[0].Reason, "runs without /dev/infiniband/uverbs1 /dev/infiniband/rdma_cm") {
		t.Fatalf("nri-missed findings %+v", missed)
	}
	ok := findingsOf(r, "nri-plugin")
	if len(ok) != 1 || ok[0].Severity != OK || !strings.Contains(ok[0].Reason, "serving: 10-rdma-netns-nri, pid 77") || !strings.Contains(ok[0].Reason, "1 of 3 containers") {
		t.Fatalf("nri findings %+v", ok)
	}
	if v := r.Node.NRI; len(v.Preinstalled) != 1 || len(v.Containers) != 3 {
		t.Fatalf("NRI view %+v", v)
	}

	f.kernel.mode = rdmans.ModeShared
	r = CheckNode(f.env)
	fails := findingsOf(r, "nri-plugin")
	if len(fails) != 1 || fails[0].Severity != Fail || !strings.Contains(fails[0].Reason, "shared mode") || r.ExitCode != 1 {
		t.Fatalf("shared mode with the plugin: %+v", fails)
	}

	// Without the plugin on the node, nothing is said about it.
	os.Remove(filepath.Join(f.env.NRIPluginDir, "10-rdma-netns-nri"))
	f.kernel.mode = rdmans.ModeExclusive
	if r := CheckNode(f.env); len(findingsOf(r, "nri-plugin"))+len(findingsOf(r, "nri-missed")) != 0 {
		t.Fatalf("findings without the plugin: %+v", r.Findings)
	}
}

// doctor --pid says what the plugin wrote on the process's container: who
// adjusted it and what it could not give (a bad shm-size annotation).
func TestNRIPidWarnings(t *testing.T) {
	f := newNodeFixture(t)
	dir := t.TempDir()
	f.env.TaskDir = filepath.Join(dir, "tasks")
	root := f.env.Proc.Root
	for _, pid := range []string{"40", "41"} {
		os.MkdirAll(filepath.Join(root, pid, "ns"), 0o755)
		os.Symlink("mnt:[4026532001]", filepath.Join(root, pid, "ns", "mnt"))
	}
	podA := filepath.Join(f.netnsDir, "pod-a")
	bundle(t, f.env.TaskDir, "aaaaaaaaaaaaaaaa", podA, "41", nil, criAnn("pod-a", "worker", map[string]string{
		NRIAdjustedBy: "10-rdma-netns-nri, pid 7", NRIWarnings: `annotation rdma-netns.io/shm-size ignored: "1GB" is not a quantity`}))
	r := CheckPod(f.env, podA, 40)
	w := findingsOf(r, "nri-warnings")
	if len(w) != 1 || !strings.Contains(w[0].Reason, `"1GB" is not a quantity`) {
		t.Fatalf("nri-warnings %+v", w)
	}
	if a := findingsOf(r, "nri-adjusted"); len(a) != 1 || !strings.Contains(a[0].Reason, "10-rdma-netns-nri, pid 7") {
		t.Fatalf("nri-adjusted %+v", a)
	}
}
