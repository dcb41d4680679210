//go:build e2e

package k8s

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"

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
