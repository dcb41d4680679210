package plugin

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/linkconf"
)

// fakeLinks is Links on the fake kernel's netdevs.
type fakeLinks struct {
	k        *fakeKernel
	applyErr error
}

func (f *fakeLinks) HostNetdev(pci string) (string, error) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	for _, l := range f.k.netdevs {
		if l.netns == "" && l.pci == pci {
			return l.name, nil
		}
	}
	return "", fmt.Errorf("PCI function %s has no netdev in the host", pci)
}

func (f *fakeLinks) Read(ifName string) (linkconf.Config, error) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	l := f.k.link("", ifName)
	if l == nil {
		return linkconf.Config{}, fmt.Errorf("no netdev %s", ifName)
	}
	c := l.ip
	c.Up = l.up
	return c, nil
}

// ApplyPod keeps what it was given; package linkconf's own tests show
// what the kernel then has.
func (f *fakeLinks) ApplyPod(nsPath, ifName string, p linkconf.Pod) error {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	l := f.k.link(nsPath, ifName)
	if l == nil {
		return fmt.Errorf("no %s in the pod", ifName)
	}
	if p.MTU != 0 {
		l.ip.MTU = p.MTU
	}
	l.arp = p.ARP
	if p.Host != nil {
		l.ip.Addrs, l.ip.Routes = p.Host.Addrs, p.Host.Routes
	}
	return nil
}

func (f *fakeLinks) Rename(from, to string) error {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	l := f.k.link("", from)
	if l == nil || f.k.link("", to) != nil {
		return fmt.Errorf("cannot rename %s to %s", from, to)
	}
	l.name = to
	return nil
}

func (f *fakeLinks) Restore(ifName string, c linkconf.Config) error {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	l := f.k.link("", ifName)
	if l == nil {
		return fmt.Errorf("no netdev %s in the host", ifName)
	}
	l.up = c.Up
	c.Up = false
	l.ip = c
	return nil
}

// railHost is eth1's configuration in the host before any pod: what a
// node's network configuration gives a rail NIC.
var railHost = linkconf.Config{MTU: 1500,
	Addrs:  []linkconf.Addr{{CIDR: "10.100.41.5/24"}},
	Routes: []linkconf.Route{{Dst: "10.200.0.0/16", Gw: "10.100.41.254"}, {Gw: "10.100.41.254", Table: 141}},
}

// hostLinkEnv is claimsEnv with eth1 configured as railHost and up, and
// the claim asking for rail0 to carry its host addresses, with MTU 9000
// and the ARP settings of NICs sharing a subnet.
func hostLinkEnv(t *testing.T) (*env, pod, *fakeDelegate, *fakeLinks) {
	e, p, d := claimsEnv(t)
	e.kernel.setLink("", "eth1", func(l *fakeNetdev) { l.ip, l.up = railHost, true })
	links := &fakeLinks{k: e.kernel}
	e.plugin.Links = links
	recs := drarecord.Dir(e.plugin.DRARecordDir)
	c, _, err := recs.Load("claim-1")
	if err != nil {
		t.Fatal(err)
	}
	mtu, one, two := 9000, 1, 2
	c.Devices[0].Config = &drarecord.NIC{InterfaceName: "rail0", Addresses: drarecord.AddressesHost, MTU: &mtu,
		ARP: &drarecord.ARP{Ignore: &one, Announce: &two}}
	if err := recs.Write(c); err != nil {
		t.Fatal(err)
	}
	p.ifName = "eth0"
	return e, p, d, links
}

func (e *env) wantHostRail(t *testing.T) {
	t.Helper()
	got, err := e.plugin.Links.Read("eth1")
	want := railHost
	want.Up = true
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("eth1 in the host: %+v (%v)\nwant %+v\nlog:\n%s", got, err, want, e.log)
	}
}

