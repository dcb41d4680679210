package main

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// snapshot is what a rejected call must leave alone.
type snapshot struct {
	hostRDMA, hostNet, podRDMA, podNet, state []string
}

func take(podPath string) snapshot {
	var s snapshot
	s.hostRDMA, _ = rig.RDMAIn("")
	s.hostNet, _ = rig.NetdevsIn("")
	s.podRDMA, _ = rig.RDMAIn(podPath)
	s.podNet, _ = rig.NetdevsIn(podPath)
	s.state = rig.StateFiles(rig.StateDir)
	return s
}

func (a snapshot) equal(b snapshot) bool {
	return slices.Equal(a.hostRDMA, b.hostRDMA) && slices.Equal(a.hostNet, b.hostNet) &&
		slices.Equal(a.podRDMA, b.podRDMA) && slices.Equal(a.podNet, b.podNet) && slices.Equal(a.state, b.state)
}

// badInput feeds hostile or broken input to ADD and DEL. Each must fail
// with a clear message (no panic, no empty error) and change nothing.
func badInput(n, other rig.NIC) {
	a, err := newAttachment(n, "bad-input", nil)
	if err != nil {
		failf("bad input: %v", err)
		return
	}
	defer a.close()
	good := a.add
	podPath := a.pod.Path()
	conf := func(extra map[string]any) []byte { return rig.PluginConf("stress-bad", n.Netdev, podPath, extra) }

	regular := "/tmp/stress-regular-file"
	os.WriteFile(regular, []byte("not a netns"), 0o644)
	defer os.Remove(regular)
	long := strings.Repeat("a", 5000)
	big := append([]byte(`{"cniVersion":"1.1.0","name":"stress-bad","type":"rdma-netns","pad":"`), bytes.Repeat([]byte("x"), 5<<20)...)
	big = append(big, []byte(`"}`)...)

	type tc struct {
		name string
		mod  func(c rig.Call) rig.Call
		// delOK: DEL may succeed for this input (it then has nothing to
		// do); it must still change nothing.
		delOK bool
	}
	withEnv := func(k, v string) func(rig.Call) rig.Call {
		return func(c rig.Call) rig.Call {
			switch k {
			case "CNI_CONTAINERID":
				c.ContainerID = v
			case "CNI_IFNAME":
				c.IfName = v
			case "CNI_NETNS":
				c.Netns = v
			case "CNI_ARGS":
				c.Args = v
			}
			return c
		}
	}
	withConf := func(extra map[string]any) func(rig.Call) rig.Call {
		return func(c rig.Call) rig.Call { c.Stdin = conf(extra); return c }
	}
	withStdin := func(b []byte) func(rig.Call) rig.Call {
		return func(c rig.Call) rig.Call { c.Stdin = b; return c }
	}
	cases := []tc{
		{"container ID ../../etc", withEnv("CNI_CONTAINERID", "../../etc"), false},
		{"container ID a/../../b", withEnv("CNI_CONTAINERID", "a/../../b"), false},
		{"container ID 5000 bytes", withEnv("CNI_CONTAINERID", long), false},
		{"container ID with newline", withEnv("CNI_CONTAINERID", "abc\nINFO fake log line"), false},
		{"empty container ID", withEnv("CNI_CONTAINERID", ""), false},
		{"ifname ../x", withEnv("CNI_IFNAME", "../x"), false},
		{"ifname 5000 bytes", withEnv("CNI_IFNAME", long), false},
		{"network name ../../x", withConf(map[string]any{"name": "../../x"}), false},
		{"network name with NUL", withConf(map[string]any{"name": "net\x00work"}), false},
		{"network name 5000 bytes", withConf(map[string]any{"name": long}), false},
		{"rdmaDevice ../../sys", withConf(map[string]any{"rdmaDevice": "../../sys"}), false},
		{"rdmaDevice with NUL", withConf(map[string]any{"rdmaDevice": "rxe0\x00x"}), false},
		{"rdmaDevice 5000 bytes", withConf(map[string]any{"rdmaDevice": long}), false},
		{"rdmaDevName with /", withConf(map[string]any{"rdmaDevName": "a/b"}), false},
		{"rdmaDevName = another host device", withConf(map[string]any{"rdmaDevName": other.RDMA}), true},
		{"deviceID ../../../x", withConf(map[string]any{"deviceID": "../../../x"}), false},
		{"deviceID of an absent PCI function", withConf(map[string]any{"deviceID": "0000:ff:1f.7"}), true},
		{"stateDir relative", withConf(map[string]any{"stateDir": "state"}), false},
		{"stateDir with NUL", withConf(map[string]any{"stateDir": "/tmp/\x00x"}), false},
		// A stateDir other than the node's fails ADD; DEL keeps to the
		// node's records and never writes where the network says.
		{"stateDir is a regular file", withConf(map[string]any{"stateDir": regular}), true},
		{"stateDir /etc", withConf(map[string]any{"stateDir": "/etc"}), true},
		// What the pod wrote fails ADD only: DEL never fails on it.
		{"CNI_ARGS rdmaDevice=../x", withEnv("CNI_ARGS", "IgnoreUnknown=1;rdmaDevice=../x"), true},
		{"CNI_ARGS without =", withEnv("CNI_ARGS", "garbage"), true},
		{"args.cni rdmaDevName a/b", withConf(map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevName": "a/b"}}}), true},
		{"args.cni rdmaDevName a number", withConf(map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevName": 7}}}), true},
		{"args.cni rdmaDevice of another NIC", withConf(map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevice": other.RDMA}}}), true},
		{"CNI_NETNS a regular file", withEnv("CNI_NETNS", regular), true},
		{"CNI_NETNS a directory", withEnv("CNI_NETNS", "/tmp"), true},
		{"CNI_NETNS a mount namespace", withEnv("CNI_NETNS", "/proc/1/ns/mnt"), true},
		{"CNI_NETNS nonexistent", withEnv("CNI_NETNS", "/run/netns/does-not-exist"), true},
		{"CNI_NETNS relative", withEnv("CNI_NETNS", "run/netns/x"), true},
		{"CNI_NETNS the host's own netns", withEnv("CNI_NETNS", "/proc/1/ns/net"), true},
		// Over the 4 MiB ADD takes; DEL takes any size.
		{"stdin 5 MiB", withStdin(big), true},
		{"stdin empty", withStdin(nil), false},
		{"stdin not JSON", withStdin([]byte("\x00\x01\x02garbage")), false},
		{"stdin JSON array", withStdin([]byte(`[1,2,3]`)), false},
		{"cniVersion 0.1.0", withConf(map[string]any{"cniVersion": "0.1.0"}), false},
		// DEL never reads prevResult, so it has nothing to refuse there.
		{"prevResult not an object", withConf(map[string]any{"prevResult": "oops"}), true},
		{"prevResult with 10000 interfaces", withConf(map[string]any{"prevResult": manyIfaces(podPath)}), true},
	}
	for _, c := range cases {
		for _, verb := range []string{"ADD", "DEL"} {
			st.badInputs.Add(1)
			call := c.mod(good)
			call.Verb = verb
			before := take(podPath)
			r := rig.Exec(call)
			after := take(podPath)
			msg := r.Msg()
			switch {
			case strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine "):
				failf("bad input %q %s: the plugin panicked: %s", c.name, verb, firstLine(msg))
			case !r.Failed() && !(verb == "DEL" && c.delOK):
				failf("bad input %q %s: accepted (stdout %s)", c.name, verb, firstLine(string(r.Stdout)))
			case r.Failed() && strings.TrimSpace(msg) == "":
				failf("bad input %q %s: failed without a message", c.name, verb)
			}
			if !before.equal(after) {
				failf("bad input %q %s: changed the node: before %+v after %+v", c.name, verb, before, after)
			}
			if r.Failed() {
				fmt.Printf("stress: bad input %-38q %s -> %s\n", c.name, verb, firstLine(msg))
			} else {
				fmt.Printf("stress: bad input %-38q %s -> ok (nothing to do)\n", c.name, verb)
			}
			if c.name == "stdin 5 MiB" {
				what := "did nothing"
				if r.Failed() {
					what = "refused"
				}
				observe("a 5 MiB stdin: %s %s; peak RSS of that call %d KiB", verb, what, r.MaxRSSKiB)
			}
		}
	}
	// The attachment still works after all that.
	if r := rig.Exec(good); r.Failed() {
		failf("bad input: a good ADD afterwards failed: %s", r.Msg())
	} else if err := a.attachedOK(); err != nil {
		failf("bad input: a good ADD afterwards: %v", err)
	}
	if r := rig.Exec(a.del()); r.Failed() {
		failf("bad input: a good DEL afterwards failed: %s", r.Msg())
	}
}

func manyIfaces(podPath string) map[string]any {
	ifs := make([]map[string]any, 10000)
	for i := range ifs {
		ifs[i] = map[string]any{"name": fmt.Sprintf("if%d", i), "sandbox": podPath}
	}
	return map[string]any{"cniVersion": "1.1.0", "interfaces": ifs}
}
