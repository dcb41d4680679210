package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

func intp(i int) *int { return &i }

func TestParseAllFields(t *testing.T) {
	stdin := `{
		"cniVersion": "1.0.0",
		"name": "rdma-net",
		"type": "rdma-netns",
		"rdmaDevice": "mlx5_0",
		"deviceID": "0000:3b:00.2",
		"pciBusID": "0000:3b:00.3",
		"allowSharedMode": true,
		"rdmaDevName": "rdma0",
		"rdmaQoS": {"tos": 106, "tc": 3},
		"stateDir": "/run/rdma-netns",
		"logFile": "/var/log/rdma-netns.log",
		"logLevel": "debug",
		"runtimeConfig": {"deviceID": "mlx5_core.sf.4", "CNIDeviceInfoFile": "/var/run/k8s.cni.cncf.io/devinfo/cni/x.json"},
		"args": {"cni": {"rdmaDevice": "mlx5_1", "rdmaDevName": "rdma1"}}
	}`
	c, err := Parse([]byte(stdin), "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;rdmaDevice=mlx5_2;rdmaDevName=rdma2")
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"cniVersion", c.CNIVersion, "1.0.0"},
		{"name", c.Name, "rdma-net"},
		{"type", c.Type, "rdma-netns"},
		{"rdmaDevice", c.RdmaDevice, "mlx5_0"},
		{"deviceID", c.DeviceID, "0000:3b:00.2"},
		{"pciBusID", c.PCIBusID, "0000:3b:00.3"},
		{"allowSharedMode", c.AllowSharedMode, true},
		{"rdmaDevName", c.RdmaDevName, "rdma0"},
		{"rdmaQoS", c.RdmaQoS, &QoS{ToS: intp(106), TC: intp(3)}},
		{"stateDir", c.StateDir, "/run/rdma-netns"},
		{"logFile", c.LogFile, "/var/log/rdma-netns.log"},
		{"logLevel", c.LogLevel, "debug"},
		{"runtimeConfig.deviceID", c.RuntimeConfig.DeviceID, "mlx5_core.sf.4"},
		{"runtimeConfig.CNIDeviceInfoFile", c.RuntimeConfig.CNIDeviceInfoFile, "/var/run/k8s.cni.cncf.io/devinfo/cni/x.json"},
		{"CNI_ARGS", c.CNIArgs, PerPodArgs{RdmaDevice: "mlx5_2", RdmaDevName: "rdma2"}},
		{"Result", c.Result, (*current.Result)(nil)},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %#v, want %#v", ch.name, ch.got, ch.want)
		}
	}
}

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns"}`), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != "" || c.ForeignStateDir() {
		t.Errorf("StateDir = %q (foreign %v), want none: the node's directory is the plugin's, not the network's", c.StateDir, c.ForeignStateDir())
	}
	if c.Result != nil {
		t.Errorf("Result = %+v without a prevResult, want nil", c.Result)
	}
	if c.RdmaQoS != nil || c.AllowSharedMode || c.LogFile != "" {
		t.Errorf("unexpected non-zero defaults: %+v", c)
	}
	if s := c.NetworkDevice(); s != (Source{}) {
		t.Errorf("NetworkDevice = %+v, want none", s)
	}
	if s := c.NetworkDeviceID(); s != (Source{}) {
		t.Errorf("NetworkDeviceID = %+v, want none", s)
	}
	if req, err := c.PodRequest(); err != nil || !req.Empty() {
		t.Errorf("PodRequest = %+v, %v; want none", req, err)
	}
}

// withFields is a valid minimal configuration with the JSON members fields.
func withFields(fields string) string {
	if fields == "" {
		return `{"cniVersion":"1.0.0","name":"n","type":"rdma-netns"}`
	}
	return `{"cniVersion":"1.0.0","name":"n","type":"rdma-netns",` + fields + `}`
}