// The claim's NIC goes into the pod with its host addresses and routes,
// the claim's MTU and ARP settings; the record remembers the host's; DEL
// gives the host back exactly what it had.
func TestClaimsCarryHostAddresses(t *testing.T) {
	e, p, _, _ := hostLinkEnv(t)
	res, err := e.add(p, e.claimsConf(p), podArgs(draPod))
	if err != nil {
		t.Fatalf("ADD: %v\nlog:\n%s", err, e.log)
	}
	// The result gives rail0 its host address beside what the (fake)
	// host-device gave it.
	if got, err := current.NewResultFromResult(res); err != nil || !strings.Contains(resultText(got), "rail0@"+p.path()+"=10.1.2.3/24,10.100.41.5/24 ") {
		t.Fatalf("ADD result %v (%v): want rail0 with its host address 10.100.41.5/24", resultText(got), err)
	}
	l := e.kernel.link(p.path(), "rail0")
	if l == nil || l.ip.MTU != 9000 || !reflect.DeepEqual(l.ip.Addrs, railHost.Addrs) || !reflect.DeepEqual(l.ip.Routes, railHost.Routes) ||
		l.arp == nil || *l.arp.Ignore != 1 || *l.arp.Announce != 2 {
		t.Fatalf("rail0 in the pod: %+v", l)
	}
	if _, err := e.plugin.Links.Read("eth1"); err == nil {
		t.Fatal("eth1 still in the host")
	}
	var recorded bool
	for _, r := range e.records() {
		if r.HostNetdev == "eth1" && r.HostLink != nil && reflect.DeepEqual(r.HostLink.Addrs, railHost.Addrs) {
			recorded = true
		}
	}
	if !recorded {
		t.Fatalf("no record remembers eth1's host configuration: %+v", e.records())
	}
	if err := e.del(p, e.claimsConf(p)); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantHostRail(t)
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// A DEL that fails after the RDMA device went home (host-device cannot
// take the NIC out) keeps the record, so the retried DEL still gives the
// host its addresses back; without the record they would be lost.
func TestClaimsHostAddressesSurviveRetriedDEL(t *testing.T) {
	e, p, d, _ := hostLinkEnv(t)
	if _, err := e.add(p, e.claimsConf(p), podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	d.delErr = errors.New("netlink busy")
	if err := e.del(p, e.claimsConf(p)); err == nil || !strings.Contains(err.Error(), "retry DEL") {
		t.Fatalf("DEL with host-device failing: %v, want a retry", err)
	}
	if len(e.records()) == 0 {
		t.Fatal("the failed DEL dropped the records: the retry could not give eth1 its addresses back")
	}
	d.delErr = nil
	if err := e.del(p, e.claimsConf(p)); err != nil {
		t.Fatalf("DEL retried: %v\nlog:\n%s", err, e.log)
	}
	e.wantHostRail(t)
}

// A pod netns destroyed before DEL gives the NIC back to the host under
// its pod-side name, bare: DEL renames it and gives it its configuration.
func TestClaimsHostAddressesAfterNetnsGone(t *testing.T) {
	e, p, _, _ := hostLinkEnv(t)
	if _, err := e.add(p, e.claimsConf(p), podArgs(draPod)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	e.deleteNetns(p)
	if e.kernel.link("", "rail0") == nil {
		t.Fatalf("the fake kernel did not bring rail0 home: %s", e.kernel.links(""))
	}
	if err := e.del(p, e.claimsConf(p)); err != nil {
		t.Fatalf("DEL: %v\nlog:\n%s", err, e.log)
	}
	e.wantHostRail(t)
}

// When the pod's side cannot be set up, the NIC goes home and gets its
// host configuration back, and the sandbox fails saying why.
func TestClaimsHostAddressesRollBack(t *testing.T) {
	e, p, _, links := hostLinkEnv(t)
	links.applyErr = errors.New("file exists")
	_, err := e.add(p, e.claimsConf(p), podArgs(draPod))
	wantErr(t, err, "0000:00:04.0", "rail0", "file exists")
	e.wantHostRail(t)
	e.wantWhere("rxe1", "host")
	if recs := e.records(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}
