package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeRailNet answers the rails check for netdevs a pod named itself,
// which no test netns needs to hold: every rail at the kernel's ARP
// defaults, and the route from each rail's address leaving by the next
// rail's netdev, so that every rail gets both fixes.
type fakeRailNet struct {
	netdevs []string
	addrs   map[string]netip.Prefix
}

func newFakeRailNet(netdevs ...string) *fakeRailNet {
	n := &fakeRailNet{netdevs: netdevs, addrs: map[string]netip.Prefix{}}
	for i, nd := range netdevs {
		n.addrs[nd] = netip.MustParsePrefix(fmt.Sprintf("10.70.0.%d/24", i+1))
	}
	return n
}

func (n *fakeRailNet) IPv4Addrs(netdev string) ([]netip.Prefix, error) {
	if netdev == "" {
		var all []netip.Prefix
		for _, nd := range n.netdevs {
			all = append(all, n.addrs[nd])
		}
		return all, nil
	}
	return []netip.Prefix{n.addrs[netdev]}, nil
}

func (n *fakeRailNet) ARPConf(netdev, key string) (int, error) { return 0, nil }

func (n *fakeRailNet) RouteNetdev(src, dst netip.Addr) (string, error) {
	for i, nd := range n.netdevs {
		if n.addrs[nd].Addr() == src {
			return n.netdevs[(i+1)%len(n.netdevs)], nil
		}
	}
	return "", fmt.Errorf("no rail has %s", src)
}

func (n *fakeRailNet) check(nsPath string) *Report {
	var devs []RailDev
	for i, nd := range n.netdevs {
		a := n.addrs[nd].Addr().String()
		devs = append(devs, RailDev{Device: fmt.Sprintf("mlx5_%d", i), Port: 1, Netdev: nd, GIDs: []GID{{Index: 3, Address: a, Type: RoCEv2, Netdev: nd}}})
	}
	r := &Report{}
	checkRails(&r.Findings, n, devs, nsPath)
	r.finish()
	return r
}

// pasteShell runs cmd as a person pasting it into sh would, in an empty
// directory, with nsenter, sysctl, ip and rdma replaced by scripts that
// record their argv (nsenter then runs the rest of its command line, as
// the real one does in the netns). It returns what ran, one argv per command, and
// fails the test if anything appeared in the directory.
func pasteShell(t *testing.T, cmd string) [][]string {
	t.Helper()
	dir := t.TempDir()
	bin, cwd, log := filepath.Join(dir, "bin"), filepath.Join(dir, "cwd"), filepath.Join(dir, "argv")
	for _, d := range []string{bin, cwd} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Each argument ends with \037, each command with \036.
	record := `for a in "${0##*/}" "$@"; do printf '%s\037' "$a"; done >>"$ARGV_LOG"; printf '\036' >>"$ARGV_LOG"` + "\n"
	stands := map[string]string{
		"nsenter": record + "shift\nexec \"$@\"\n",
		"sysctl":  record,
		"ip":      record,
		"rdma":    record,
	}
	for name, body := range stands {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sh := exec.Command("sh")
	sh.Dir = cwd
	sh.Stdin = strings.NewReader(cmd + "\n")
	sh.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "ARGV_LOG=" + log}
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Errorf("sh: %v\n%s", err, out)
	}
	if entries, _ := os.ReadDir(cwd); len(entries) > 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("pasting %s created %q in the current directory", cmd, names)
	}
	data, _ := os.ReadFile(log)
	var ran [][]string
	for _, rec := range strings.Split(string(data), "\036") {
		if rec != "" {
			ran = append(ran, strings.Split(strings.TrimSuffix(rec, "\037"), "\037"))
		}
	}
	return ran
}

// command is the command a fix gives to paste: the rest of the fix after
// "try it on this pod:" or "move it back:".
func command(t *testing.T, remedy string) string {
	t.Helper()
	for _, marker := range []string{"try it on this pod: ", "to move it back: "} {
		if _, cmd, ok := strings.Cut(remedy, marker); ok {
			return cmd
		}
	}
	t.Fatalf("no command in fix %q", remedy)
	return ""
}