func TestParseValidationErrors(t *testing.T) {
	long64 := strings.Repeat("a", 64)
	long129 := strings.Repeat("a", 129)
	tests := []struct {
		name    string
		fields  string // JSON members added to a valid base config
		cniArgs string
		want    []string // substrings the error must contain
	}{
		{"rdmaDevice slash", `"rdmaDevice":"mlx5/0"`, "", []string{`rdmaDevice "mlx5/0" is not a valid RDMA device name`}},
		{"rdmaDevice dotdot", `"rdmaDevice":".."`, "", []string{`rdmaDevice ".." is not a valid RDMA device name`}},
		{"rdmaDevice traversal", `"rdmaDevice":"../../etc"`, "", []string{`rdmaDevice "../../etc" is not a valid RDMA device name`}},
		{"rdmaDevice NUL", `"rdmaDevice":"mlx5\u00000"`, "", []string{`rdmaDevice "mlx5\x000" is not a valid RDMA device name`}},
		{"rdmaDevice too long", `"rdmaDevice":"` + long64 + `"`, "", []string{`rdmaDevice "` + long64 + `" is not a valid RDMA device name`, "at most 63 characters"}},
		{"rdmaDevice space", `"rdmaDevice":"mlx5 0"`, "", []string{`rdmaDevice "mlx5 0"`}},
		{"rdmaDevName slash", `"rdmaDevName":"x/y"`, "", []string{`rdmaDevName "x/y" is not a valid RDMA device name`}},
		{"deviceID slash", `"deviceID":"0000:3b:00.2/../x"`, "", []string{`deviceID "0000:3b:00.2/../x" is not a PCI address or auxiliary device name`}},
		{"deviceID dotdot", `"deviceID":".."`, "", []string{`deviceID ".." is not a PCI address or auxiliary device name`}},
		{"deviceID too long", `"deviceID":"` + long129 + `"`, "", []string{`deviceID "` + long129 + `" is not a PCI address`}},
		{"pciBusID NUL", `"pciBusID":"0000:3b\u0000:00.2"`, "", []string{`pciBusID "0000:3b\x00:00.2" is not a PCI address or auxiliary device name`}},
		{"stateDir relative", `"stateDir":"var/lib/x"`, "", []string{`stateDir "var/lib/x" must be an absolute path`}},
		{"stateDir NUL", `"stateDir":"/var/lib\u0000/x"`, "", []string{`stateDir "/var/lib\x00/x" must be an absolute path`}},
		{"logFile relative", `"logFile":"rdma.log"`, "", []string{`logFile "rdma.log" must be an absolute path`}},
		{"CNIDeviceInfoFile relative", `"runtimeConfig":{"CNIDeviceInfoFile":"./x.json"}`, "", []string{`runtimeConfig.CNIDeviceInfoFile "./x.json" must be an absolute path`}},
		{"allowedPodDevices entry", `"allowedPodDevices":["rxe1","../x"]`, "", []string{`allowedPodDevices[1] "../x" is not a valid RDMA device name`}},
		{"podRdmaDevNamePrefix slash", `"podRdmaDevNamePrefix":"a/"`, "", []string{`podRdmaDevNamePrefix "a/" is not a valid RDMA device name`}},
		{"logLevel unknown", `"logLevel":"verbose"`, "", []string{`logLevel "verbose" is not one of error, warn, info, debug`}},
		{"logLevel trace", `"logLevel":"trace"`, "", []string{`logLevel "trace"`}},
		{"rdmaQoS empty", `"rdmaQoS":{}`, "", []string{"rdmaQoS is set but names neither tos nor tc"}},
		{"rdmaQoS tos negative", `"rdmaQoS":{"tos":-1}`, "", []string{"rdmaQoS.tos -1 is out of range 0-255"}},
		{"rdmaQoS tos 256", `"rdmaQoS":{"tos":256}`, "", []string{"rdmaQoS.tos 256 is out of range 0-255"}},
		{"rdmaQoS tc negative", `"rdmaQoS":{"tc":-5}`, "", []string{"rdmaQoS.tc -5 is out of range 0-255"}},
		{"rdmaQoS tc 1000", `"rdmaQoS":{"tc":1000}`, "", []string{"rdmaQoS.tc 1000 is out of range 0-255"}},
		{"several at once", `"rdmaDevice":"a/b","stateDir":"rel","logLevel":"loud"`, "", []string{
			`rdmaDevice "a/b"`, `stateDir "rel" must be an absolute path`, `logLevel "loud"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdin := withFields(tt.fields)
			c, err := Parse([]byte(stdin), tt.cniArgs)
			if err == nil {
				t.Fatalf("Parse accepted %s (CNI_ARGS %q): %+v", stdin, tt.cniArgs, c)
			}
			if !strings.Contains(err.Error(), "invalid rdma-netns configuration") {
				t.Errorf("error %q lacks the invalid-configuration prefix", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseAcceptsBoundaries(t *testing.T) {
	tests := []struct{ name, fields string }{
		{"63-byte device name", `"rdmaDevice":"` + strings.Repeat("a", 63) + `"`},
		{"udev names", `"rdmaDevice":"rocep47s0f0","rdmaDevName":"rxe_eth1.2:x-y"`},
		{"128-byte device ID", `"deviceID":"` + strings.Repeat("b", 128) + `"`},
		{"aux device ID", `"deviceID":"mlx5_core.sf.4"`},
		{"qos bounds", `"rdmaQoS":{"tos":0,"tc":255}`},
		{"qos tos only", `"rdmaQoS":{"tos":255}`},
		{"qos tc only", `"rdmaQoS":{"tc":0}`},
		{"qos null", `"rdmaQoS":null`},
		{"log level upper case", `"logLevel":"WARN"`},
		{"log level warning", `"logLevel":"warning"`},
		{"log level error", `"logLevel":"error"`},
		{"log level info", `"logLevel":"info"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdin := `{"cniVersion":"1.0.0","name":"n","type":"rdma-netns",` + tt.fields + `}`
			if _, err := Parse([]byte(stdin), ""); err != nil {
				t.Fatalf("Parse(%s): %v", stdin, err)
			}
		})
	}
}

