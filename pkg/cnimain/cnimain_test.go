package cnimain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

var info = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// invocation is one exec: its environment and stdin.
type invocation struct {
	name  string
	env   map[string]string
	stdin string
}

func addEnv(over map[string]string) map[string]string {
	env := map[string]string{
		"CNI_COMMAND":     "ADD",
		"CNI_CONTAINERID": "c0ffee-1",
		"CNI_NETNS":       "/var/run/netns/pod",
		"CNI_IFNAME":      "net1",
		"CNI_PATH":        "/opt/cni/bin",
	}
	for k, v := range over {
		env[k] = v
	}
	return env
}

const conf11 = `{"cniVersion":"1.1.0","name":"rdma-net","type":"rdma-netns"}`

// The invocations a runtime or a broken runtime sends, with and without
// everything the protocol requires.
var invocations = []invocation{
	{"add", addEnv(nil), conf11},
	{"del without netns", addEnv(map[string]string{"CNI_COMMAND": "DEL", "CNI_NETNS": ""}), conf11},
	{"check", addEnv(map[string]string{"CNI_COMMAND": "CHECK", "CNI_ARGS": "K8S_POD_NAME=a"}), conf11},
	{"gc", map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}, conf11},
	{"status", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": "/opt/cni/bin"}, conf11},
	{"no command", map[string]string{"CNI_CONTAINERID": "x"}, conf11},
	{"missing vars", map[string]string{"CNI_COMMAND": "ADD", "CNI_IFNAME": "net1"}, conf11},
	{"del missing vars", map[string]string{"CNI_COMMAND": "DEL"}, conf11},
	{"container id starts with dash", addEnv(map[string]string{"CNI_CONTAINERID": "-abc"}), conf11},
	{"container id with slash", addEnv(map[string]string{"CNI_CONTAINERID": "a/b"}), conf11},
	{"container id not validated for gc", map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": "/p", "CNI_CONTAINERID": "a/b"}, conf11},
	{"ifname too long", addEnv(map[string]string{"CNI_IFNAME": "net0123456789abc"}), conf11},
	{"ifname 15 chars", addEnv(map[string]string{"CNI_IFNAME": "net0123456789ab"}), conf11},
	{"ifname dot", addEnv(map[string]string{"CNI_IFNAME": ".."}), conf11},
	{"ifname colon", addEnv(map[string]string{"CNI_IFNAME": "net1:0"}), conf11},
	{"ifname space", addEnv(map[string]string{"CNI_IFNAME": "net 1"}), conf11},
	{"ifname unicode space", addEnv(map[string]string{"CNI_IFNAME": "net\u00a01"}), conf11},
	{"config not json", addEnv(nil), `{"cniVersion":`},
	{"config without name", addEnv(nil), `{"cniVersion":"1.1.0"}`},
	{"network name invalid", addEnv(nil), `{"cniVersion":"1.1.0","name":"rdma net"}`},
	{"network name starts with underscore", addEnv(nil), `{"cniVersion":"1.1.0","name":"_x"}`},
	{"version unsupported", addEnv(nil), `{"cniVersion":"0.2.0","name":"n"}`},
	{"version unparsable", addEnv(map[string]string{"CNI_COMMAND": "CHECK"}), `{"cniVersion":"one","name":"n"}`},
	{"version missing", addEnv(nil), `{"name":"n"}`},
	{"check on 0.3.1", addEnv(map[string]string{"CNI_COMMAND": "CHECK"}), `{"cniVersion":"0.3.1","name":"n"}`},
	{"gc on 1.0.0", map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": "/p"}, `{"cniVersion":"1.0.0","name":"n"}`},
	{"status on 0.4.0", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": "/p"}, `{"cniVersion":"0.4.0","name":"n"}`},
}

var cniVars = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// outcome is what a runtime observes of one exec, plus what the verb got.
type outcome struct {
	code   uint
	msg    string
	called string
	args   CmdArgs
}

func (o outcome) String() string {
	return fmt.Sprintf("code %d %q, called %q with %+v", o.code, o.msg, o.called, o.args)
}

func ours(t *testing.T, inv invocation, verbErr error) outcome {
	var o outcome
	record := func(verb string) func(*CmdArgs) error {
		return func(a *CmdArgs) error { o.called, o.args = verb, *a; return verbErr }
	}
	funcs := Funcs{Add: record("ADD"), Del: record("DEL"), Check: record("CHECK"), GC: record("GC"), Status: record("STATUS")}
	x := Exec{
		Getenv: func(k string) string { return inv.env[k] },
		Stdin:  strings.NewReader(inv.stdin),
		Stdout: &bytes.Buffer{},
		Stderr: &bytes.Buffer{},
	}
	if e := x.Run(funcs, info, "CNI test plugin"); e != nil {
		o.code, o.msg = e.Code, e.Msg
	}
	return o
}

// upstream runs the same invocation through the CNI library's skel.
func upstream(t *testing.T, inv invocation, verbErr error) outcome {
	for _, k := range cniVars {
		t.Setenv(k, inv.env[k])
	}
	stdin := filepath.Join(t.TempDir(), "stdin")
	if err := os.WriteFile(stdin, []byte(inv.stdin), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()

	var o outcome
	record := func(verb string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			o.called, o.args = verb, CmdArgs(*a)
			return verbErr
		}
	}
	funcs := skel.CNIFuncs{Add: record("ADD"), Del: record("DEL"), Check: record("CHECK"), GC: record("GC"), Status: record("STATUS")}
	if e := skel.PluginMainFuncsWithError(funcs, info, ""); e != nil {
		o.code, o.msg = e.Code, e.Msg
	}
	return o
}

// A runtime sees the same error codes and messages from rdma-netns as from
// any plugin built on the CNI library, and the verb gets the same arguments.
func TestRunAsSkel(t *testing.T) {
	for _, inv := range invocations {
		t.Run(inv.name, func(t *testing.T) {
			got := ours(t, inv, nil)
			if inv.env["CNI_COMMAND"] == "" {
				// skel prints its about text only when given one;
				// compared separately below.
				if got.code != 0 || got.called != "" {
					t.Fatalf("without CNI_COMMAND: %v", got)
				}
				return
			}
			want := upstream(t, inv, nil)
			if got.code != want.code || got.called != want.called || got.args.ContainerID != want.args.ContainerID ||
				got.args.IfName != want.args.IfName || got.args.Netns != want.args.Netns || got.args.Args != want.args.Args ||
				got.args.Path != want.args.Path || string(got.args.StdinData) != string(want.args.StdinData) {
				t.Fatalf("got  %v\nskel %v", got, want)
			}
			if got.msg != want.msg && !strings.HasPrefix(want.msg, "plugin version does not allow") {
				t.Fatalf("message %q, skel says %q", got.msg, want.msg)
			}
		})
	}
}

func TestVerbErrors(t *testing.T) {
	inv := invocations[0]
	got := ours(t, inv, errors.New("no RDMA device for net1"))
	if got.code != types.ErrInternal || got.msg != "no RDMA device for net1" {
		t.Fatalf("plain error: %v", got)
	}
	typed := types.NewError(types.ErrInvalidNetworkConfig, "bad deviceID", "0000:zz")
	got = ours(t, inv, fmt.Errorf("resolving: %w", typed))
	if got.code != types.ErrInvalidNetworkConfig || got.msg != "bad deviceID" {
		t.Fatalf("wrapped CNI error: %v", got)
	}
}

func TestVersionAndAbout(t *testing.T) {
	var out, errOut bytes.Buffer
	x := Exec{
		Getenv: func(k string) string { return map[string]string{"CNI_COMMAND": "VERSION"}[k] },
		Stdin:  errReader{}, // VERSION must not need stdin
		Stdout: &out, Stderr: &errOut,
	}
	if e := x.Run(Funcs{}, info, "CNI test plugin v1"); e != nil {
		t.Fatalf("VERSION: %v", e)
	}
	var v struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || strings.Join(v.SupportedVersions, ",") != "0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Fatalf("VERSION printed %q (%v)", out.String(), err)
	}

	out.Reset()
	x.Getenv = func(string) string { return "" }
	if e := x.Run(Funcs{}, info, "CNI test plugin v1"); e != nil {
		t.Fatalf("no command: %v", e)
	}
	if s := errOut.String(); !strings.Contains(s, "CNI test plugin v1") || !strings.Contains(s, "0.3.1, 0.4.0, 1.0.0, 1.1.0") || out.Len() != 0 {
		t.Fatalf("without CNI_COMMAND: stderr %q stdout %q", s, out.String())
	}
	if e := x.Run(Funcs{}, info, ""); e == nil || e.Code != types.ErrInvalidEnvironmentVariables {
		t.Fatalf("no command and no about text: %v", e)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("stdin read") }
