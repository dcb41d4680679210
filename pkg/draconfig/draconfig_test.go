package draconfig

import (
	"encoding/json"
	"strings"
	"testing"
)

func nic(t *testing.T, kv string) []byte {
	t.Helper()
	s := `{"apiVersion":"` + APIVersion + `","kind":"` + Kind + `"`
	if kv != "" {
		s += "," + kv
	}
	s += "}"
	if !json.Valid([]byte(s)) {
		t.Fatalf("test parameters are not JSON: %s", s)
	}
	return []byte(s)
}

func rails(n int) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = Result{Request: "rail" + string(rune('0'+i)), Device: "nic-" + string(rune('a'+i))}
	}
	return out
}

func TestResolveNames(t *testing.T) {
	for _, c := range []struct {
		name    string
		entries func(t *testing.T) []Entry
		results []Result
		want    []string // interface/rdma per result
	}{
		{"no config: net1, net2 in allocation order", func(t *testing.T) []Entry { return nil }, rails(2),
			[]string{"net1/", "net2/"}},
		{"one entry per request", func(t *testing.T) []Entry {
			return []Entry{
				{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"interfaceName":"rail0"`)},
				{Source: FromClaim, Requests: []string{"rail1"}, Parameters: nic(t, `"interfaceName":"rail1"`)},
			}
		}, rails(2), []string{"rail0/", "rail1/"}},
		{"a request of two devices numbers its names", func(t *testing.T) []Entry {
			return []Entry{
				{Source: FromClass, Parameters: nic(t, `"podRdmaDevNamePrefix":"pod_"`)},
				{Source: FromClaim, Requests: []string{"nics"}, Parameters: nic(t, `"interfaceName":"rail","rdmaDevName":"pod_r"`)},
			}
		}, []Result{{"nics", "a"}, {"nics", "b"}}, []string{"rail0/pod_r0", "rail1/pod_r1"}},
		{"a main request's config covers its subrequests", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Requests: []string{"nics"}, Parameters: nic(t, `"interfaceName":"fast"`)}}
		}, []Result{{"nics/x", "a"}, {"other", "b"}}, []string{"fast/", "net2/"}},
		{"the class names the RDMA device freely", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClass, Parameters: nic(t, `"rdmaDevName":"mlx5_rail"`)}}
		}, rails(1), []string{"net1/mlx5_rail"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(c.entries(t), c.results)
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range got {
				if s := n.InterfaceName + "/" + n.RdmaDevName; s != c.want[i] {
					t.Errorf("result %d (%s): %s, want %s", i, c.results[i].Request, s, c.want[i])
				}
			}
		})
	}
}

func TestResolveCarries(t *testing.T) {
	entries := []Entry{
		{Source: FromClass, Parameters: nic(t, `"rdmaQoS":{"tos":106},"ipam":{"type":"host-local","subnet":"10.9.0.0/16","dataDir":"/var/lib/cni/x"}`)},
		{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"mtu":4200,"arp":{"ignore":1,"announce":2}`)},
		{Source: FromClaim, Requests: []string{"rail1"}, Parameters: nic(t, `"mtu":9000`)},
	}
	got, err := Resolve(entries, rails(2))
	if err != nil {
		t.Fatal(err)
	}
	if *got[0].RdmaQoS.ToS != 106 || *got[1].RdmaQoS.ToS != 106 {
		t.Errorf("the class's rdmaQoS did not reach both NICs: %+v %+v", got[0].RdmaQoS, got[1].RdmaQoS)
	}
	if *got[0].MTU != 4200 || *got[1].MTU != 9000 || got[1].ARP != nil || *got[0].ARP.Ignore != 1 || *got[0].ARP.Announce != 2 {
		t.Errorf("per-request keys mixed up: %+v %+v", got[0], got[1])
	}
	if !strings.Contains(string(got[1].IPAM), `"host-local"`) {
		t.Errorf("the class's ipam did not reach rail1: %s", got[1].IPAM)
	}
}

func TestResolveRefuses(t *testing.T) {
	for _, c := range []struct {
		name    string
		entries func(t *testing.T) []Entry
		results []Result
		want    []string // every substring the error must hold
	}{
		{"unknown key", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"interfacename":"x"`)}}
		}, rails(1), []string{`request "rail0"`, "interfacename"}},
		{"another kind", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: []byte(`{"apiVersion":"v1","kind":"ConfigMap"}`)}}
		}, rails(1), []string{`every request ("rail0")`, "apiVersion", APIVersion}},
		// The allocator clears the Requests of an entry that names every
		// request of the claim: the message still names them.
		{"unknown key, the entry's requests cleared", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"interfacename":"x"`)}}
		}, rails(2), []string{`every request ("rail0", "rail1")`, "interfacename"}},
		{"not JSON", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: []byte(`interfaceName: x`)}}
		}, rails(1), []string{"not a " + Kind}},
		{"two NICs, one interface name", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"interfaceName":"rail"`)}}
		}, rails(2), []string{`interfaceName "rail"`, `"rail0" and "rail1"`}},
		{"a default name taken by another request's", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Requests: []string{"rail1"}, Parameters: nic(t, `"interfaceName":"net1"`)}}
		}, rails(2), []string{`interfaceName "net1"`}},
		{"the pod's own interface", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"interfaceName":"eth0"`)}}
		}, rails(1), []string{"interfaceName", "cluster network"}},
		{"too long an interface name", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"interfaceName":"a23456789012345x"`)}}
		}, rails(1), []string{"interfaceName", "longer than 15"}},
		{"a slash in an interface name", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"interfaceName":"a/b"`)}}
		}, rails(1), []string{"interfaceName", "not an interface name"}},
		{"a claim's RDMA name, no prefix allowed", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"rdmaDevName":"mlx5_0"`)}}
		}, rails(1), []string{`request "rail0"`, "rdmaDevName", "which it does not set"}},
		{"a claim's RDMA name outside the prefix", func(t *testing.T) []Entry {
			return []Entry{
				{Source: FromClass, Parameters: nic(t, `"podRdmaDevNamePrefix":"pod_"`)},
				{Source: FromClaim, Parameters: nic(t, `"rdmaDevName":"mlx5_0"`)},
			}
		}, rails(1), []string{"rdmaDevName", `"pod_"`}},
		{"a claim setting the prefix", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"podRdmaDevNamePrefix":"m"`)}}
		}, rails(1), []string{"podRdmaDevNamePrefix", "only a DeviceClass"}},
		{"a claim changing its class's key", func(t *testing.T) []Entry {
			return []Entry{
				{Source: FromClass, Parameters: nic(t, `"mtu":1500`)},
				{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"mtu":9000`)},
			}
		}, rails(1), []string{`request "rail0"`, "mtu", "DeviceClass"}},
		{"a claim's addresses over its class's IPAM", func(t *testing.T) []Entry {
			return []Entry{
				{Source: FromClass, Parameters: nic(t, `"ipam":{"type":"host-local"}`)},
				{Source: FromClaim, Parameters: nic(t, `"addresses":"host"`)},
			}
		}, rails(1), []string{"addresses", "DeviceClass"}},
		{"a claim naming an IPAM plugin", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"ipam":{"type":"host-local","dataDir":"/etc"}`)}}
		}, rails(1), []string{"ipam", "static addresses only"}},
		{"a claim's static address that is not one", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Requests: []string{"rail0"}, Parameters: nic(t, `"ipam":{"type":"static","addresses":[{"address":"10.0.0.300/24"}]}`)}}
		}, rails(1), []string{`request "rail0"`, "ipam", `"10.0.0.300/24"`}},
		{"a claim's static address without its length", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"ipam":{"type":"static","addresses":[{"address":"10.0.0.3"}]}`)}}
		}, rails(1), []string{"ipam", "prefix length"}},
		{"a static IPAM with a key of its own from a claim", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"ipam":{"type":"static","addresses":[{"address":"10.0.0.3/24"}],"dataDir":"/x"}`)}}
		}, rails(1), []string{"ipam", `"dataDir"`}},
		{"addresses both ways", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClass, Parameters: nic(t, `"addresses":"host","ipam":{"type":"host-local"}`)}}
		}, rails(1), []string{"ipam", "one way"}},
		{"addresses of another kind", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"addresses":"dhcp"`)}}
		}, rails(1), []string{"addresses", `"dhcp"`}},
		{"out of range", func(t *testing.T) []Entry {
			return []Entry{{Source: FromClaim, Parameters: nic(t, `"mtu":67,"arp":{"ignore":4,"announce":3},"rdmaQoS":{"tos":256}`)}}
		}, rails(1), []string{"mtu: 67", "arp.ignore", "arp.announce", "rdmaQoS.tos 256"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(c.entries(t), c.results)
			if err == nil {
				t.Fatalf("accepted: %+v", got)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// A pod's value reaches the refusal quoted and cut, never raw: the
// message becomes a pod event and a log line.
func TestResolveQuotesWhatItRefuses(t *testing.T) {
	long := strings.Repeat("\x1b[2J", 2000)
	b, _ := json.Marshal(map[string]string{"apiVersion": APIVersion, "kind": Kind, "interfaceName": long})
	_, err := Resolve([]Entry{{Source: FromClaim, Parameters: b}}, rails(1))
	if err == nil {
		t.Fatal("accepted")
	}
	if strings.Contains(err.Error(), "\x1b") || len(err.Error()) > 1000 {
		t.Errorf("the refusal holds raw or unbounded input (%d bytes): %q", len(err.Error()), err.Error()[:200])
	}
}