// A pod names its netdevs (its network-selection element's interface),
// and the kernel, libcni and host-device take names a shell would run.
// The fixes of the rails check, pasted as they are printed, run exactly
// the commands they show, on exactly those netdevs, and nothing else.
func TestRailFixesPasteSafely(t *testing.T) {
	netdevs := []string{"a;>X;", "b';>X;'", "c`>X`", "d$(>X).1"}
	nsPath := "/run/netns/pod;>X 'q'"
	r := newFakeRailNet(netdevs...).check(nsPath)
	enter := []string{"nsenter", "--net=" + nsPath}
	arp, route := 0, 0
	for _, f := range r.Findings {
		if f.Check != "rail-arp" && f.Check != "rail-route" {
			continue
		}
		var nd string
		for _, n := range netdevs {
			if f.Subject == fmt.Sprintf("mlx5_%d (%s)", slices.Index(netdevs, n), n) {
				nd = n
			}
		}
		var text bytes.Buffer
		(&Report{Findings: []Finding{f}}).WriteText(&text)
		cmd := command(t, f.Remedy)
		if !strings.Contains(text.String(), cmd) {
			t.Errorf("the text report does not show the command as it is:\n%s\nwant %s", text.String(), cmd)
		}
		ran := pasteShell(t, cmd)
		var want [][]string
		switch f.Check {
		case "rail-arp":
			arp++
			keys := []string{"net.ipv4.conf." + nd + ".arp_ignore=1", "net.ipv4.conf." + nd + ".arp_announce=2"}
			if strings.Contains(nd, ".") {
				// sysctl reads a dotted key's dots as separators.
				keys = []string{"net/ipv4/conf/" + nd + "/arp_ignore=1", "net/ipv4/conf/" + nd + "/arp_announce=2"}
			}
			sysctl := append([]string{"sysctl", "-w"}, keys...)
			want = [][]string{append(slices.Clone(enter), sysctl...), sysctl}
		case "rail-route":
			route++
			p := newFakeRailNet(netdevs...).addrs[nd]
			table := fmt.Sprint(100 + slices.Index(netdevs, nd))
			add := []string{"ip", "route", "add", p.Masked().String(), "dev", nd, "src", p.Addr().String(), "table", table}
			rule := []string{"ip", "rule", "add", "from", p.Addr().String(), "table", table}
			want = [][]string{append(slices.Clone(enter), add...), add, append(slices.Clone(enter), rule...), rule}
		}
		if fmt.Sprintf("%q", ran) != fmt.Sprintf("%q", want) {
			t.Errorf("%s %s: pasting\n  %s\nran  %q\nwant %q", f.Check, f.Subject, cmd, ran, want)
		}
	}
	if arp != len(netdevs) || route != len(netdevs) {
		t.Fatalf("%d rail-arp and %d rail-route fixes, want %d of each: %+v", arp, route, len(netdevs), r.Findings)
	}
}

// A device no record owns, in a netns whose name holds a quote: the
// command that moves it back, pasted, moves that device from that netns.
func TestLeakFixPastesSafely(t *testing.T) {
	for _, c := range []struct {
		netns string
		want  [][]string
	}{
		// The stand-in ip does not go on to run rdma in the netns.
		{"/run/netns/n'>X", [][]string{{"ip", "netns", "attach", "host", "1"}, {"ip", "netns", "exec", "n'>X", "rdma", "dev", "set", "m;>X;`>X`", "netns", "host"}}},
		{"/proc/1/task/1/ns/net;>X", [][]string{{"ip", "netns", "attach", "host", "1"},
			{"nsenter", "--net=/proc/1/task/1/ns/net;>X", "rdma", "dev", "set", "m;>X;`>X`", "netns", "host"}, {"rdma", "dev", "set", "m;>X;`>X`", "netns", "host"}}},
	} {
		leaks := Leaks([]Device{{Name: "m;>X;`>X`", Location: Location{Netns: c.netns}}}, nil)
		if len(leaks) != 1 {
			t.Fatalf("leaks %+v", leaks)
		}
		ran := pasteShell(t, command(t, leaks[0].Remedy))
		if fmt.Sprintf("%q", ran) != fmt.Sprintf("%q", c.want) {
			t.Errorf("pasting %s ran %q, want %q", command(t, leaks[0].Remedy), ran, c.want)
		}
	}
}

