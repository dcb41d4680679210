//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// demo is `make demo`'s script (scripts/guest/demo.sh): run on the node
// this binary brings up, in place of the tests, so that the demo's node is
// the one the tests check.
var demo = flag.String("demo", "", "run this shell script on the ready node instead of the tests (make demo)")

// runDemo runs the demo script with kubectl pointed at the API server as
// the cluster's admin, and returns its exit status.
func runDemo(script string) int {
	cmd := exec.Command("/bin/sh", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+node.AdminKubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		fmt.Fprintf(os.Stderr, "demo %s: %v\n", script, err)
		return 1
	}
	return 0
}

// demoJobDir is where k8s.test leaves demo.sh's two-node part (Part 3)
// what the tests make in Go: the workers' pods and mpirun's command line.
// demo.sh runs Part 3 when it finds them.
const demoJobDir = "/run/demo-job"

// prepareJobDemo readies Part 3 of the demo on a two-node cluster: node 2
// joined, the MPI image on this node (node 2 imported it when it joined),
// the job's ssh Secret, the two workers' pods as TestTwoNodes makes them
// (demoJobDir/workers.json) and the launcher's command line for an
// allreduce over RDMA, one argument per line (demoJobDir/mpirun.args), so
// that the demo runs exactly what the tests run.
func prepareJobDemo() error {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := joined(c, 2, ""); err != nil {
		return err
	}
	if err := node.ImportImage(node.ManifestDir + "/" + mpiImageTar); err != nil {
		return err
	}
	if err := putMPISecret(c); err != nil {
		return fmt.Errorf("the job's Secret: %w", err)
	}
	workers := spanWorkerPair()
	list := corev1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, w := range workers {
		p := mpiWorkerPod(w)
		p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		raw, err := json.Marshal(p)
		if err != nil {
			return err
		}
		list.Items = append(list.Items, runtime.RawExtension{Raw: raw})
	}
	pods, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	argv := mpirunArgs(workers, overRDMA, "python3", "/usr/local/bin/allreduce.py", "--bytes", strconv.Itoa(1<<20), "--iters", "5")
	if err := os.MkdirAll(demoJobDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(demoJobDir+"/workers.json", pods, 0o644); err != nil {
		return err
	}
	return os.WriteFile(demoJobDir+"/mpirun.args", []byte(strings.Join(argv, "\n")+"\n"), 0o644)
}
