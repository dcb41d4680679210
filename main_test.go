package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/version"

	"github.com/rdma-netns/rdma-netns/pkg/config"
)

// buildBinary builds the plugin as `go build .` does, without a stamped
// version (-buildvcs=auto: whatever GOFLAGS says, Go records the commit
// when it can).
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rdma-netns")
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// run executes bin with env (nothing else of ours) and stdin, and returns
// its stdout, stderr and exit status.
func run(t *testing.T, bin string, env []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	return runCmd(t, cmd, stdin)
}

// runCmd runs cmd with stdin and returns its stdout, stderr and exit
// status.
func runCmd(t *testing.T, cmd *exec.Cmd, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", cmd, err)
	}
	return o.String(), e.String(), code
}

// The binary a runtime executes answers VERSION with every supported
// version, and CNI errors as JSON on stdout with exit status 1.
func TestBinaryAsCNIPlugin(t *testing.T) {
	bin := buildBinary(t)
	out, _, code := run(t, bin, []string{"CNI_COMMAND=VERSION"}, `{"cniVersion":"1.1.0"}`)
	var info struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || code != 0 {
		t.Fatalf("VERSION printed %q, exit %d: %v", out, code, err)
	}
	if strings.Join(info.SupportedVersions, ",") != strings.Join(config.SupportedVersions, ",") {
		t.Fatalf("supported versions %v, want %v", info.SupportedVersions, config.SupportedVersions)
	}

	// Arguments are the runtime's business only when CNI_COMMAND is set:
	// a command name then means nothing.
	out, _, code = run(t, bin, []string{"CNI_COMMAND=VERSION"}, "", "doctor")
	if code != 0 || !strings.Contains(out, `"supportedVersions"`) {
		t.Fatalf("VERSION with an argument printed %q, exit %d", out, code)
	}

	// A plugin run alone (no prevResult) fails ADD with the CNI error the
	// runtime shows the user.
	env := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c0ffee", "CNI_NETNS=/var/run/netns/nowhere", "CNI_IFNAME=net1", "CNI_PATH=/opt/cni/bin"}
	conf := `{"cniVersion":"1.1.0","name":"rdma-net","type":"rdma-netns"}`
	hostUntouched(t)
	node := onNode{state: t.TempDir()}
	out, _, code = runOnNode(t, bin, node, env, conf)
	var cniErr struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal([]byte(out), &cniErr); err != nil || code != 1 {
		t.Fatalf("ADD without prevResult printed %q, exit %d", out, code)
	}
	if cniErr.Code != 7 || !strings.HasPrefix(cniErr.Msg, "rdma-netns needs a prevResult") {
		t.Errorf("ADD without prevResult: code %d %q, want 7 (invalid network config) and the prevResult message", cniErr.Code, cniErr.Msg)
	}

	// DEL of something never attached, with the pod's netns already gone
	// (empty CNI_NETNS), succeeds: the runtime retries DEL until it does.
	del := []string{"CNI_COMMAND=DEL", "CNI_CONTAINERID=c0ffee", "CNI_NETNS=", "CNI_IFNAME=net1", "CNI_PATH=/opt/cni/bin"}
	if out, errOut, code := runOnNode(t, bin, node, del, conf); code != 0 {
		t.Errorf("DEL of nothing: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// A network's logFile outside the node's log directory is never opened,
// whatever the verb: the binary runs as root, and a NAD author would have
// it append to (or create) any file of the node. ADD fails and says why;
// DEL succeeds; the file is not there after either.
func TestBinaryNeverOpensAForeignLogFile(t *testing.T) {
	bin := buildBinary(t)
	target := filepath.Join(t.TempDir(), "ld.so.preload")
	conf := `{"cniVersion":"1.1.0","name":"rdma-net","type":"rdma-netns","logFile":"` + target + `"}`
	hostUntouched(t)
	node := onNode{state: t.TempDir()}
	add := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c0ffee", "CNI_NETNS=/var/run/netns/nowhere", "CNI_IFNAME=net1", "CNI_PATH=/opt/cni/bin"}
	out, errOut, code := runOnNode(t, bin, node, add, conf)
	if code != 1 || !strings.Contains(out, "only in the node's directory /var/log/rdma-netns") || !strings.Contains(errOut, "ignored") {
		t.Errorf("ADD: exit %d, stdout %q, stderr %q; want 1, the refusal, and stderr saying the file is ignored", code, out, errOut)
	}
	del := []string{"CNI_COMMAND=DEL", "CNI_CONTAINERID=c0ffee", "CNI_NETNS=", "CNI_IFNAME=net1", "CNI_PATH=/opt/cni/bin"}
	if out, errOut, code := runOnNode(t, bin, node, del, conf); code != 0 {
		t.Errorf("DEL: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("the binary created or opened the network's logFile %s: %v", target, err)
	}
}

// Run by a person, the binary says what it is, what its commands are for,
// and says so when a command is unknown.
func TestBinaryAsCommand(t *testing.T) {
	bin := buildBinary(t)
	// The version is what Go recorded in the binary (a git checkout: the
	// commit; a worktree or a tarball: nothing, so "version unknown").
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	about := "CNI rdma-netns plugin " + buildVersion(unstamped, info) + "\n"
	for _, args := range [][]string{nil, {"--help"}, {"-h"}, {"help"}} {
		out, errOut, code := run(t, bin, nil, "", args...)
		if code != 0 || errOut != "" {
			t.Errorf("rdma-netns %v: exit %d, stderr %q; want 0 and the help on stdout", args, code, errOut)
		}
		if !strings.HasPrefix(out, about) {
			t.Errorf("rdma-netns %v starts %q, want the CNI about line %q", args, out, about)
		}
		for _, want := range []string{"CNI protocol versions supported: " + strings.Join(config.SupportedVersions, ", "), "CNI_COMMAND", "doctor ", "install "} {
			if !strings.Contains(out, want) {
				t.Errorf("rdma-netns %v says %q, which lacks %q", args, out, want)
			}
		}
	}
	out, errOut, code := run(t, bin, nil, "", "doctr")
	if code != 2 || out != "" || !strings.Contains(errOut, `unknown command "doctr"`) {
		t.Errorf("rdma-netns doctr: exit %d, stdout %q, stderr %q; want 2 and the unknown command on stderr", code, out, errOut)
	}
	if _, errOut, code := run(t, bin, nil, "", "install", "--help"); code != 0 || !strings.Contains(errOut, "Usage: rdma-netns install") {
		t.Errorf("rdma-netns install --help: exit %d, stderr %q", code, errOut)
	}
}

func TestBuildVersion(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "055c7b7d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f7"
	for _, c := range []struct {
		name    string
		stamped string
		info    *debug.BuildInfo
		want    string
	}{
		{"stamped by make build", "v1.2.0", &debug.BuildInfo{Main: debug.Module{Version: "v1.1.0"}}, "v1.2.0"},
		{"go install of a tag", unstamped, &debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0"},
		{"go build of a checkout", unstamped, &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261123162509-055c7b7d0e1f+dirty"}, Settings: vcs(rev, "true")}, "v0.0.0-20261123162509-055c7b7d0e1f+dirty"},
		{"commit only", unstamped, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, "devel-055c7b7d0e1f"},
		{"commit with changes", unstamped, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, "devel-055c7b7d0e1f+dirty"},
		{"nothing recorded", unstamped, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, unstamped},
		{"no build info", unstamped, nil, unstamped},
	} {
		if got := buildVersion(c.stamped, c.info); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// An unknown command changes nothing and exits 2 without running any.
func TestUnknownCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	dest := t.TempDir()
	if code := command([]string{"instal", "--dest", dest}, version.PluginSupports("1.1.0"), &out, &errOut); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if out.Len() != 0 || !strings.Contains(errOut.String(), "doctor, install and help") {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}
	if entries, _ := os.ReadDir(dest); len(entries) != 0 {
		t.Errorf("a mistyped install wrote %d files into --dest", len(entries))
	}
}

// The CNI binary, executed at every pod start, links only what the CNI
// path needs: the exporter's client_golang and API server reviews, and
// the NRI plugin's stub, ttrpc and protobuf live in their own binaries.
func TestBinaryLinksOnlyTheCNIPath(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/containerd/", "github.com/prometheus/", "google.golang.org/", "github.com/tetratelabs/", "github.com/sirupsen/", "/pkg/nriplugin", "/pkg/podadjust", "/pkg/exporter", "/pkg/kubeauth", "k8s.io/", "helm.sh/"} {
			if strings.Contains(pkg, banned) {
				t.Errorf("the CNI binary links %s", pkg)
			}
		}
	}
}
