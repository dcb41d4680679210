//go:build e2e

package k8s

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
)

// execIn runs argv in a container as `kubectl exec` does: the API server
// proxies it to kubelet (the host's 127.0.0.1:<kubelet port>, forwarded into the
// VM), which has containerd run it. It returns stdout and stderr.
func execIn(t *testing.T, ns, pod, container string, argv ...string) (string, string, error) {
	t.Helper()
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(restCfg, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx(t), remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), err
}
