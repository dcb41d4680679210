package doctor

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestParseUCXEnv(t *testing.T) {
	env := func(kv ...string) []byte { return []byte(strings.Join(kv, "\x00") + "\x00") }
	if u := parseUCXEnv(env("PATH=/bin", "NCCL_IB_HCA==mlx5_0", "SECRET=x")); u != nil {
		t.Errorf("no UCX variable: %+v, want nil", u)
	}
	u := parseUCXEnv(env("HOME=/", "UCX_TLS=rc", "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1", "UCX_MAX_EAGER_RAILS=2", "UCX_MAX_RNDV_RAILS=", "UCX_"))
	if u == nil || *u != (UCXEnv{NetDevices: "mlx5_0:1,mlx5_1:1", MaxEagerRails: "2"}) {
		t.Errorf("parseUCXEnv = %+v", u)
	}
	// Any UCX variable says the process uses UCX, even without these.
	if u := parseUCXEnv(env("UCX_TLS=ud_verbs")); u == nil || *u != (UCXEnv{}) {
		t.Errorf("UCX_TLS alone: %+v", u)
	}
}

func TestUCXFinding(t *testing.T) {
	rails := func(names ...string) []Device {
		var ds []Device
		for _, n := range names {
			ds = append(ds, Device{Name: n, Ports: []Port{{Port: 1}}})
		}
		return ds
	}
	four := rails("rdma_r0", "rdma_r1", "rdma_s0", "rdma_s1")
	for _, c := range []struct {
		name string
		ucx  *UCXEnv
		devs []Device
		want Severity // "" for no finding
		in   string
	}{
		{"no UCX", nil, four, "", ""},
		{"defaults over four listed", &UCXEnv{NetDevices: "rdma_r0:1,rdma_r1:1,rdma_s0:1,rdma_s1:1"}, four, Warn, "UCX is given 4 rails"},
		{"unset devices: every rail, defaults", &UCXEnv{}, four, Warn, "eager messages on at most 1 (UCX_MAX_EAGER_RAILS unset: UCX's default) and rendezvous on at most 2"},
		{"all, raised", &UCXEnv{NetDevices: "all", MaxEagerRails: "4", MaxRndvRails: "4"}, four, OK, "all 4 rails"},
		{"listed, raised", &UCXEnv{NetDevices: "rdma_r0:1,rdma_r1:1", MaxEagerRails: "2", MaxRndvRails: "2"}, four, OK, "all 2 rails (rdma_r0:1 rdma_r1:1)"},
		{"eager raised, rndv default", &UCXEnv{NetDevices: "rdma_r0:1,rdma_r1:1,rdma_s0:1", MaxEagerRails: "3"}, four, Warn, "sends rendezvous on at most 2 (UCX_MAX_RNDV_RAILS unset"},
		{"one rail listed", &UCXEnv{NetDevices: "rdma_r0:1"}, four, "", ""},
		{"one device in the pod", &UCXEnv{}, rails("mlx5_0"), "", ""},
		{"a netdev and a device not the pod's", &UCXEnv{NetDevices: "eth0,rdma_r0:1,mlx5_9:1"}, four, "", ""},
		{"malformed count: the default", &UCXEnv{NetDevices: "rdma_r0:1,rdma_r1:1", MaxEagerRails: "two", MaxRndvRails: "2"}, four, Warn, `eager messages on at most 1 (UCX_MAX_EAGER_RAILS "two")`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Report{}
			ucxFinding(&r.Findings, "pid 7 (python)", Process{PID: 7, Comm: "python", UCX: c.ucx}, c.devs)
			if c.want == "" {
				if len(r.Findings) != 0 {
					t.Fatalf("findings %+v, want none", r.Findings)
				}
				return
			}
			if len(r.Findings) != 1 {
				t.Fatalf("findings %+v, want one", r.Findings)
			}
			f := r.Findings[0]
			if f.Check != "rail-ucx" || f.Severity != c.want || !strings.Contains(f.Reason, c.in) {
				t.Errorf("%s %s: %s, want %s with %q", f.Severity, f.Check, f.Reason, c.want, c.in)
			}
			if c.want == Warn && !strings.Contains(f.Remedy, "UCX_MAX_EAGER_RAILS=") {
				t.Errorf("fix %q names no rail count", f.Remedy)
			}
		})
	}
}

// The pod report reads a process's UCX variables from /proc/PID/environ.
func TestProcInspectUCX(t *testing.T) {
	fp := newFakeProc(t)
	fp.proc("41", "python", "pod", "unlimited", "00000000a80425fb", 1<<30)
	fp.proc("42", "sleep", "pod", "unlimited", "00000000a80425fb", 1<<30)
	write(t, filepath.Join(fp.root, "41", "environ"), "PATH=/bin\x00UCX_NET_DEVICES=rdma_r0:1,rdma_r1:1\x00UCX_MAX_RNDV_RAILS=2\x00")
	write(t, filepath.Join(fp.root, "42", "environ"), "PATH=/bin\x00")
	if u := fp.Proc().Inspect(41).UCX; u == nil || *u != (UCXEnv{NetDevices: "rdma_r0:1,rdma_r1:1", MaxRndvRails: "2"}) {
		t.Errorf("Inspect(41).UCX = %+v", u)
	}
	if u := fp.Proc().Inspect(42).UCX; u != nil {
		t.Errorf("Inspect(42).UCX = %+v, want nil", u)
	}
}