func TestParseRejectsOldCNIVersions(t *testing.T) {
	for _, v := range []string{"0.1.0", "0.2.0", "2.0.0", "1.1"} {
		t.Run(v, func(t *testing.T) {
			_, err := Parse([]byte(`{"cniVersion":"`+v+`","name":"n","type":"rdma-netns"}`), "")
			if err == nil {
				t.Fatalf("cniVersion %s accepted", v)
			}
			want := fmt.Sprintf("cniVersion %q is not supported", v)
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0") {
				t.Errorf("error %q should say %q and list the supported versions", err, want)
			}
		})
	}
}

// prevResults as a runtime of each version would send them: 0.3.x/0.4.0
// carry "version" on each IP, 1.x does not.
func prevResultFor(v string) string {
	ipVersion := `"version":"4",`
	ip6Version := `"version":"6",`
	if strings.HasPrefix(v, "1.") {
		ipVersion, ip6Version = "", ""
	}
	return `{
		"cniVersion": "` + v + `",
		"interfaces": [
			{"name": "eth0", "mac": "0a:58:0a:80:00:05", "sandbox": "/var/run/netns/cni-1234"},
			{"name": "net1", "mac": "0a:58:0a:80:00:06", "sandbox": "/var/run/netns/cni-1234"}
		],
		"ips": [
			{` + ipVersion + `"address": "10.128.0.5/23", "gateway": "10.128.0.1", "interface": 1},
			{` + ip6Version + `"address": "fd00::5/64", "interface": 1}
		],
		"routes": [{"dst": "0.0.0.0/0", "gw": "10.128.0.1"}],
		"dns": {"nameservers": ["10.0.0.10"]}
	}`
}

func TestParsePrevResultEachVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			stdin := `{"cniVersion":"` + v + `","name":"rdma-net","type":"rdma-netns","prevResult":` + prevResultFor(v) + `}`
			c, err := Parse([]byte(stdin), "")
			if err != nil {
				t.Fatal(err)
			}
			r := c.Result
			if r == nil {
				t.Fatal("Result is nil although a prevResult was sent")
			}
			if r.CNIVersion != current.ImplementedSpecVersion {
				t.Errorf("Result.CNIVersion = %q, want %q", r.CNIVersion, current.ImplementedSpecVersion)
			}
			if len(r.Interfaces) != 2 || r.Interfaces[1].Name != "net1" || r.Interfaces[1].Mac != "0a:58:0a:80:00:06" ||
				r.Interfaces[1].Sandbox != "/var/run/netns/cni-1234" || r.Interfaces[0].Name != "eth0" {
				b, _ := json.Marshal(r.Interfaces)
				t.Errorf("interfaces not preserved: %s", b)
			}
			if len(r.IPs) != 2 {
				t.Fatalf("got %d IPs, want 2", len(r.IPs))
			}
			if got := r.IPs[0].Address.String(); got != "10.128.0.5/23" {
				t.Errorf("IP[0] = %s", got)
			}
			if !r.IPs[0].Gateway.Equal(net.ParseIP("10.128.0.1")) {
				t.Errorf("IP[0] gateway = %v", r.IPs[0].Gateway)
			}
			if got := r.IPs[1].Address.String(); got != "fd00::5/64" {
				t.Errorf("IP[1] = %s", got)
			}
			for i, ip := range r.IPs {
				if ip.Interface == nil || *ip.Interface != 1 {
					t.Errorf("IP[%d].Interface = %v, want 1", i, ip.Interface)
				}
			}
			if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" {
				t.Errorf("routes not preserved: %+v", r.Routes)
			}
			if len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "10.0.0.10" {
				t.Errorf("dns not preserved: %+v", r.DNS)
			}
		})
	}
}

