// Package draconfig is what a ResourceClaim (or its DeviceClass) says each
// NIC of rdma-netns-dra becomes in the pod: the opaque configuration of
// driver nic.rdma-netns.io, checked when kubelet prepares the claim so that
// a bad key fails the pod's start with a message before anything moves.
//
// Two authors write it. The DeviceClass is the cluster admin's; a claim or
// claim template is written by whoever may create pods in its namespace,
// and is as untrusted as they are. So a claim may narrow what its class
// says, never widen it: a key its class set for a request is the class's;
// a claim renames the RDMA device only under a prefix the class allows (the
// names are unique on a node, and a host name taken by a pod would keep
// another NIC from coming home under it); and a claim's addresses are
// static ones, checked here, never an IPAM plugin of its choosing (the
// plugin runs as root on the node with what the config says).
package draconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

const (
	// APIVersion and Kind identify the parameters this package reads.
	APIVersion = "nic.rdma-netns.io/v1alpha1"
	Kind       = "NICConfig"
	// AddressesHost carries the NIC's host addresses and routes into the
	// pod and back to the host when it comes home.
	AddressesHost = drarecord.AddressesHost
	// maxInterfaceName is the kernel's IFNAMSIZ less its NUL.
	maxInterfaceName = 15
	// maxRoutes bounds a static IPAM's lists; the API server already
	// bounds the parameters to 10 KiB.
	maxRoutes = 64
)

// Source is who wrote a configuration.
type Source int

const (
	// FromClass is the DeviceClass's configuration: the cluster admin's.
	FromClass Source = iota
	// FromClaim is the claim's: whoever may create the pod.
	FromClaim
)

func (s Source) String() string {
	if s == FromClass {
		return "the DeviceClass"
	}
	return "the claim"
}

// Entry is one opaque configuration of this driver in a claim's
// allocation, as the API gives it.
type Entry struct {
	Source Source
	// Requests the entry applies to; empty: every request of the claim.
	// A main request's name covers its subrequests.
	Requests   []string
	Parameters []byte
	// every is the claim's allocated requests, which an entry with no
	// Requests applies to (Resolve sets it): the allocator clears the
	// Requests of an entry that names every request of the claim, so
	// the messages name them from the results.
	every []string
}

// paramKeys and ipamKeys are the keys strictDecode accepts, spelled
// exactly.
var (
	paramKeys = []string{"apiVersion", "kind", "interfaceName", "rdmaDevName", "podRdmaDevNamePrefix", "rdmaQoS", "mtu", "arp", "addresses", "ipam"}
	ipamKeys  = []string{"type", "addresses", "routes"}
)

