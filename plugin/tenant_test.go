package plugin

import (
	"strings"
	"testing"
)

// What a pod writes (cni-args, which Multus passes as args.cni; CNI_ARGS; a
// deviceID in its network-selection element, which Multus passes as
// runtimeConfig.deviceID) may narrow what the network allows, never widen
// it: each of these is refused and leaves every device where it was.
func TestPodMayNotWiden(t *testing.T) {
	argsCNI := func(kv map[string]any) map[string]any { return map[string]any{"args": map[string]any{"cni": kv}} }
	cases := []struct {
		name    string
		extra   map[string]any
		cniArgs string
		want    []string
	}{
		{name: "args.cni rdmaDevice of another NIC", extra: argsCNI(map[string]any{"rdmaDevice": "rxe2"}),
			want: []string{`args.cni.rdmaDevice "rxe2" refused`, "gives the attachment RDMA device rxe1", "allowedPodDevices"}},
		{name: "CNI_ARGS rdmaDevice of another NIC", cniArgs: "IgnoreUnknown=1;rdmaDevice=mlx5_0",
			want: []string{`CNI_ARGS rdmaDevice "mlx5_0" refused`, "allowedPodDevices"}},
		{name: "rdmaDevice over the network's own", extra: map[string]any{"rdmaDevice": "rxe1"}, cniArgs: "rdmaDevice=rxe2",
			want: []string{`CNI_ARGS rdmaDevice "rxe2" refused`, "rxe1 (rdmaDevice)"}},
		{name: "deviceID of another NIC", extra: map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}},
			want: []string{`runtimeConfig.deviceID "0000:3b:00.0" refused`, "lists no allowedPodDevices", "may have chosen the NIC itself"}},
		{name: "deviceID of the netdev's own NIC, without allowedPodDevices", extra: map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:00:04.0"}},
			want: []string{`runtimeConfig.deviceID "0000:00:04.0" refused`, "lists no allowedPodDevices"}},
		{name: "deviceID of another NIC than the network's rdmaDevice", extra: map[string]any{"rdmaDevice": "rxe1", "runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}},
			want: []string{`runtimeConfig.deviceID "0000:3b:00.0" refused`, "gives the attachment RDMA device rxe1"}},
		{name: "deviceID over the network's deviceID", extra: map[string]any{"deviceID": "0000:00:04.0", "runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}},
			want: []string{`runtimeConfig.deviceID "0000:3b:00.0" refused`}},
		{name: "deviceID of no device", extra: map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:99:00.0"}},
			want: []string{`runtimeConfig.deviceID "0000:99:00.0" refused`}},
		{name: "pick outside allowedPodDevices", extra: map[string]any{"allowedPodDevices": []string{"rxe1", "rxe2"}, "args": map[string]any{"cni": map[string]any{"rdmaDevice": "mlx5_0"}}},
			want: []string{`args.cni.rdmaDevice "mlx5_0" refused`, "allowedPodDevices are rxe1, rxe2"}},
		{name: "deviceID outside allowedPodDevices", extra: map[string]any{"allowedPodDevices": []string{"rxe1", "rxe2"}, "runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}},
			want: []string{`runtimeConfig.deviceID "0000:3b:00.0" refused`, "allowedPodDevices are rxe1, rxe2"}},
		{name: "two picks that disagree", extra: map[string]any{"allowedPodDevices": []string{"rxe1", "rxe2"}, "args": map[string]any{"cni": map[string]any{"rdmaDevice": "rxe2"}}}, cniArgs: "rdmaDevice=rxe1",
			want: []string{"refused", "another setting of the pod names RDMA device rxe1"}},
		{name: "rdmaDevName without podRdmaDevNamePrefix", extra: argsCNI(map[string]any{"rdmaDevName": "rdma_job0"}),
			want: []string{`args.cni.rdmaDevName "rdma_job0" refused`, "sets no podRdmaDevNamePrefix"}},
		{name: "rdmaDevName over the network's", extra: map[string]any{"rdmaDevName": "roce0"}, cniArgs: "rdmaDevName=rdma_job0",
			want: []string{`CNI_ARGS rdmaDevName "rdma_job0" refused`, "podRdmaDevNamePrefix"}},
		{name: "rdmaDevName without the prefix", extra: map[string]any{"podRdmaDevNamePrefix": "t1_", "args": map[string]any{"cni": map[string]any{"rdmaDevName": "rdma_job0"}}},
			want: []string{`args.cni.rdmaDevName "rdma_job0" refused`, `must start with "t1_"`}},
		{name: "rdmaDevName that is the prefix", extra: map[string]any{"podRdmaDevNamePrefix": "t1_", "args": map[string]any{"cni": map[string]any{"rdmaDevName": "t1_"}}},
			want: []string{`args.cni.rdmaDevName "t1_" refused`}},
		{name: "rdmaDevName with a slash", extra: argsCNI(map[string]any{"rdmaDevName": "a/b"}),
			want: []string{`args.cni.rdmaDevName "a/b" is not a valid RDMA device name`, "nothing was changed"}},
		{name: "rdmaDevName a number", extra: argsCNI(map[string]any{"rdmaDevName": 5}),
			want: []string{"args.cni.rdmaDevName 5 is not a string", "nothing was changed"}},
		{name: "rdmaDevName of 70 characters", extra: argsCNI(map[string]any{"rdmaDevName": strings.Repeat("r", 70)}),
			want: []string{`args.cni.rdmaDevName "` + strings.Repeat("r", 70) + `" is not a valid RDMA device name`, "at most 63"}},
		{name: "args.cni not an object", extra: map[string]any{"args": map[string]any{"cni": "rdmaDevice=rxe2"}},
			want: []string{"args.cni", "nothing was changed"}},
		{name: "malformed CNI_ARGS", cniArgs: "K8S_POD_NAME=p;garbage",
			want: []string{`CNI_ARGS entry "garbage" is not KEY=VALUE`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			before := e.kernel.snapshot()
			_, err := e.add(p, e.netconf(p, "1.1.0", tc.extra), tc.cniArgs)
			wantErr(t, err, append(tc.want, "nothing was changed")...)
			if after := e.kernel.snapshot(); after != before {
				t.Fatalf("devices changed: %s -> %s", before, after)
			}
			if recs := e.records(); len(recs) != 0 {
				t.Fatalf("records left: %+v", recs)
			}
		})
	}
}

// What the network allows, a pod may choose, and a pod's choice that names
// the network's own device is no choice at all.
func TestPodMayNarrow(t *testing.T) {
	cases := []struct {
		name     string
		extra    map[string]any
		cniArgs  string
		want     string // the device that moves
		wantName string // its name in the pod, "" for the host name
	}{
		{name: "args.cni naming the netdev's own device", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevice": "rxe1"}}}, want: "rxe1"},
		{name: "deviceID naming the network's own device", extra: map[string]any{"rdmaDevice": "rxe1", "runtimeConfig": map[string]any{"deviceID": "0000:00:04.0"}}, want: "rxe1"},
		{name: "pick from allowedPodDevices", extra: map[string]any{"allowedPodDevices": []string{"rxe1", "rxe2"}, "args": map[string]any{"cni": map[string]any{"rdmaDevice": "rxe2"}}}, want: "rxe2"},
		{name: "deviceID from allowedPodDevices", extra: map[string]any{"allowedPodDevices": []string{"rxe2", "mlx5_0"}, "runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}}, want: "mlx5_0"},
		{name: "allowedPodDevices and no pick: the netdev's", extra: map[string]any{"allowedPodDevices": []string{"rxe2"}}, want: "rxe1"},
		{name: "rdmaDevName with the prefix", extra: map[string]any{"podRdmaDevNamePrefix": "t1_", "args": map[string]any{"cni": map[string]any{"rdmaDevName": "t1_hca0"}}}, want: "rxe1", wantName: "t1_hca0"},
		{name: "rdmaDevName equal to the network's", extra: map[string]any{"rdmaDevName": "roce0"}, cniArgs: "rdmaDevName=roce0", want: "rxe1", wantName: "roce0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			conf := e.netconf(p, "1.1.0", tc.extra)
			if _, err := e.add(p, conf, tc.cniArgs); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			inPod := tc.want
			if tc.wantName != "" {
				inPod = tc.wantName
			}
			e.wantWhere(inPod, p.path())
			if err := e.del(p, conf); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.wantWhere(tc.want, "host")
		})
	}
}

// DEL, CHECK and GC act on what the records say was moved: a per-pod value
// that ADD would refuse, or cannot even read, never fails them, so the
// chain's DEL goes on to return the NIC (host-device runs after us).
func TestPodInputNeverFailsDel(t *testing.T) {
	bad := []struct {
		name    string
		extra   map[string]any
		cniArgs string
	}{
		{name: "rdmaDevName with a slash", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevName": "a/b"}}}},
		{name: "rdmaDevName a number", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevName": 5}}}},
		{name: "rdmaDevName of 70 characters", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevName": strings.Repeat("r", 70)}}}},
		{name: "rdmaDevice an object", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"rdmaDevice": map[string]any{"x": 1}}}}},
		{name: "args.cni a list", extra: map[string]any{"args": map[string]any{"cni": []int{1}}}},
		{name: "deviceID with a slash", extra: map[string]any{"runtimeConfig": map[string]any{"deviceID": "../../etc"}}},
		{name: "another device in CNI_ARGS", cniArgs: "rdmaDevice=rxe2;rdmaDevName=x/y"},
		{name: "malformed CNI_ARGS", cniArgs: "K8S_POD_NAME=Not_A_Name;garbage"},
	}
	for _, tc := range bad {
		t.Run(tc.name+"/attached", func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			good := e.netconf(p, "1.1.0", nil)
			if _, err := e.add(p, good, ""); err != nil {
				t.Fatal(err)
			}
			conf := e.netconf(p, "1.1.0", tc.extra)
			a := e.args(p, conf, tc.cniArgs)
			if err := e.plugin.Check(a); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if err := e.plugin.Del(a); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.wantWhere("rxe1", "host")
			if recs := e.records(); len(recs) != 0 {
				t.Fatalf("records left: %+v", recs)
			}
		})
		t.Run(tc.name+"/refused ADD", func(t *testing.T) {
			e := newEnv(t)
			p := e.newPod("c1", "net1", "virtio", "virtio1")
			conf := e.netconf(p, "1.1.0", tc.extra)
			if _, err := e.add(p, conf, tc.cniArgs); err == nil {
				t.Fatal("ADD accepted it")
			}
			a := e.args(p, conf, tc.cniArgs)
			for i := 0; i < 2; i++ {
				if err := e.plugin.Del(a); err != nil {
					t.Fatalf("DEL %d after the refused ADD: %v", i, err)
				}
			}
			e.deleteNetns(p)
			if err := e.plugin.Del(a); err != nil {
				t.Fatalf("DEL without netns: %v", err)
			}
			gc := e.netconf(p, "1.1.0", tc.extra)
			if err := e.plugin.GC(e.args(p, gc, tc.cniArgs)); err != nil {
				t.Fatalf("GC: %v", err)
			}
			e.wantWhere("rxe1", "host")
		})
	}
}

// A device another pod holds is "held by", whichever way the network gets
// to it: never replaced by a farther device under the same function (the
// sub-function's mlx5_2 under the PF whose mlx5_0 another pod has).
func TestHeldDeviceIsNotReplacedByAChildFunction(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string]any
	}{
		{"deviceID", map[string]any{"deviceID": "0000:3b:00.0"}},
		{"pod's deviceID", map[string]any{"runtimeConfig": map[string]any{"deviceID": "0000:3b:00.0"}, "allowedPodDevices": []string{"mlx5_0", "mlx5_2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			a := e.newPod("pod-a", "net1", "pci", "0000:3b:00.0")
			if _, err := e.add(a, e.netconf(a, "1.1.0", map[string]any{"deviceID": "0000:3b:00.0"}), "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=a"); err != nil {
				t.Fatal(err)
			}
			e.wantWhere("mlx5_0", a.path())
			b := e.newPod("pod-b", "net1", "pci", "0000:3b:00.0")
			_, err := e.add(b, e.netconf(b, "1.1.0", tc.extra), "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=b")
			wantErr(t, err, "mlx5_0", "held by pod ml/a", "nothing was changed")
			e.wantWhere("mlx5_2", "host")
		})
	}
}