func TestParsePrevResultErrors(t *testing.T) {
	tests := []struct{ name, stdin, want string }{
		{"bad IP", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"not-an-ip"}]}}`, "could not parse prevResult"},
		{"prevResult not an object", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":[1,2]}`, "could not parse prevResult"},
		{"prevResult of an older version", `{"cniVersion":"1.0.0","name":"n","type":"t","prevResult":` + prevResultFor("0.4.0") + `}`, "could not parse prevResult"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.stdin), "")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// ADD refuses a configuration over MaxConfigSize and says how much of it
// the pod's cni-args are; parsing takes any size, so that the other verbs
// never fail on what a pod wrote.
func TestCheckSize(t *testing.T) {
	args := `{"cni":{"note":"` + strings.Repeat("x", 1000) + `"}}`
	base := `{"cniVersion":"1.0.0","name":"n","type":"rdma-netns","args":` + args + `}`
	big := base + strings.Repeat(" ", MaxConfigSize+1-len(base))
	conf, err := ParseSettings([]byte(big), "")
	if err != nil {
		t.Fatalf("parse of %d bytes: %v", len(big), err)
	}
	err = conf.CheckSize(len(big))
	want := fmt.Sprintf("network configuration is %d bytes, more than the %d this plugin accepts; the pod's cni-args (args) are %d bytes of it", len(big), MaxConfigSize, len(args))
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if err := conf.CheckSize(MaxConfigSize); err != nil {
		t.Fatalf("a config of exactly MaxConfigSize bytes refused: %v", err)
	}
}

// A bad value is quoted whole up to maxQuoted bytes, then cut with its
// size said: errors become pod events and log lines.
func TestQuoteBounds(t *testing.T) {
	if got := Quote("a/b"); got != `"a/b"` {
		t.Errorf("Quote(a/b) = %s", got)
	}
	long := strings.Repeat("<", 200000)
	got := Quote(long)
	if len(got) > maxQuoted+40 || !strings.HasSuffix(got, "... (200000 bytes)") {
		t.Errorf("Quote of 200000 bytes = %.200s (%d bytes)", got, len(got))
	}
	_, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns","rdmaDevName":"`+strings.Repeat("r", 5000)+`"}`), "")
	if err == nil || len(err.Error()) > 400 || !strings.Contains(err.Error(), "(5000 bytes)") {
		t.Errorf("error for a 5000-byte rdmaDevName: %.500v", err)
	}
}

func TestParseInvalidJSON(t *testing.T) {
	for _, s := range []string{``, `{`, `{"cniVersion":1}`, `{"rdmaQoS":{"tos":"high"}}`, `{"allowSharedMode":"yes"}`, `[]`} {
		_, err := Parse([]byte(s), "")
		if err == nil || !strings.Contains(err.Error(), "failed to parse network configuration") {
			t.Errorf("Parse(%q) err = %v, want a parse error", s, err)
		}
	}
}

