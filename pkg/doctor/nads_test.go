package doctor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// exampleConfig reads spec.config of a conf/ example as a JSON object:
// the block scalar under "config: |", dedented. The package links no YAML
// library, and the examples keep that one shape.
func exampleConfig(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "conf", file))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var block []string
	indent := -1
	for i, l := range lines {
		if strings.TrimSpace(l) != "config: |" {
			continue
		}
		for _, c := range lines[i+1:] {
			if strings.TrimSpace(c) == "" {
				continue
			}
			n := len(c) - len(strings.TrimLeft(c, " "))
			if indent < 0 {
				indent = n
			}
			if n < indent {
				break
			}
			block = append(block, c[indent:])
		}
		break
	}
	var conf map[string]any
	if err := json.Unmarshal([]byte(strings.Join(block, "\n")), &conf); err != nil {
		t.Fatalf("%s: spec.config: %v", file, err)
	}
	return conf
}

// plugin is the first entry of type typ in a conflist.
func plugin(t *testing.T, conf map[string]any, typ string) map[string]any {
	t.Helper()
	for _, p := range conf["plugins"].([]any) {
		if m := p.(map[string]any); m["type"] == typ {
			return m
		}
	}
	t.Fatalf("no %s in %v", typ, conf)
	return nil
}

// nadItem is a NAD as kubectl prints it; config is a map (encoded into the
// spec.config string) or a string used as it is.
func nadItem(t *testing.T, ns, name, resource string, config any) map[string]any {
	t.Helper()
	text, ok := config.(string)
	if !ok {
		b, err := json.Marshal(config)
		if err != nil {
			t.Fatal(err)
		}
		text = string(b)
	}
	meta := map[string]any{"namespace": ns, "name": name}
	if resource != "" {
		meta["annotations"] = map[string]any{resourceNameAnnotation: resource}
	}
	return map[string]any{"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": meta, "spec": map[string]any{"config": text}}
}

