package plugin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/install"
)

// inProcessSelf runs the plugin's own verbs for a "claims" entry in this
// process, on the same fake node: the NIC's dra-mode ADD and DEL as the
// executed binary would run them, host-device (the fake delegate) naming
// the link after the call's CNI_IFNAME.
type inProcessSelf struct {
	e *env
	d *fakeDelegate
}

func (s inProcessSelf) plugin(ifName string) *Plugin {
	inner := *s.e.plugin
	inner.Out = io.Discard
	inner.Self = nil
	s.d.p.ifName = ifName
	return &inner
}

func (s inProcessSelf) Add(_ context.Context, args *skel.CmdArgs) (types.Result, error) {
	var out bytes.Buffer
	p := s.plugin(args.IfName)
	p.Out = &out
	if err := p.Add(args); err != nil {
		return nil, err
	}
	return create.CreateFromBytes(out.Bytes())
}

func (s inProcessSelf) Del(_ context.Context, args *skel.CmdArgs) error {
	return s.plugin(args.IfName).Del(args)
}

// claimsEnv is draEnv with draPod's claim prepared to be attached by the
// claim alone: its NICs as rail0 and rail1 in the pod, the second's RDMA
// device renamed rdma_r1.
func claimsEnv(t *testing.T) (*env, pod, *fakeDelegate) {
	e, p, d, dir := draEnv(t)
	recs := drarecord.Dir(dir)
	c, ok, err := recs.Load("claim-1")
	if err != nil || !ok {
		t.Fatalf("claim-1's record: %v %v", ok, err)
	}
	c.Attach = true
	c.Devices[0].Config = &drarecord.NIC{InterfaceName: "rail0"}
	c.Devices[1].Config = &drarecord.NIC{InterfaceName: "rail1", RdmaDevName: "rdma_r1"}
	if err := recs.Write(c); err != nil {
		t.Fatal(err)
	}
	e.plugin.Self = inProcessSelf{e, d}
	return e, p, d
}

// The primary network's conflist entry: after the primary plugin (its
// result for eth0 is the prevResult), no device settings.
func (e *env) claimsConf(p pod) []byte {
	return e.netconf(p, "1.1.0", map[string]any{"name": "primary", "claims": true})
}

// ADD of the primary network attaches every NIC of the pod's claim under
// the claim's names, each an attachment of its own (network
// "claim-<UID>"), and passes on the primary's result with each NIC's
// interface and addresses after eth0's (what Multus's network-status
// lists); DEL takes them all back.
func TestClaimsAddDel(t *testing.T) {
	e, p, d := claimsEnv(t)
	p.ifName = "eth0"
	res, err := e.add(p, e.claimsConf(p), podArgs(draPod))
	if err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	got, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if s := resultText(got); s != "eth0@"+p.path()+"=10.100.100.2/29 rail0@"+p.path()+"=10.1.2.3/24 rail1@"+p.path()+"=10.1.2.3/24" ||
		got.Interfaces[0].Mac != "02:00:00:00:00:01" {
		t.Fatalf("ADD result %s (%+v): want the primary network's eth0, then rail0 and rail1 with their addresses", s, got)
	}
	e.wantWhere("rxe1", p.path())
	e.wantWhere("rdma_r1", p.path())
	e.wantWhere("mlx5_0", "host")
	if links := e.kernel.links(p.path()); !strings.Contains(links, "rail0") || !strings.Contains(links, "rail1") {
		t.Fatalf("the pod's links are %s, want rail0 and rail1", links)
	}
	recs := e.records()
	if len(recs) != 2 {
		t.Fatalf("records %+v, want one per NIC", recs)
	}
	for _, r := range recs {
		if r.Network != "claim-claim-1" || r.ContainerID != p.id {
			t.Fatalf("record %+v: want network claim-claim-1, container %s", r, p.id)
		}
	}

	if err := e.del(p, e.claimsConf(p)); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe1", "host")
	e.wantWhere("rxe2", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left after DEL: %+v", recs)
	}
	if err := e.del(p, e.claimsConf(p)); err != nil {
		t.Fatalf("DEL again: %v", err)
	}
	var dels int
	for _, c := range d.calls {
		if c.verb == "DEL" && c.plugin == hostDevice {
			dels++
		}
	}
	if dels != 2 {
		t.Fatalf("host-device DELs %d, want one per NIC: %+v", dels, d.calls)
	}
}

// A pod whose claims ask for no attach (a NAD's dra mode attaches them),
// a pod with no claim and a sandbox that is no Kubernetes pod pass
// through: the primary's result, nothing moved, host-device never run.
func TestClaimsOtherPodsUntouched(t *testing.T) {
	for _, tt := range []struct{ name, args string }{
		{"claim without attach", podArgs(otherPod)},
		{"no claim", podArgs("5d0e8f1a-2b3c-4d5e-8f90-a1b2c3d4e5f6")},
		{"no K8S_POD_UID", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, p, d := claimsEnv(t)
			p.ifName = "eth0"
			res, err := e.add(p, e.claimsConf(p), tt.args)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got, _ := current.NewResultFromResult(res); len(got.Interfaces) != 1 || got.Interfaces[0].Name != "eth0" {
				t.Fatalf("ADD result %+v, want the primary's", got)
			}
			if len(d.calls) != 0 || len(e.records()) != 0 {
				t.Fatalf("delegated %+v, records %+v: want nothing", d.calls, e.records())
			}
			e.wantWhere("mlx5_0", "host")
			e.wantWhere("rxe1", "host")
		})
	}
}