func TestParseCNIArgs(t *testing.T) {
	tests := []struct {
		in      string
		want    PerPodArgs
		wantErr string
	}{
		{"", PerPodArgs{}, ""},
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u", PerPodArgs{}, ""},
		{"K8S_POD_NAME=p;rdmaDevice=mlx5_3", PerPodArgs{RdmaDevice: "mlx5_3"}, ""},
		{"rdmaDevName=rdma0;rdmaDevice=mlx5_3;", PerPodArgs{RdmaDevice: "mlx5_3", RdmaDevName: "rdma0"}, ""},
		{";;rdmaDevice=mlx5_3;;", PerPodArgs{RdmaDevice: "mlx5_3"}, ""},
		{"rdmaDevice=", PerPodArgs{}, ""},
		{"K8S_POD_NAME=p;garbage", PerPodArgs{}, `CNI_ARGS entry "garbage" is not KEY=VALUE`},
		{"rdmaDevice", PerPodArgs{}, `CNI_ARGS entry "rdmaDevice" is not KEY=VALUE`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			// A malformed CNI_ARGS fails ADD (PodRequest), never the
			// parse that DEL shares.
			c, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns"}`), tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.PodRequest(); tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("PodRequest err = %v, want %q", err, tt.wantErr)
				}
				return
			} else if err != nil {
				t.Fatal(err)
			}
			if c.CNIArgs != tt.want {
				t.Errorf("CNIArgs = %+v, want %+v", c.CNIArgs, tt.want)
			}
		})
	}
}

