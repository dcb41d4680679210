package config

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The documented patterns, the oracle for the hand-written checks.
var (
	rdmaNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$`)
	deviceIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
	k8sNameRe  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
)

// FuzzNameChecks holds the hand-written name checks to the patterns the
// error messages and README describe, both ways.
func FuzzNameChecks(f *testing.F) {
	for _, s := range []string{"", "mlx5_0", "rocep47s0f0", "_x", "a-", "0000:3b:00.2", "mlx5_core.sf.2", "a/b", "a b", "é", "default", "kube-system", "a.b-c", "-a", "a-", "A", strings.Repeat("c", 253), strings.Repeat("c", 254), strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("b", 128), strings.Repeat("b", 129)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidRDMAName(s), rdmaNameRe.MatchString(s); got != want {
			t.Fatalf("ValidRDMAName(%q) = %v, pattern says %v", s, got, want)
		}
		if got, want := validDeviceID(s), deviceIDRe.MatchString(s); got != want {
			t.Fatalf("validDeviceID(%q) = %v, pattern says %v", s, got, want)
		}
		if got, want := validK8sName(s), k8sNameRe.MatchString(s); got != want {
			t.Fatalf("validK8sName(%q) = %v, pattern says %v", s, got, want)
		}
	})
}

func FuzzParse(f *testing.F) {
	// The rdma-netns entry of a real conflist as the runtime hands it over,
	// with the prevResult of the main plugin spliced in.
	conflistEntry := `{
		"cniVersion": "1.0.0",
		"name": "sriov-rdma",
		"type": "rdma-netns",
		"deviceID": "0000:3b:00.2",
		"rdmaDevName": "rdma0",
		"rdmaQoS": {"tos": 106},
		"logFile": "/var/log/rdma-netns.log",
		"logLevel": "debug",
		"runtimeConfig": {"deviceID": "0000:3b:00.2", "CNIDeviceInfoFile": "/var/run/k8s.cni.cncf.io/devinfo/cni/sriov-rdma-abc-net1"},
		"prevResult": {
			"cniVersion": "1.0.0",
			"interfaces": [{"name": "net1", "mac": "2a:9c:10:e5:1d:44", "sandbox": "/var/run/netns/cni-5d6c"}],
			"ips": [{"address": "192.168.100.7/24", "interface": 0}],
			"dns": {}
		}
	}`
	seeds := []struct{ stdin, args string }{
		{conflistEntry, "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=rdma-pod;K8S_POD_INFRA_CONTAINER_ID=abc"},
		{`{"cniVersion":"0.3.1","name":"n","type":"rdma-netns","prevResult":` + prevResultFor("0.3.1") + `}`, ""},
		{`{"cniVersion":"0.4.0","name":"n","type":"rdma-netns","rdmaDevice":"mlx5_0","args":{"cni":{"rdmaDevice":"mlx5_1"}}}`, "rdmaDevice=mlx5_2"},
		{`{"cniVersion":"1.1.0","name":"n","type":"rdma-netns","stateDir":"/run/x","rdmaQoS":{"tc":3}}`, "rdmaDevName=r0"},
		{`{"cniVersion":"0.2.0","name":"n"}`, ""},
		{`{"rdmaDevice":"../x","stateDir":"rel"}`, "bad"},
		{`{"prevResult":{}}`, ""},
		{`null`, ""},
		{`{`, ""},
	}
	for _, s := range seeds {
		f.Add([]byte(s.stdin), s.args)
	}
	f.Fuzz(func(t *testing.T, stdin []byte, cniArgs string) {
		c, err := Parse(stdin, cniArgs)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned both a config and error %v", err)
			}
			return
		}
		for _, p := range []string{c.StateDir, c.LogFile, c.RuntimeConfig.CNIDeviceInfoFile} {
			if p != "" && (!filepath.IsAbs(p) || strings.ContainsRune(p, 0)) {
				t.Fatalf("accepted path %q is not absolute", p)
			}
		}
		names := append([]string{c.RdmaDevice, c.RdmaDevName, c.PodRdmaDevNamePrefix}, c.AllowedPodDevices...)
		ids := []string{c.DeviceID, c.PCIBusID, c.NetworkDeviceID().Value}
		// What ADD takes from the pod passed the same checks, or ADD
		// refuses it; either way the parse DEL shares succeeded.
		if req, err := c.PodRequest(); err == nil {
			for _, s := range req.Devices {
				names = append(names, s.Value)
			}
			for _, s := range req.DeviceIDs {
				ids = append(ids, s.Value)
			}
			names = append(names, req.DevName.Value)
		}
		for _, n := range names {
			if n != "" && !rdmaNameRe.MatchString(n) {
				t.Fatalf("accepted RDMA device name %q does not match the documented pattern", n)
			}
			if strings.Contains(n, "/") || n == "." || n == ".." {
				t.Fatalf("accepted RDMA device name %q could escape a directory", n)
			}
		}
		for _, id := range ids {
			if id != "" && !deviceIDRe.MatchString(id) {
				t.Fatalf("accepted device ID %q does not match the documented pattern", id)
			}
		}
		if c.CNIVersion != "" && !supported(c.CNIVersion) {
			t.Fatalf("accepted unsupported cniVersion %q", c.CNIVersion)
		}
		if q := c.RdmaQoS; q != nil {
			if q.ToS == nil && q.TC == nil {
				t.Fatal("accepted empty rdmaQoS")
			}
			if (q.ToS != nil && (*q.ToS < 0 || *q.ToS > 255)) || (q.TC != nil && (*q.TC < 0 || *q.TC > 255)) {
				t.Fatalf("accepted out-of-range rdmaQoS %+v", q)
			}
		}
		if c.PrevResultJSON != nil && string(c.PrevResultJSON) != "null" && c.Result == nil {
			t.Fatal("prevResult accepted but Result not set")
		}
	})
}