func listJSON(t *testing.T, items ...map[string]any) string {
	t.Helper()
	if items == nil {
		items = []map[string]any{}
	}
	b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type wantFinding struct {
	sev      Severity
	check    string
	subject  string
	contains []string
}

// checkFindings asserts that the report holds exactly the wanted findings,
// in any order.
func checkFindings(t *testing.T, r *Report, want []wantFinding) {
	t.Helper()
	used := make([]bool, len(r.Findings))
	for _, w := range want {
		found := false
		for i, f := range r.Findings {
			if used[i] || f.Severity != w.sev || f.Check != w.check || f.Subject != w.subject || !containsAll(f.Reason+" fix: "+f.Remedy, w.contains) {
				continue
			}
			used[i], found = true, true
			break
		}
		if !found {
			t.Errorf("no %s %s %s with %q", w.sev, w.check, w.subject, w.contains)
		}
	}
	for i, f := range r.Findings {
		if !used[i] {
			t.Errorf("unexpected finding %s %s %s: %s (fix: %s)", f.Severity, f.Check, f.Subject, f.Reason, f.Remedy)
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// rdma returns conf with its rdma-netns entry changed by set.
func rdma(t *testing.T, conf map[string]any, set map[string]any) map[string]any {
	p := plugin(t, conf, "rdma-netns")
	for k, v := range set {
		if v == nil {
			delete(p, k)
		} else {
			p[k] = v
		}
	}
	return conf
}

func TestNADsTenancy(t *testing.T) {
	devinfo := func() map[string]any { return exampleConfig(t, "nad-device-info.yaml") }
	noRdmaCap := func() map[string]any {
		return rdma(t, devinfo(), map[string]any{"capabilities": map[string]any{"CNIDeviceInfoFile": true}})
	}
	tests := []struct {
		name  string
		items func() []map[string]any
		want  []wantFinding
		exit  int
	}{{
		name: "the conf examples: only device-info lets the pod pick, and rdma-netns holds the pick to allowedPodDevices",
		items: func() []map[string]any {
			return []map[string]any{
				nadItem(t, "ml", "rdma-net", "", exampleConfig(t, "nad-host-device.yaml")),
				nadItem(t, "ml", "rdma-net-devinfo", "", devinfo()),
				nadItem(t, "ml", "rdma-net-renamed", "", exampleConfig(t, "nad-renamed.yaml")),
				nadItem(t, "ml", "rdma-net-pool", "example.com/rdma_nic", exampleConfig(t, "nad-resource.yaml")),
				nadItem(t, "ml", "rdma-sriov", "intel.com/e810_rdma", exampleConfig(t, "nad-sriov.yaml")),
			}
		},
		want: []wantFinding{{OK, "single-tenant", "ml/rdma-net-devinfo",
			[]string{"through host-device's deviceID capability", "only for the RDMA devices in allowedPodDevices (irdma0, irdma1)"}}},
	}, {
		name: "rdma-netns declares the capability and lists no allowedPodDevices",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "ml", "devinfo", "", rdma(t, devinfo(), map[string]any{"allowedPodDevices": nil}))}
		},
		want: []wantFinding{{OK, "single-tenant", "ml/devinfo",
			[]string{"through host-device's deviceID capability", "lists no allowedPodDevices and pins no device", "fix: list the RDMA devices pods may pick in rdma-netns's allowedPodDevices"}}},
	}, {
		name:  "host-device picks by the pod's deviceID, rdma-netns without the capability",
		items: func() []map[string]any { return []map[string]any{nadItem(t, "ml", "devinfo", "", noRdmaCap())} },
		want: []wantFinding{{Warn, "single-tenant", "ml/devinfo", []string{
			"a pod picks its NIC through host-device's deviceID capability, and rdma-netns does not see the pick",
			"fix: declare the deviceID capability on rdma-netns too and list allowedPodDevices, or give the NAD a device plugin resourceName"}}},
	}, {
		name: "any plugin before rdma-netns with the capability, and a resourceName: pods without the resource still pick",
		items: func() []map[string]any {
			c := exampleConfig(t, "nad-sriov.yaml")
			plugin(t, c, "sriov")["capabilities"] = map[string]any{"deviceID": true}
			rdma(t, c, map[string]any{"capabilities": nil})
			return []map[string]any{nadItem(t, "ml", "sriov", "intel.com/e810_rdma", c)}
		},
		want: []wantFinding{{Warn, "single-tenant", "ml/sriov", []string{
			"a pod allocated no intel.com/e810_rdma picks its NIC through sriov's deviceID capability", "does not see the pick",
			"have every pod of this NAD request intel.com/e810_rdma"}}},
	}, {
		name: "rdma-netns lists allowedPodDevices",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "ml", "devinfo", "", rdma(t, devinfo(), map[string]any{"allowedPodDevices": []string{"irdma0", "irdma1"}}))}
		},
		want: []wantFinding{{OK, "single-tenant", "ml/devinfo", []string{"only for the RDMA devices in allowedPodDevices (irdma0, irdma1)"}}},
	}, {
		name: "rdma-netns pins a device and lists no allowedPodDevices",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "ml", "devinfo", "", rdma(t, devinfo(), map[string]any{"deviceID": "0000:3b:00.0", "allowedPodDevices": nil}))}
		},
		want: []wantFinding{{OK, "single-tenant", "ml/devinfo", []string{"honours only a deviceID naming the device the NAD pins (deviceID 0000:3b:00.0)"}}},
	}, {
		name: "a capability after rdma-netns lets no pod pick what rdma-netns moves",
		items: func() []map[string]any {
			c := exampleConfig(t, "nad-host-device.yaml")
			c["plugins"] = append(c["plugins"].([]any), map[string]any{"type": "tuning", "capabilities": map[string]any{"deviceID": true}})
			return []map[string]any{nadItem(t, "ml", "after", "", c)}
		},
	}, {
		name: "a single plugin config, not a list",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "ml", "alone", "", map[string]any{"cniVersion": "1.0.0", "name": "alone", "type": "rdma-netns"})}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items := tt.items()
			r := CheckNADs(strings.NewReader(listJSON(t, items...)))
			checkFindings(t, r, tt.want)
			if r.ExitCode != tt.exit {
				t.Errorf("exit status %d, want %d", r.ExitCode, tt.exit)
			}
			if r.NADs == nil || r.NADs.Read != len(items) || len(r.NADs.WithRdmaNetns) != len(items) {
				t.Errorf("view %+v, want all %d NADs read and listed", r.NADs, len(items))
			}
		})
	}
}