// strictDecode decodes one JSON object into v, refusing a key not in
// keys: encoding/json alone matches keys whatever their case
// ("interfacename") and skips unknown ones, and a key silently not applied
// is a NIC set up otherwise than its author wrote.
func strictDecode(raw []byte, v any, keys []string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	for k := range m {
		if !slices.Contains(keys, k) {
			return fmt.Errorf("unknown key %s (the keys are %s)", config.Quote(k), strings.Join(keys, ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// params is the parameters' JSON form.
type params struct {
	APIVersion    string `json:"apiVersion"`
	Kind          string `json:"kind"`
	InterfaceName string `json:"interfaceName,omitempty"`
	RdmaDevName   string `json:"rdmaDevName,omitempty"`
	// PodRdmaDevNamePrefix: the class lets its claims name their RDMA
	// devices under this prefix.
	PodRdmaDevNamePrefix string          `json:"podRdmaDevNamePrefix,omitempty"`
	RdmaQoS              *config.QoS     `json:"rdmaQoS,omitempty"`
	MTU                  *int            `json:"mtu,omitempty"`
	ARP                  *ARP            `json:"arp,omitempty"`
	Addresses            string          `json:"addresses,omitempty"`
	IPAM                 json.RawMessage `json:"ipam,omitempty"`
}

// ARP is the interface's arp_ignore and arp_announce in the pod: a pod
// with several NICs on one subnet needs 1 and 2, or a peer learns one
// NIC's MAC for another's address and RoCE traffic lands on the wrong
// device.
type ARP = drarecord.ARP

// NIC is what one allocated device becomes in the pod, resolved from every
// entry that applies to its request; the driver keeps it in the claim's
// record.
type NIC = drarecord.NIC

// Result is one allocation result of this driver, in the allocation's
// order.
type Result struct {
	Request string
	Device  string
}

// Resolve checks every entry and gives each result its NIC, in results'
// order. An interface without a name is net1, net2, ... by its place
// among the results; a request of several devices numbers the names its
// configuration gives (rail -> rail0, rail1). Every error names the
// request and the key.
func Resolve(entries []Entry, results []Result) ([]NIC, error) {
	var every []string
	for _, r := range results {
		if !slices.Contains(every, r.Request) {
			every = append(every, r.Request)
		}
	}
	entries = slices.Clone(entries)
	for i := range entries {
		entries[i].every = every
	}
	decoded := make([]params, len(entries))
	var errs []error
	var prefix string
	for i, e := range entries {
		p, err := decode(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		decoded[i] = p
		if e.Source == FromClass && p.PodRdmaDevNamePrefix != "" {
			prefix = p.PodRdmaDevNamePrefix
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	count := map[string]int{}
	for _, r := range results {
		count[r.Request]++
	}
	nth := map[string]int{}
	out := make([]NIC, len(results))
	for i, r := range results {
		n, err := merge(entries, decoded, r.Request, prefix)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		k := nth[r.Request]
		nth[r.Request]++
		switch {
		case n.InterfaceName == "":
			n.InterfaceName = "net" + strconv.Itoa(i+1)
		case count[r.Request] > 1:
			n.InterfaceName += strconv.Itoa(k)
		}
		if n.RdmaDevName != "" && count[r.Request] > 1 {
			n.RdmaDevName += strconv.Itoa(k)
		}
		out[i] = n
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, unique(results, out)
}

// decode reads one entry's parameters strictly: an unknown key is an error
// rather than a setting silently not applied.
func decode(e Entry) (params, error) {
	var p params
	where := describe(e)
	if err := strictDecode(e.Parameters, &p, paramKeys); err != nil {
		return p, fmt.Errorf("%s: the parameters are not a %s: %v", where, Kind, err)
	}
	if p.APIVersion != APIVersion || p.Kind != Kind {
		return p, fmt.Errorf("%s: apiVersion %s, kind %s: want apiVersion %s, kind %s", where,
			config.Quote(p.APIVersion), config.Quote(p.Kind), APIVersion, Kind)
	}
	return p, check(p, e.Source, where)
}

func describe(e Entry) string {
	quoted := func(names []string) string {
		q := make([]string, len(names))
		for i, r := range names {
			q[i] = config.Quote(r)
		}
		return strings.Join(q, ", ")
	}
	reqs := "every request"
	switch {
	case len(e.Requests) > 0:
		reqs = "request " + quoted(e.Requests)
	case len(e.every) > 0:
		reqs = "every request (" + quoted(e.every) + ")"
	}
	return fmt.Sprintf("config of %s (from %s)", reqs, e.Source)
}

// check validates each key on its own; merge checks what depends on the
// class.
func check(p params, src Source, where string) error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s: %s", where, key, fmt.Sprintf(format, a...)))
	}
	if n := p.InterfaceName; n != "" {
		if why := interfaceNameProblem(n); why != "" {
			bad("interfaceName", "%s %s", config.Quote(n), why)
		}
	}
	if n := p.RdmaDevName; n != "" && !config.ValidRDMAName(n) {
		bad("rdmaDevName", "%s is not a valid RDMA device name (letters, digits, '_', '.', ':', '-', at most 63 characters)", config.Quote(n))
	}
	if n := p.PodRdmaDevNamePrefix; n != "" {
		if src != FromClass {
			bad("podRdmaDevNamePrefix", "only a DeviceClass may set it")
		} else if !config.ValidRDMAName(n) {
			bad("podRdmaDevNamePrefix", "%s is not a valid RDMA device name prefix", config.Quote(n))
		}
	}
	if q := p.RdmaQoS; q != nil {
		for _, err := range q.Problems() {
			errs = append(errs, fmt.Errorf("%s: rdmaQoS%v", where, err))
		}
	}
	if m := p.MTU; m != nil && (*m < 68 || *m > 65535) {
		bad("mtu", "%d is out of range 68-65535", *m)
	}
	if a := p.ARP; a != nil {
		if a.Ignore != nil && !(*a.Ignore >= 0 && *a.Ignore <= 3 || *a.Ignore == 8) {
			bad("arp.ignore", "%d is not one of 0-3 or 8 (the kernel's arp_ignore)", *a.Ignore)
		}
		if a.Announce != nil && (*a.Announce < 0 || *a.Announce > 2) {
			bad("arp.announce", "%d is out of range 0-2 (the kernel's arp_announce)", *a.Announce)
		}
	}
	if a := p.Addresses; a != "" && a != AddressesHost {
		bad("addresses", "%s: the only value is %q (the NIC's host addresses and routes, carried into the pod); leave it out for none", config.Quote(a), AddressesHost)
	}
	if len(p.IPAM) > 0 {
		if p.Addresses != "" {
			bad("ipam", "set beside addresses %q: give the pod's addresses one way", p.Addresses)
		}
		if err := checkIPAM(p.IPAM, src); err != nil {
			bad("ipam", "%v", err)
		}
	}
	return errors.Join(errs...)
}

// interfaceNameProblem is why the kernel or the pod could not take n as an
// interface name, "" if it can.
func interfaceNameProblem(n string) string {
	switch {
	case len(n) > maxInterfaceName:
		return fmt.Sprintf("is longer than %d bytes", maxInterfaceName)
	case n == "lo" || n == "eth0":
		return "is the pod's own (loopback, or the cluster network's interface)"
	case !config.ValidRDMAName(n) || strings.Contains(n, ":"):
		return "is not an interface name (letters, digits, '_', '.', '-')"
	}
	return ""
}

// ipamConf is the part of an IPAM configuration checked here; a claim's
// may hold nothing else.
type ipamConf struct {
	Type      string `json:"type"`
	Addresses []struct {
		Address string `json:"address"`
		Gateway string `json:"gateway,omitempty"`
	} `json:"addresses,omitempty"`
	Routes []struct {
		Dst string `json:"dst"`
		GW  string `json:"gw,omitempty"`
	} `json:"routes,omitempty"`
}

// checkIPAM accepts from a class any plugin by name, the plugin checking
// its own keys; from a claim only "static", whose addresses and routes are
// checked here.
func checkIPAM(raw json.RawMessage, src Source) error {
	var c ipamConf
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("not an IPAM configuration: %v", err)
	}
	if !config.ValidRDMAName(c.Type) || strings.ContainsAny(c.Type, ":") {
		return fmt.Errorf("type %s is not a plugin name", config.Quote(c.Type))
	}
	if src == FromClaim && c.Type != "static" {
		return fmt.Errorf("type %s: a claim may give static addresses only; an IPAM plugin of another type is the DeviceClass's to name", config.Quote(c.Type))
	}
	if src == FromClaim {
		if err := strictDecode(raw, &c, ipamKeys); err != nil {
			return err
		}
	}
	if c.Type == "static" && len(c.Addresses) == 0 {
		return errors.New("static with no addresses")
	}
	if len(c.Addresses) > maxRoutes || len(c.Routes) > maxRoutes {
		return fmt.Errorf("more than %d addresses or routes", maxRoutes)
	}
	for _, a := range c.Addresses {
		if _, _, err := net.ParseCIDR(a.Address); err != nil {
			return fmt.Errorf("address %s is not an address with its prefix length (10.0.0.2/24)", config.Quote(a.Address))
		}
		if a.Gateway != "" && net.ParseIP(a.Gateway) == nil {
			return fmt.Errorf("gateway %s is not an IP address", config.Quote(a.Gateway))
		}
	}
	for _, r := range c.Routes {
		if _, _, err := net.ParseCIDR(r.Dst); err != nil {
			return fmt.Errorf("route dst %s is not a network with its prefix length", config.Quote(r.Dst))
		}
		if r.GW != "" && net.ParseIP(r.GW) == nil {
			return fmt.Errorf("route gw %s is not an IP address", config.Quote(r.GW))
		}
	}
	return nil
}

// applies reports whether an entry for reqs applies to request req (a main
// request's name covers its subrequests).
func applies(reqs []string, req string) bool {
	if len(reqs) == 0 {
		return true
	}
	for _, r := range reqs {
		if r == req || strings.HasPrefix(req, r+"/") {
			return true
		}
	}
	return false
}

// merge is request req's NIC: the class's entries first, in order (a
// later one's key over an earlier one's), then the claim's, which may set
// only what no class entry set.
func merge(entries []Entry, decoded []params, req, prefix string) (NIC, error) {
	var n NIC
	setBy := map[string]Source{}
	var errs []error
	for _, src := range []Source{FromClass, FromClaim} {
		for i, e := range entries {
			if e.Source != src || !applies(e.Requests, req) {
				continue
			}
			p := decoded[i]
			set := func(key string, isSet bool, apply func()) {
				if !isSet {
					return
				}
				if by, ok := setBy[key]; ok && by == FromClass && src == FromClaim {
					errs = append(errs, fmt.Errorf("%s: %s: request %s has it from its DeviceClass, which a claim may not change",
						describe(e), key, config.Quote(req)))
					return
				}
				setBy[key] = src
				apply()
			}
			set("interfaceName", p.InterfaceName != "", func() { n.InterfaceName = p.InterfaceName })
			set("rdmaDevName", p.RdmaDevName != "", func() { n.RdmaDevName = p.RdmaDevName })
			set("rdmaQoS", p.RdmaQoS != nil, func() { n.RdmaQoS = &drarecord.QoS{ToS: p.RdmaQoS.ToS, TC: p.RdmaQoS.TC} })
			set("mtu", p.MTU != nil, func() { n.MTU = p.MTU })
			set("arp", p.ARP != nil, func() { n.ARP = p.ARP })
			// One key for both: a claim giving addresses replaces no
			// class's way of giving them.
			set("addresses", p.Addresses != "" || len(p.IPAM) > 0, func() { n.Addresses, n.IPAM = p.Addresses, p.IPAM })
			if src == FromClaim && p.RdmaDevName != "" && (prefix == "" || !strings.HasPrefix(p.RdmaDevName, prefix)) {
				errs = append(errs, fmt.Errorf("%s: rdmaDevName %s: a claim names its RDMA devices only under the prefix its DeviceClass allows (podRdmaDevNamePrefix%s)",
					describe(e), config.Quote(p.RdmaDevName), allowed(prefix)))
			}
		}
	}
	return n, errors.Join(errs...)
}

func allowed(prefix string) string {
	if prefix == "" {
		return ", which it does not set"
	}
	return " " + config.Quote(prefix)
}

// unique refuses two NICs of one pod under one interface or RDMA device
// name.
func unique(results []Result, nics []NIC) error {
	var errs []error
	ifs, rdmas := map[string]string{}, map[string]string{}
	for i, n := range nics {
		req := results[i].Request
		if other, ok := ifs[n.InterfaceName]; ok {
			errs = append(errs, fmt.Errorf("interfaceName %s is given to two NICs (requests %s and %s)", config.Quote(n.InterfaceName), config.Quote(other), config.Quote(req)))
		}
		ifs[n.InterfaceName] = req
		if n.RdmaDevName == "" {
			continue
		}
		if other, ok := rdmas[n.RdmaDevName]; ok {
			errs = append(errs, fmt.Errorf("rdmaDevName %s is given to two NICs (requests %s and %s)", config.Quote(n.RdmaDevName), config.Quote(other), config.Quote(req)))
		}
		rdmas[n.RdmaDevName] = req
	}
	return errors.Join(errs...)
}
