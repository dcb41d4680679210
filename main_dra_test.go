package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// fakePlugin writes an executable CNI plugin into dir that appends its
// name, verb, CNI_IFNAME and stdin to log, and answers ADD with result.
func fakePlugin(t *testing.T, dir, name, log, result string) {
	t.Helper()
	script := "#!/bin/sh\nprintf '" + name + " %s %s ' \"$CNI_COMMAND\" \"$CNI_IFNAME\" >> " + log + "\ncat >> " + log + "\necho >> " + log + "\n" +
		"if [ \"$CNI_COMMAND\" = ADD ]; then printf '%s' '" + result + "'; fi\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// In dra mode the binary runs the host-device it finds in CNI_PATH with
// the claimed NIC's PCI address and the network's ipam, takes its result,
// and runs host-device's DEL when its own ADD then fails (this node has
// no NIC at that address); DEL runs host-device's DEL by interface name,
// and with the netns gone only the IPAM plugin's.
func TestBinaryDRADelegates(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	bin := buildBinary(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(netns)
	defer netns.Close()

	tmp := t.TempDir()
	cniPath, log := filepath.Join(tmp, "bin"), filepath.Join(tmp, "calls.log")
	if err := os.Mkdir(cniPath, 0o755); err != nil {
		t.Fatal(err)
	}
	result := `{"cniVersion":"1.1.0","interfaces":[{"name":"net1","sandbox":"` + netns.Path() + `"}]}`
	fakePlugin(t, cniPath, "host-device", log, result)
	fakePlugin(t, cniPath, "fake-ipam", log, "")

	const uid = "7f3c9a62-0b1d-4a8e-9c55-2f6d1e0a4b01"
	recDir := filepath.Join(tmp, "dra")
	// No NIC has this address on any node: ADD fails after host-device.
	if err := drarecord.Dir(recDir).Write(&drarecord.Claim{Version: 1, ClaimUID: "c1", PodUID: uid,
		Devices: []drarecord.Device{{Request: "nics", PCIAddress: "0000:fe:1f.7"}}}); err != nil {
		t.Fatal(err)
	}
	conf := `{"cniVersion":"1.1.0","name":"rdma-dra","type":"rdma-netns","stateDir":"` + filepath.Join(tmp, "state") +
		`","dra":{"recordDir":"` + recDir + `"},"ipam":{"type":"fake-ipam"}}`
	env := func(verb, ns string) []string {
		return []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=c0ffee", "CNI_NETNS=" + ns, "CNI_IFNAME=net1",
			"CNI_PATH=" + cniPath, "CNI_ARGS=K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=" + uid}
	}
	calls := func() []string {
		b, _ := os.ReadFile(log)
		os.Remove(log)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}

	out, errOut, code := run(t, bin, env("ADD", netns.Path()), conf)
	if code == 0 {
		t.Fatalf("ADD of a NIC this node does not have succeeded: %s", out)
	}
	got := calls()
	if len(got) != 2 ||
		got[0] != `host-device ADD net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","pciBusID":"0000:fe:1f.7","ipam":{"type":"fake-ipam"}}` ||
		got[1] != `host-device DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","device":"net1","ipam":{"type":"fake-ipam"}}` {
		t.Fatalf("ADD ran %q (stdout %s, stderr %s); want host-device's ADD, then its DEL", got, out, errOut)
	}

	if out, errOut, code := run(t, bin, env("DEL", netns.Path()), conf); code != 0 {
		t.Fatalf("DEL: exit %d, %s %s", code, out, errOut)
	}
	if got := calls(); len(got) != 1 || !strings.HasPrefix(got[0], `host-device DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","device":"net1"`) {
		t.Fatalf("DEL ran %q, want host-device's DEL", got)
	}

	if out, errOut, code := run(t, bin, env("DEL", filepath.Join(tmp, "gone")), conf); code != 0 {
		t.Fatalf("DEL with the netns gone: exit %d, %s %s", code, out, errOut)
	}
	if got := calls(); len(got) != 1 || !strings.HasPrefix(got[0], `fake-ipam DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device"`) {
		t.Fatalf("DEL with the netns gone ran %q, want the IPAM plugin's DEL (its stdin is host-device's config)", got)
	}
}