func TestNADsNames(t *testing.T) {
	renamed := func() map[string]any { return exampleConfig(t, "nad-renamed.yaml") }
	prefix := func(p string) map[string]any {
		return rdma(t, exampleConfig(t, "nad-host-device.yaml"), map[string]any{"podRdmaDevNamePrefix": p})
	}
	tests := []struct {
		name  string
		items func() []map[string]any
		want  []wantFinding
	}{{
		name: "a prefix of another namespace covers rdma_net1",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "renamed", "", renamed()), nadItem(t, "b", "free", "", prefix("rdma_"))}
		},
		want: []wantFinding{{Warn, "name-squat", "b/free", []string{
			"pods of b/free may name their device rdma_net1", "the name a/renamed gives its pods",
			"a pod of b/free can take it first and a/renamed's pods then fail there",
			"fix: keep podRdmaDevNamePrefix disjoint from every rdmaDevName"}}},
	}, {
		name: "a prefix of the same namespace squats too",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "renamed", "", renamed()), nadItem(t, "a", "free", "", prefix("rdma_n"))}
		},
		want: []wantFinding{{Warn, "name-squat", "a/free", []string{"rdma_net1"}}},
	}, {
		name: "a prefix equal to the name: a pod's name must go on after it",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "renamed", "", renamed()), nadItem(t, "b", "free", "", prefix("rdma_net1"))}
		},
	}, {
		name: "one NAD's own prefix and name",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "both", "", rdma(t, renamed(), map[string]any{"podRdmaDevNamePrefix": "rdma_"}))}
		},
	}, {
		name: "disjoint prefix",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "renamed", "", renamed()), nadItem(t, "b", "free", "", prefix("team_b_"))}
		},
	}, {
		name: "overlapping prefixes across namespaces, not within one",
		items: func() []map[string]any {
			return []map[string]any{
				nadItem(t, "a", "p1", "", prefix("rdma_")), nadItem(t, "b", "p2", "", prefix("rdma_b")),
				nadItem(t, "a", "p3", "", prefix("rdma_")), nadItem(t, "c", "p4", "", prefix("other_")),
			}
		},
		want: []wantFinding{
			{OK, "name-prefix-overlap", "a/p1", []string{"a/p1 (podRdmaDevNamePrefix rdma_) and of b/p2 (podRdmaDevNamePrefix rdma_b)", "first pod to take a name has it"}},
			{OK, "name-prefix-overlap", "b/p2", []string{"b/p2 (podRdmaDevNamePrefix rdma_b) and of a/p3"}},
		},
	}, {
		name: "the same rdmaDevName in two NADs",
		items: func() []map[string]any {
			return []map[string]any{nadItem(t, "a", "r1", "", renamed()), nadItem(t, "b", "r2", "", renamed()), nadItem(t, "b", "plain", "", exampleConfig(t, "nad-host-device.yaml"))}
		},
		want: []wantFinding{{OK, "shared-dev-name", "rdma_net1", []string{"a/r1, b/r2 all set rdmaDevName rdma_net1", "one pod per node across these NADs"}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckNADs(strings.NewReader(listJSON(t, tt.items()...)))
			checkFindings(t, r, tt.want)
			if r.ExitCode != 0 {
				t.Errorf("exit status %d, want 0", r.ExitCode)
			}
		})
	}
}