// What the pod asked for, from every per-pod source, none of it mixed with
// the network's own settings.
func TestPodRequest(t *testing.T) {
	c, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns","rdmaDevice":"c0","rdmaDevName":"n0",
		"deviceID":"0000:01:00.2","runtimeConfig":{"deviceID":"0000:01:00.1"},
		"args":{"cni":{"rdmaDevice":"a0","rdmaDevName":"an","other-plugin":{"x":[1]}}}}`), "K8S_POD_NAME=p;rdmaDevice=e0;rdmaDevName=an")
	if err != nil {
		t.Fatal(err)
	}
	req, err := c.PodRequest()
	if err != nil {
		t.Fatal(err)
	}
	want := PodRequest{
		Devices:   []Source{{"e0", "CNI_ARGS rdmaDevice"}, {"a0", "args.cni.rdmaDevice"}},
		DeviceIDs: []Source{{"0000:01:00.1", "runtimeConfig.deviceID"}},
		DevName:   Source{"an", "CNI_ARGS rdmaDevName"},
	}
	if !reflect.DeepEqual(req, want) {
		t.Errorf("PodRequest = %+v, want %+v", req, want)
	}
	if got := c.NetworkDevice(); got != (Source{"c0", "rdmaDevice"}) {
		t.Errorf("NetworkDevice = %+v", got)
	}
	if got := c.NetworkDeviceID(); got != (Source{"0000:01:00.2", "deviceID"}) {
		t.Errorf("NetworkDeviceID = %+v", got)
	}
}

// Per-pod values ADD refuses; the parse DEL shares accepts them all.
func TestPodRequestErrors(t *testing.T) {
	long64 := strings.Repeat("a", 64)
	tests := []struct {
		name, fields, cniArgs string
		want                  []string
	}{
		{"args.cni.rdmaDevice slash", `"args":{"cni":{"rdmaDevice":"a/b"}}`, "", []string{`args.cni.rdmaDevice "a/b" is not a valid RDMA device name`}},
		{"CNI_ARGS rdmaDevice dotdot", "", "rdmaDevice=..", []string{`CNI_ARGS rdmaDevice ".." is not a valid RDMA device name`}},
		{"args.cni.rdmaDevName too long", `"args":{"cni":{"rdmaDevName":"` + long64 + `"}}`, "", []string{`args.cni.rdmaDevName "` + long64 + `" is not a valid RDMA device name`}},
		{"args.cni.rdmaDevName number", `"args":{"cni":{"rdmaDevName":5}}`, "", []string{`args.cni.rdmaDevName 5 is not a string`}},
		{"args.cni.rdmaDevice object", `"args":{"cni":{"rdmaDevice":{"a":1}}}`, "", []string{`args.cni.rdmaDevice {"a":1} is not a string`}},
		{"args.cni a string", `"args":{"cni":"x"}`, "", []string{"args.cni"}},
		{"CNI_ARGS rdmaDevName slash", "", "rdmaDevName=/x", []string{`CNI_ARGS rdmaDevName "/x" is not a valid RDMA device name`}},
		{"two names", `"args":{"cni":{"rdmaDevName":"b"}}`, "rdmaDevName=a", []string{`CNI_ARGS rdmaDevName "a" and args.cni.rdmaDevName "b" ask for different names`}},
		{"runtimeConfig.deviceID slash", `"runtimeConfig":{"deviceID":"/sys/bus/pci"}`, "", []string{`runtimeConfig.deviceID "/sys/bus/pci" is not a PCI address or auxiliary device name`}},
		{"K8S_POD_NAME", "", "K8S_POD_NAME=Upper", []string{`CNI_ARGS K8S_POD_NAME "Upper" is not a Kubernetes name`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdin := withFields(tt.fields)
			c, err := ParseSettings([]byte(stdin), tt.cniArgs)
			if err != nil {
				t.Fatalf("ParseSettings (DEL's parse) refused it: %v", err)
			}
			_, err = c.PodRequest()
			if err == nil {
				t.Fatalf("PodRequest accepted %s (CNI_ARGS %q)", stdin, tt.cniArgs)
			}
			for _, w := range append(tt.want, "nothing was changed") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// A device plugin's allocation reaches the plugin in deviceID, pciBusID and
// runtimeConfig.deviceID alike (Multus); a runtimeConfig.deviceID the
// configuration does not hold is the pod's own.
func TestNetworkDeviceID(t *testing.T) {
	tests := []struct {
		fields  string
		want    Source
		podAsks bool
	}{
		{`"runtimeConfig":{"deviceID":"0000:01:00.1"},"deviceID":"0000:01:00.1","pciBusID":"0000:01:00.1"`, Source{"0000:01:00.1", "runtimeConfig.deviceID"}, false},
		{`"runtimeConfig":{"deviceID":"0000:01:00.1"},"deviceID":"0000:01:00.2","pciBusID":"0000:01:00.3"`, Source{"0000:01:00.2", "deviceID"}, true},
		{`"deviceID":"0000:01:00.2","pciBusID":"0000:01:00.3"`, Source{"0000:01:00.2", "deviceID"}, false},
		{`"pciBusID":"0000:01:00.3"`, Source{"0000:01:00.3", "pciBusID"}, false},
		{`"runtimeConfig":{"deviceID":"mlx5_core.sf.2"}`, Source{}, true},
		{`"runtimeConfig":{"deviceID":""},"deviceID":"0000:01:00.2"`, Source{"0000:01:00.2", "deviceID"}, false},
		{`"runtimeConfig":{}`, Source{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.fields, func(t *testing.T) {
			c, err := Parse([]byte(`{"cniVersion":"1.0.0","name":"n","type":"t",`+tt.fields+`}`), "")
			if err != nil {
				t.Fatal(err)
			}
			if got := c.NetworkDeviceID(); got != tt.want {
				t.Errorf("NetworkDeviceID = %+v, want %+v", got, tt.want)
			}
			req, err := c.PodRequest()
			if err != nil {
				t.Fatal(err)
			}
			if got := len(req.DeviceIDs) > 0; got != tt.podAsks {
				t.Errorf("pod's deviceID = %+v, want one: %v", req.DeviceIDs, tt.podAsks)
			}
		})
	}
}

// DEL, GC and STATUS never read prevResult: a result that cannot be
// converted must not fail them, while ADD still refuses it.
func TestParseSettingsLeavesPrevResultAlone(t *testing.T) {
	stdin := []byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"not-an-ip"}]}}`)
	if _, err := Parse(stdin, ""); err == nil {
		t.Fatal("Parse accepted a prevResult with an invalid address")
	}
	conf, err := ParseSettings(stdin, "")
	if err != nil {
		t.Fatalf("ParseSettings: %v", err)
	}
	if conf.Result != nil || conf.Name != "n" {
		t.Errorf("ParseSettings gave Result %v, name %q; want no Result, name n", conf.Result, conf.Name)
	}
	// Not even a JSON object: ADD says so, DEL does not care.
	stdin = []byte(`{"cniVersion":"1.0.0","name":"n","type":"rdma-netns","prevResult":"oops"}`)
	if _, err := Parse(stdin, ""); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("Parse of a string prevResult: %v", err)
	}
	if _, err := ParseSettings(stdin, ""); err != nil {
		t.Errorf("ParseSettings of a string prevResult: %v", err)
	}
}