// A name the report has to escape (a control character) would not be the
// name once pasted: the fix then says why it prints no command.
func TestRailFixWithoutCommand(t *testing.T) {
	r := newFakeRailNet("e\x1b[2Je", "f").check("/run/netns/pod")
	for _, f := range r.Findings {
		if f.Subject != "mlx5_0 (e\x1b[2Je)" || (f.Check != "rail-arp" && f.Check != "rail-route") {
			continue
		}
		if strings.Contains(f.Remedy, "nsenter") || !strings.Contains(f.Remedy, "no command is printed") || !strings.Contains(f.Remedy, RailsNAD) {
			t.Errorf("%s fix for a netdev with ESC in its name: %s", f.Check, f.Remedy)
		}
	}
	for _, f := range r.Findings {
		if f.Subject == "mlx5_1 (f)" && f.Check == "rail-arp" && !strings.Contains(f.Remedy, "nsenter --net='/run/netns/pod' sysctl -w 'net.ipv4.conf.f.arp_ignore=1'") {
			t.Errorf("rail-arp fix of f: %s", f.Remedy)
		}
	}
}

// Whatever a value holds, the text report shows it escaped and keeps its
// own lines and columns; JSON carries it as it is.
func TestTextEscapesValues(t *testing.T) {
	for _, c := range []struct{ raw, shown string }{
		{"ESC\x1b[2J", `ESC\x1b[2J`},
		{"BEL\a", `BEL\x07`},
		{"title\x1b]0;owned\x07", `title\x1b]0;owned\x07`},
		{"CSI\u009b31m", `CSI\u009b31m`},
		{"bad\xff\xfe", `bad\xff\xfe`},
		{"line\nFAIL  fake", `line\x0aFAIL  fake`},
		{"tab\tcol\r", `tab\x09col\x0d`},
		{"bidi\u202eevil", `bidi\u202eevil`},
		{"DEL\x7f", `DEL\x7f`},
		{`plain 'quoted' \ back`, `plain 'quoted' \ back`},
		{"ünïcode ✓", "ünïcode ✓"},
	} {
		r := &Report{Findings: []Finding{{Severity: Warn, Check: "c", Subject: c.raw, Reason: "reason " + c.raw, Remedy: "fix " + c.raw}}}
		r.finish()
		var text bytes.Buffer
		if err := r.WriteText(&text); err != nil {
			t.Fatal(err)
		}
		want := "  WARN  c  " + c.shown + "  reason " + c.shown + "\n"
		if !strings.Contains(text.String(), want) || !strings.Contains(text.String(), "fix: fix "+c.shown+"\n") || strings.Count(text.String(), "\n") != 5 {
			t.Errorf("%q shown as\n%s\nwant the line %q", c.raw, text.String(), want)
		}
		var js bytes.Buffer
		if err := r.WriteJSON(&js); err != nil {
			t.Fatal(err)
		}
		var back Report
		if err := json.Unmarshal(js.Bytes(), &back); err != nil {
			t.Fatalf("%q: JSON %v:\n%s", c.raw, err, js.String())
		}
		if got := back.Findings[0].Subject; got != c.raw && !strings.Contains(c.raw, "\xff") {
			t.Errorf("JSON subject %q, want %q", got, c.raw)
		}
	}
}

// rawControl says whether text holds a byte a terminal acts on.
func rawControl(text string) bool {
	return strings.ContainsFunc(text, func(r rune) bool { return r == 0x1b || r == 0x07 || r == 0x9b })
}