// One NAD that does not parse, or that rdma-netns refuses, is reported on
// its own; the others are still checked.
func TestNADsBadConfigs(t *testing.T) {
	items := []map[string]any{
		nadItem(t, "a", "renamed", "", exampleConfig(t, "nad-renamed.yaml")),
		nadItem(t, "b", "truncated", "", `{"cniVersion": "1.1.0", "plugins": [`),
		nadItem(t, "b", "no-chain", "", `{"cniVersion": "1.1.0", "name": "x"}`),
		nadItem(t, "b", "macvlan", "", `{"cniVersion": "1.1.0", "name": "m", "plugins": [{"type": "macvlan", "master": "eth0"}]}`),
		nadItem(t, "b", "bad-name", "", rdma(t, exampleConfig(t, "nad-host-device.yaml"), map[string]any{"rdmaDevName": "a/b"})),
		nadItem(t, "b", "old-version", "", `{"cniVersion": "0.2.0", "name": "o", "plugins": [{"type": "host-device", "device": "ens1"}, {"type": "rdma-netns"}]}`),
		nadItem(t, "b", "free", "", rdma(t, exampleConfig(t, "nad-host-device.yaml"), map[string]any{"podRdmaDevNamePrefix": "rdma_"})),
		{"kind": "NetworkAttachmentDefinition", "metadata": map[string]any{"namespace": "b", "name": "not-string"}, "spec": map[string]any{"config": map[string]any{"type": "rdma-netns"}}},
		{"kind": "NetworkAttachmentDefinition", "metadata": map[string]any{"namespace": "b", "name": "from-file"}, "spec": map[string]any{}},
		{"kind": "ConfigMap", "metadata": map[string]any{"name": "other-kind"}},
	}
	r := CheckNADs(strings.NewReader(listJSON(t, items...)))
	checkFindings(t, r, []wantFinding{
		{Warn, "nad-config", "b/truncated", []string{"spec.config is not valid JSON", "Multus fails every pod", "kubectl edit network-attachment-definitions -n b truncated"}},
		{Warn, "nad-config", "b/no-chain", []string{`neither "type" nor "plugins"`}},
		{Warn, "nad-config", "b/not-string", []string{"spec.config is not a string"}},
		{Fail, "nad-config", "b/bad-name", []string{"rdma-netns refuses this network's configuration", `rdmaDevName "a/b" is not a valid RDMA device name`}},
		{Fail, "nad-config", "b/old-version", []string{`cniVersion "0.2.0" is not supported`}},
		{Warn, "name-squat", "b/free", []string{"rdma_net1", "a/renamed"}},
	})
	if r.ExitCode != 1 {
		t.Errorf("exit status %d, want 1 (rdma-netns refuses two NADs)", r.ExitCode)
	}
	if r.NADs.Read != 9 || len(r.NADs.WithRdmaNetns) != 2 {
		t.Errorf("read %d NADs, %d with rdma-netns; want 9 and 2 (renamed, free)", r.NADs.Read, len(r.NADs.WithRdmaNetns))
	}
}