// When a NIC cannot be attached, the ones before it are taken back and
// the sandbox fails, naming the claim, the request and the interface: no
// pod runs without every NIC of its claims.
func TestClaimsAddRollsBack(t *testing.T) {
	e, p, _ := claimsEnv(t)
	p.ifName = "eth0"
	self := e.plugin.Self.(inProcessSelf)
	e.plugin.Self = failSecond{inner: self}
	_, err := e.add(p, e.claimsConf(p), podArgs(draPod))
	wantErr(t, err, "claim", "p-nics-x", `request "nics"`, "0000:00:05.0", "rail1", "no more NICs")
	e.wantWhere("rxe1", "host")
	e.wantWhere("rxe2", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left after a failed ADD: %+v", recs)
	}
	if links := e.kernel.links(p.path()); strings.Contains(links, "rail0") {
		t.Fatalf("rail0 still in the pod after the rollback: %s", links)
	}
}

// failSecond attaches the first NIC and fails the second.
type failSecond struct{ inner inProcessSelf }

func (f failSecond) Add(ctx context.Context, args *skel.CmdArgs) (types.Result, error) {
	if args.IfName == "rail1" {
		return nil, errors.New("no more NICs")
	}
	return f.inner.Add(ctx, args)
}

func (f failSecond) Del(ctx context.Context, args *skel.CmdArgs) error { return f.inner.Del(ctx, args) }

// A "claims" entry takes nothing that picks or names a device.
func TestClaimsRefusesDeviceSettings(t *testing.T) {
	e, p, _ := claimsEnv(t)
	p.ifName = "eth0"
	conf := e.netconf(p, "1.1.0", map[string]any{"claims": true, "rdmaDevice": "rxe1", "rdmaDevName": "x"})
	_, err := e.add(p, conf, podArgs(draPod))
	wantErr(t, err, `"claims"`, "rdmaDevice, rdmaDevName")
	e.wantWhere("rxe1", "host")
}

// A NAD's dra mode refuses a NIC of a claim that attaches by itself: the
// claims entry attached it when the sandbox was made.
func TestDRARefusesClaimThatAttaches(t *testing.T) {
	e, p, d := claimsEnv(t)
	_, err := e.add(p, e.draConf(p, map[string]any{"request": "nics"}, nil), podArgs(draPod))
	wantErr(t, err, "p-nics-x", "gives its NICs to the pod by itself", `network "rdma-net"`, "nothing was changed")
	if len(d.calls) != 0 {
		t.Fatalf("delegated %+v after the refusal", d.calls)
	}
	e.wantWhere("rxe1", "host")
}

// The entry exactly as `rdma-netns install --claims-entry` appends it is
// one the plugin runs: a pod of the claim gets its NICs, and the entry's
// log is the node's file.
func TestClaimsEntryAsInstalled(t *testing.T) {
	e, p, _ := claimsEnv(t)
	p.ifName = "eth0"
	entry := install.ClaimsEntry("rdma-netns")
	entry["name"] = "primary"
	conf := e.netconf(p, "1.1.0", entry)
	c, err := config.Parse(conf, podArgs(draPod))
	if err != nil || c.ForeignLogFile() {
		t.Fatalf("the installed entry %s: %v (foreign log file: %v)", conf, err, c != nil && c.ForeignLogFile())
	}
	if _, err := e.add(p, conf, podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe1", p.path())
}

// Multus v4.3.0 runs DEL from its cache, with the entry reduced to the
// keys it knows: {"type": "rdma-netns", "ipam": {}}. That DEL still takes
// the sandbox's claimed NICs back (a NIC left in the pod would come home
// under its pod-side name when the netns goes, without its addresses).
func TestClaimsDelFromMultusCache(t *testing.T) {
	e, p, _ := claimsEnv(t)
	p.ifName = "eth0"
	if _, err := e.add(p, e.claimsConf(p), podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	bare := e.netconf(p, "1.0.0", map[string]any{"name": "cluster", "ipam": map[string]any{}})
	if err := e.del(p, bare); err != nil {
		t.Fatalf("DEL with Multus's cached configuration: %v\nlog:\n%s", err, e.log)
	}
	e.wantWhere("rxe1", "host")
	e.wantWhere("rxe2", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// resultText is each interface of r as NAME@SANDBOX=ADDR,ADDR (in its
// order, interfaces outside the pod without "@"), the way a reader of
// the result pairs addresses with interfaces: by their index.
func resultText(r *current.Result) string {
	var parts []string
	for i, in := range r.Interfaces {
		s := in.Name
		if in.Sandbox != "" {
			s += "@" + in.Sandbox
		}
		var addrs []string
		for _, ip := range r.IPs {
			if ip.Interface != nil && *ip.Interface == i {
				addrs = append(addrs, ip.Address.String())
			}
		}
		if len(addrs) > 0 {
			s += "=" + strings.Join(addrs, ",")
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}
