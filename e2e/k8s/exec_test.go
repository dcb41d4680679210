//go:build e2e

package k8s

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// execIn runs argv in a container as `kubectl exec` does: the API server
// proxies it to kubelet (the host's 127.0.0.1:<kubelet port>, forwarded into the
// VM), which has containerd run it. It returns stdout and stderr.
func execIn(t *testing.T, ns, pod, container string, argv ...string) (string, string, error) {
	t.Helper()
	return execCtx(ctx(t), ns, pod, container, argv...)
}

func execCtx(ctx context.Context, ns, pod, container string, argv ...string) (string, string, error) {
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(restCfg, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), err
}

// resolveIn resolves each of paths in a container (readlink -f, in one
// exec): a pod's /sys is its network namespace's, so what it resolves to
// is the device the pod got. Paths go in as arguments, not into the
// script: an interface name read from an annotation stays one word.
func resolveIn(t *testing.T, ns, pod, container string, paths ...string) []string {
	t.Helper()
	argv := append([]string{"sh", "-c", `for p; do readlink -f "$p" || exit; done`, "sh"}, paths...)
	out, stderr, err := execIn(t, ns, pod, container, argv...)
	if err != nil {
		t.Fatalf("pod %s/%s: readlink -f %s: %v\n%s", ns, pod, strings.Join(paths, " "), err, stderr)
	}
	got := strings.Fields(out)
	if len(got) != len(paths) {
		t.Fatalf("pod %s/%s: readlink -f %s printed %q, want a path each", ns, pod, strings.Join(paths, " "), out)
	}
	return got
}

// execRunner runs commands in a container through execCtx, for rig's
// traffic helpers; a command still running after its timeout is cut off.
func execRunner(ns, pod, container string) rig.Runner {
	return func(ctx context.Context, timeout time.Duration, argv ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return execCtx(ctx, ns, pod, container, argv...)
	}
}