// ADD's output is prevResult in the configuration's version, as the CNI
// library's own parse-convert-print gives it, for every supported version,
// for a result that leaves its version out, and for one in an older version.
func TestPrintResultAsTheCNILibrary(t *testing.T) {
	type tc struct{ name, confVersion, prev string }
	var cases []tc
	for _, v := range SupportedVersions {
		cases = append(cases, tc{v, v, prevResultFor(v)})
	}
	noVersion := strings.Replace(prevResultFor("0.4.0"), `"cniVersion": "0.4.0",`, "", 1)
	cases = append(cases, tc{"no version", "0.4.0", noVersion}, tc{"1.0.0 result, 1.1.0 config", "1.1.0", prevResultFor("1.0.0")})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdin := []byte(`{"cniVersion":"` + c.confVersion + `","name":"rdma-net","type":"rdma-netns","prevResult":` + c.prev + `}`)
			conf, err := Parse(stdin, "")
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := conf.PrintResult(&got); err != nil {
				t.Fatal(err)
			}

			var lib types.PluginConf
			if err := json.Unmarshal(stdin, &lib); err != nil {
				t.Fatal(err)
			}
			if err := version.ParsePrevResult(&lib); err != nil {
				t.Fatal(err)
			}
			res, err := current.NewResultFromResult(lib.PrevResult)
			if err != nil {
				t.Fatal(err)
			}
			out, err := res.GetAsVersion(c.confVersion)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := out.PrintTo(&want); err != nil {
				t.Fatal(err)
			}

			// Compared as a runtime reads them: parsed in the config's version.
			g, err := create.Create(c.confVersion, got.Bytes())
			if err != nil {
				t.Fatalf("output %s does not parse as a %s result: %v", got.Bytes(), c.confVersion, err)
			}
			w, err := create.Create(c.confVersion, want.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g, w) {
				t.Fatalf("output %s\nthe CNI library prints %s", got.Bytes(), want.Bytes())
			}
		})
	}
}

// A previous plugin's fields the CNI types do not know survive rdma-netns.
func TestPrintResultKeepsUnknownFields(t *testing.T) {
	stdin := `{"cniVersion":"1.1.0","name":"n","type":"rdma-netns","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"net1","sandbox":"/x","pciID":"0000:3b:00.2"}]}}`
	conf, err := Parse([]byte(stdin), "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := conf.PrintResult(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"pciID":"0000:3b:00.2"`) {
		t.Fatalf("output %s lost the interface's pciID", out.String())
	}
}

