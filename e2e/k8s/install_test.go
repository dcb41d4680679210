//go:build e2e

package k8s

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// conf/daemonset.yaml, applied in TestMain: the init container installed
// the plugin on the node (the payload ships none), and the exporter and
// NRI containers are ready.
func TestInstall(t *testing.T) {
	pods, err := cs.CoreV1().Pods(dsNamespace).List(ctx(t), metav1.ListOptions{LabelSelector: dsSelector})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("want one rdma-netns pod, have %d", len(pods.Items))
	}
	p := pods.Items[0]
	for _, c := range p.Status.InitContainerStatuses {
		if term := c.State.Terminated; term == nil || term.ExitCode != 0 {
			t.Errorf("init container %s: %+v, want exited 0", c.Name, c.State)
		}
	}
	ready := map[string]bool{}
	for _, c := range p.Status.ContainerStatuses {
		ready[c.Name] = c.Ready
	}
	for _, name := range []string{"exporter", "nri"} {
		if !ready[name] {
			t.Errorf("container %s not ready: %v", name, ready)
		}
	}
	st, err := os.Stat("/opt/cni/bin/rdma-netns")
	if err != nil {
		t.Fatalf("the init container did not install the plugin: %v", err)
	}
	if st.Mode()&0o111 == 0 {
		t.Errorf("/opt/cni/bin/rdma-netns is not executable: %v", st.Mode())
	}
	out, err := exec.Command("/opt/cni/bin/rdma-netns").CombinedOutput()
	if !strings.Contains(string(out), "rdma-netns") {
		t.Errorf("installed rdma-netns does not run: %v\n%s", err, out)
	}
}