// A NAD's dra.recordDir is refused unless it names the node's record
// directory: the records say which NICs are a pod's, and a NAD that could
// point rdma-netns at records of its own would hand its pods any NIC.
func TestNADsRecordDir(t *testing.T) {
	withDir := func(dir string) map[string]any {
		return rdma(t, exampleConfig(t, "nad-dra.yaml"), map[string]any{"dra": map[string]any{"request": "nics", "recordDir": dir}})
	}
	items := []map[string]any{
		nadItem(t, "ml", "rdma-dra", "", exampleConfig(t, "nad-dra.yaml")),
		nadItem(t, "ml", "old", "", withDir("/var/lib/cni/rdma-netns-dra")),
		nadItem(t, "ml", "old-slash", "", withDir("/var/lib/cni//rdma-netns-dra/")),
		nadItem(t, "team-b", "own-records", "", withDir("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/r")),
		nadItem(t, "team-b", "relative", "", withDir("rdma-netns-dra")),
		nadItem(t, "team-b", "bad\x1b[31mname", "", withDir("/tmp/\x1b[2J")),
	}
	r := CheckNADs(strings.NewReader(listJSON(t, items...)))
	fix := `fix: remove "recordDir" from the "dra" of its rdma-netns entry`
	checkFindings(t, r, []wantFinding{
		{Fail, "dra-record-dir", "team-b/own-records", []string{
			`sets dra.recordDir "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/r"`,
			"reads the DRA driver's records only from the node's directory /var/lib/cni/rdma-netns-dra (rdma-netns-dra's --record-dir, which the chart fixes)",
			"every pod that attaches it fails ADD", fix, "(kubectl edit network-attachment-definitions -n team-b own-records)"}},
		{Fail, "dra-record-dir", "team-b/relative", []string{`sets dra.recordDir "rdma-netns-dra"`, fix}},
		{Fail, "dra-record-dir", "team-b/bad\x1b[31mname", []string{`sets dra.recordDir "/tmp/\x1b[2J"`, fix}},
	})
	for _, f := range r.Findings {
		if f.Subject == "team-b/bad\x1b[31mname" && strings.Contains(f.Remedy, "kubectl") {
			t.Errorf("a command printed for a NAD name that is not one: %s", f.Remedy)
		}
	}
	if r.ExitCode != 1 {
		t.Errorf("exit status %d, want 1", r.ExitCode)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if out := text.String(); strings.Contains(out, "\x1b") {
		t.Errorf("the report writes what a NAD holds to the terminal as it is:\n%s", out)
	}
}

// A NAD's logFile outside the node's log directory is refused: the plugin
// runs as root and would append to whatever file it named.
func TestNADsLogFile(t *testing.T) {
	withLog := func(f string) map[string]any {
		return rdma(t, exampleConfig(t, "nad-host-device.yaml"), map[string]any{"logFile": f})
	}
	items := []map[string]any{
		nadItem(t, "ml", "logs-there", "", withLog("/var/log/rdma-netns/ml.log")),
		nadItem(t, "team-b", "preload", "", withLog("/etc/ld.so.preload")),
		nadItem(t, "team-b", "up-and-out", "", withLog("/var/log/rdma-netns/../../../etc/cron.d/x")),
	}
	r := CheckNADs(strings.NewReader(listJSON(t, items...)))
	fix := `fix: name a file in /var/log/rdma-netns in its rdma-netns entry's "logFile", or remove the key`
	checkFindings(t, r, []wantFinding{
		{Fail, "log-file", "team-b/preload", []string{`sets logFile "/etc/ld.so.preload"`, "every pod that attaches it fails ADD",
			"only in the node's directory /var/log/rdma-netns", fix, "(kubectl edit network-attachment-definitions -n team-b preload)"}},
		{Fail, "log-file", "team-b/up-and-out", []string{`sets logFile "/var/log/rdma-netns/../../../etc/cron.d/x"`, fix}},
	})
	for _, f := range r.Findings {
		if f.Subject == "ml/logs-there" && f.Check == "log-file" {
			t.Errorf("a log file in the node's directory reported: %+v", f)
		}
	}
}

func TestNADsInput(t *testing.T) {
	one, err := json.Marshal(nadItem(t, "a", "renamed", "", exampleConfig(t, "nad-renamed.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	r := CheckNADs(bytes.NewReader(one))
	checkFindings(t, r, nil)
	if r.NADs == nil || len(r.NADs.WithRdmaNetns) != 1 || r.NADs.WithRdmaNetns[0].RdmaDevName != "rdma_net1" {
		t.Errorf("one NAD object: view %+v", r.NADs)
	}
	for _, tc := range []struct{ in, reason string }{
		{"", "the input is empty"},
		{"apiVersion: v1\nkind: List\n", "not a JSON object"},
		{"NAMESPACE   NAME   AGE\n", "not a JSON object"},
		{`{"items": [`, "not valid JSON"},
		{`{"kind": "Pod", "metadata": {"name": "p"}}`, `neither a List of NetworkAttachmentDefinitions nor one (kind "Pod"`},
	} {
		r := CheckNADs(strings.NewReader(tc.in))
		checkFindings(t, r, []wantFinding{{Fail, "nads-input", "input", []string{tc.reason, "kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads"}}})
		if r.ExitCode != 1 {
			t.Errorf("%q: exit status %d, want 1", tc.in, r.ExitCode)
		}
	}
}

func TestNADsCommand(t *testing.T) {
	c := exampleConfig(t, "nad-device-info.yaml")
	rdma(t, c, map[string]any{"capabilities": nil})
	list := listJSON(t, nadItem(t, "ml", "devinfo", "", c))
	file := filepath.Join(t.TempDir(), "nads.json")
	if err := os.WriteFile(file, []byte(list), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args             []string
		code             int
		inStdout, inErr  string
		stdoutIsJSONWarn bool
	}{
		{args: nil, code: 0, inStdout: "ml/devinfo  host-device[deviceID] > rdma-netns"},
		{args: []string{"-"}, code: 0, inStdout: "WARN  single-tenant  ml/devinfo"},
		{args: []string{file}, code: 0, inStdout: "0 ok, 1 warning(s), 0 failure(s); exit status 0"},
		{args: []string{file, "--json"}, code: 0, stdoutIsJSONWarn: true},
		{args: []string{"--json", "-"}, code: 0, stdoutIsJSONWarn: true},
		{args: []string{file, "other"}, code: 2, inErr: `unexpected argument "other"`},
		{args: []string{"--bogus"}, code: 2, inErr: "flag provided but not defined"},
		{args: []string{"/nonexistent/nads.json"}, code: 2, inErr: "cannot read the NADs: open /nonexistent/nads.json"},
		{args: []string{"--help"}, code: 0, inErr: "kubectl get network-attachment-definitions -A -o json | rdma-netns doctor nads"},
	} {
		var stdout, stderr bytes.Buffer
		code := nadsMain(tc.args, strings.NewReader(list), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.inStdout) || !strings.Contains(stderr.String(), tc.inErr) {
			t.Errorf("doctor nads %q = %d\nstdout %s\nstderr %s\nwant %d, stdout with %q, stderr with %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.inStdout, tc.inErr)
		}
		if tc.stdoutIsJSONWarn {
			var r Report
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r.NADs == nil || r.NADs.Read != 1 || len(r.Findings) != 1 || r.Findings[0].Check != "single-tenant" || r.Findings[0].Severity != Warn {
				t.Errorf("doctor nads %q: JSON %s (%v)", tc.args, stdout.String(), err)
			}
		}
	}
}

// `doctor --help` names the subcommand, and Main dispatches it.
func TestDoctorNadsDispatch(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "rdma-netns doctor nads [--json] [FILE]") {
		t.Errorf("doctor --help = %d, %q: no doctor nads", code, stderr.String())
	}
	stderr.Reset()
	if code := Main([]string{"nads", "--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "Usage: rdma-netns doctor nads") {
		t.Errorf("doctor nads --help = %d, %q", code, stderr.String())
	}
}

func TestNADsStateDir(t *testing.T) {
	withState := func(d string) map[string]any {
		return rdma(t, exampleConfig(t, "nad-host-device.yaml"), map[string]any{"stateDir": d})
	}
	items := []map[string]any{
		nadItem(t, "ml", "node-dir", "", withState("/var/lib/cni/rdma-netns")),
		nadItem(t, "team-b", "cron", "", withState("/etc/cron.d")),
	}
	r := CheckNADs(strings.NewReader(listJSON(t, items...)))
	checkFindings(t, r, []wantFinding{
		{Fail, "state-dir", "team-b/cron", []string{`sets stateDir "/etc/cron.d"`, "every pod that attaches it fails ADD",
			"only in the node's directory /var/lib/cni/rdma-netns", `fix: remove "stateDir"`, "(kubectl edit network-attachment-definitions -n team-b cron)"}},
	})
	for _, f := range r.Findings {
		if f.Subject == "ml/node-dir" && f.Check == "state-dir" {
			t.Errorf("the node's own directory reported: %+v", f)
		}
	}
}