// The "dra" object is checked like the other keys the network sets; the
// pod's draRequest and draIndex count only where the network leaves
// request or index unset, and are read by ADD alone.
func TestDRAConfig(t *testing.T) {
	c, err := Parse([]byte(withFields(`"dra":{"request":"nics/fast","index":2,"recordDir":"/run/dra"},"ipam":{"type":"static"}`)), "K8S_POD_UID=abc-1")
	if err != nil {
		t.Fatal(err)
	}
	if c.DRA.Request != "nics/fast" || *c.DRA.Index != 2 || c.DRA.RecordDir != "/run/dra" || string(c.IPAM) != `{"type":"static"}` || c.Pod.UID != "abc-1" {
		t.Fatalf("parsed %+v %+v ipam %s", c.DRA, c.Pod, c.IPAM)
	}
	for _, tt := range []struct{ fields, want string }{
		{`"dra":{"request":"Nics"}`, `dra.request "Nics" is not a request name`},
		{`"dra":{"request":"a/b/c"}`, `dra.request "a/b/c"`},
		{`"dra":{"request":"../x"}`, `dra.request "../x"`},
		{`"dra":{"index":-1}`, "dra.index -1 is out of range 0-1023"},
		{`"dra":{"index":1024}`, "dra.index 1024 is out of range"},
	} {
		if _, err := Parse([]byte(withFields(tt.fields)), ""); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.fields, err, tt.want)
		}
	}
	// Whatever a NAD's recordDir says, the network parses, so DEL and
	// CHECK run on it: the records are read from the node's directory
	// alone, and ADD refuses a NAD that names another.
	for dir, foreign := range map[string]bool{`rel`: true, `/tmp/x`: true, `a\u0000b`: true, `/var/lib/cni/rdma-netns-dra/../x`: true,
		`/var/lib/cni/rdma-netns-dra`: false, `/var/lib/cni//rdma-netns-dra/`: false, ``: false} {
		fields := `"dra":{"recordDir":"` + dir + `"}`
		for name, parse := range map[string]func([]byte, string) (*NetConf, error){"Parse": Parse, "ParseSettings": ParseSettings} {
			c, err := parse([]byte(withFields(fields)), "")
			if err != nil || c.DRA == nil || c.DRA.ForeignRecordDir() != foreign {
				t.Errorf("%s: %s = %+v, %v; want it parsed, ForeignRecordDir %v", fields, name, c, err, foreign)
			}
		}
	}

	for _, tt := range []struct {
		dra, args string
		req       string
		index     int
		err       string
	}{
		{`{}`, ``, "", 0, ""},
		{`{"request":"nics","index":1}`, ``, "nics", 1, ""},
		{`{}`, `{"draRequest":"nics","draIndex":3}`, "nics", 3, ""},
		{`{"request":"nics"}`, `{"draIndex":3}`, "nics", 3, ""},
		{`{"index":0}`, `{"draRequest":"gpu-nic/a"}`, "gpu-nic/a", 0, ""},
		{`{"request":"nics","index":1}`, `{"draRequest":"nics","draIndex":1}`, "nics", 1, ""},
		{`{"request":"nics"}`, `{"draRequest":"other"}`, "", 0, `args.cni.draRequest "other": this network attaches a NIC of request "nics"`},
		{`{"index":0}`, `{"draIndex":1}`, "", 0, "args.cni.draIndex 1: this network attaches the NIC at index 0"},
		{`{}`, `{"draIndex":1.5}`, "", 0, "args.cni.draIndex 1.5 is not a whole number from 0 to 1023"},
		{`{}`, `{"draIndex":-1}`, "", 0, "args.cni.draIndex -1 is not a whole number"},
		{`{}`, `{"draIndex":"1"}`, "", 0, `args.cni.draIndex "1" is not a whole number`},
		{`{}`, `{"draIndex":1e3}`, "", 0, "args.cni.draIndex 1e3"},
		{`{}`, `{"draRequest":7}`, "", 0, "args.cni.draRequest 7 is not a string"},
		{`{}`, `{"draRequest":"` + strings.Repeat("x", 300) + `"}`, "", 0, "... (300 bytes) is not a request name"},
	} {
		fields := `"dra":` + tt.dra
		if tt.args != "" {
			fields += `,"args":{"cni":` + tt.args + `}`
		}
		c, err := Parse([]byte(withFields(fields)), "")
		if err != nil {
			t.Fatalf("%s: Parse: %v (a pod's args must not fail the parse, which DEL shares)", fields, err)
		}
		req, index, err := c.DRAPick()
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "the pod's own settings were refused") {
				t.Errorf("%s: DRAPick = %q %d %v, want error %q", fields, req, index, err, tt.err)
			}
			continue
		}
		if err != nil || req != tt.req || index != tt.index {
			t.Errorf("%s: DRAPick = %q %d %v, want %q %d", fields, req, index, err, tt.req, tt.index)
		}
	}
}

// The device a dra network pins is named by the claim in the log and in
// errors, over a pod's runtimeConfig.deviceID of the same address.
func TestPinDRA(t *testing.T) {
	c, err := Parse([]byte(withFields(`"dra":{},"runtimeConfig":{"deviceID":"0000:00:05.0"}`)), "")
	if err != nil {
		t.Fatal(err)
	}
	c.PinDRA("0000:00:05.0", "the pod's claim")
	if got := c.NetworkDeviceID(); got != (Source{"0000:00:05.0", "the pod's claim"}) {
		t.Fatalf("NetworkDeviceID = %+v", got)
	}
}

// A network's stateDir is foreign unless it names the node's directory,
// however spelled.
func TestForeignStateDir(t *testing.T) {
	for dir, want := range map[string]bool{
		"":                            false,
		DefaultStateDir:               false,
		DefaultStateDir + "/":         false,
		DefaultStateDir + "/./":       false,
		"/etc/cron.d":                 true,
		DefaultStateDir + "/sub":      true,
		DefaultStateDir + "/../x":     true,
		"/var/lib/cni/rdma-netns-dra": true,
	} {
		c := &NetConf{StateDir: dir}
		if got := c.ForeignStateDir(); got != want {
			t.Errorf("stateDir %q: foreign %v, want %v", dir, got, want)
		}
	}
}