// ESC and BEL in a NAD's plugin type and in its resourceName annotation
// reach the terminal escaped, in the table and in the findings, and
// --json intact.
func TestNADsTextEscapes(t *testing.T) {
	c := exampleConfig(t, "nad-device-info.yaml")
	rdma(t, c, map[string]any{"capabilities": nil})
	hd := plugin(t, c, "host-device")
	hd["type"] = "host-device\x1b[2J\x07"
	resource := "example.com/nic\x1b]0;owned\x07"
	list := listJSON(t, nadItem(t, "ml", "devinfo", resource, c))

	var text, stderr bytes.Buffer
	nadsMain([]string{"-"}, strings.NewReader(list), &text, &stderr)
	if rawControl(text.String()) {
		t.Errorf("raw ESC or BEL in the text report:\n%q", text.String())
	}
	for _, want := range []string{`host-device\x1b[2J\x07[deviceID] > rdma-netns`, `example.com/nic\x1b]0;owned\x07`,
		`a pod allocated no example.com/nic\x1b]0;owned\x07 picks its NIC through host-device\x1b[2J\x07's deviceID capability`} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %s:\n%s", want, text.String())
		}
	}

	var js bytes.Buffer
	nadsMain([]string{"--json", "-"}, strings.NewReader(list), &js, &stderr)
	var r Report
	if err := json.Unmarshal(js.Bytes(), &r); err != nil {
		t.Fatalf("JSON: %v\n%s", err, js.String())
	}
	if v := r.NADs.WithRdmaNetns[0]; v.Chain[0].Type != hd["type"] || v.ResourceName != resource || !strings.Contains(r.Findings[0].Reason, resource) {
		t.Errorf("JSON changed the values: %+v %+v", v, r.Findings)
	}
}

// A process names itself (prctl(PR_SET_NAME)): its comm reaches the
// terminal escaped in the processes table and in the findings' subjects,
// and --json intact.
func TestPodTextEscapesComm(t *testing.T) {
	f := newNodeFixture(t)
	comm := "evil\x1b]0;x\x07\x1b[8m"
	f.fp.proc("41", comm, "pod-a", "65536", "0", 64<<20, "uverbs1", "rdma_cm")
	podA := filepath.Join(f.netnsDir, "pod-a")

	var text, js, stderr bytes.Buffer
	runOn([]string{"--netns", podA}, &text, &stderr, f.env)
	if rawControl(text.String()) {
		t.Errorf("raw ESC or BEL in the text report:\n%q", text.String())
	}
	shown := `evil\x1b]0;x\x07\x1b[8m`
	for _, want := range []string{"  41   " + shown + "  64KiB", "memlock       pid 41 (" + shown + ")"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	runOn([]string{"--netns", podA, "--json"}, &js, &stderr, f.env)
	var r Report
	if err := json.Unmarshal(js.Bytes(), &r); err != nil {
		t.Fatalf("JSON: %v\n%s", err, js.String())
	}
	var p *Process
	for i := range r.Pod.Processes {
		if r.Pod.Processes[i].PID == 41 {
			p = &r.Pod.Processes[i]
		}
	}
	if p == nil || p.Comm != comm || len(findingsOf(&r, "memlock")) == 0 || findingsOf(&r, "memlock")[0].Subject != "pid 41 ("+comm+")" {
		t.Errorf("JSON changed the comm: %+v", r.Pod.Processes)
	}
}

// The kubectl command of a NAD that cannot be checked names the NAD only
// when its namespace and name are ones the API server gives; a NAD from
// a file can be called anything.
func TestNADFixNamesOnlyKubeNames(t *testing.T) {
	bad := `{"cniVersion": "1.1.0", "plugins": [`
	r := CheckNADs(strings.NewReader(listJSON(t, nadItem(t, "b", "x;>X", "", bad), nadItem(t, "b$(>X)", "y", "", bad), nadItem(t, "b", "ok.name-1", "", bad))))
	for _, f := range r.Findings {
		hasCmd := strings.Contains(f.Remedy, "kubectl edit")
		if want := f.Subject == "b/ok.name-1"; hasCmd != want || !strings.Contains(f.Remedy, "correct spec.config") {
			t.Errorf("%s: fix %q, want a kubectl command: %v", f.Subject, f.Remedy, want)
		}
	}
	if len(r.Findings) != 3 {
		t.Errorf("findings %+v", r.Findings)
	}
}
