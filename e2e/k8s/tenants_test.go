//go:build e2e

package k8s

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// tenant is a namespace of a shared cluster with a NAD of its own on a NIC
// of its own: the operator writes the NAD, the tenant writes only pods.
type tenant struct {
	ns, network, addr string
	nic               rig.NIC
	// The lane's pods and NADs of the tenant so far, the RDMA device
	// names its NADs give, and what else of its pods the other tenant
	// must never see (a held device's pod UID, sandbox, netns).
	pods, nads, devNames, secrets []string
}

// identifiers are what names tn to the other tenant: its namespace as
// objects in it are named (NS/NAME), its pods and NADs, its NIC's netdev,
// RDMA device and PCI address, the device names its NADs give, and its
// pods' secrets.
func (tn *tenant) identifiers() []string {
	ids := []string{tn.ns + "/", tn.nic.Netdev, tn.nic.RDMA, tn.nic.PCI}
	ids = append(ids, tn.pods...)
	ids = append(ids, tn.nads...)
	ids = append(ids, tn.devNames...)
	return append(ids, tn.secrets...)
}

// tenancy is one lane of TestTenants: its two tenants, and the host's
// netdevs and RDMA devices before the test, when no pod held any NIC;
// the pods created since the last search of their events (noLeak), and
// what each NAD of the lane writes (its NIC and rdma-netns settings).
type tenancy struct {
	t1, t2        *tenant
	netdevs, rdma []string
	pending       []*corev1.Pod
	nadWrites     map[string]string // "ns/name" -> what the NAD names
}

// rdmaDevNameOf is the rdmaDevName a NAD's rdma-netns settings give.
var rdmaDevNameOf = regexp.MustCompile(`"rdmaDevName":\s*"([^"]*)"`)

// nad is the package's nad in tn's namespace on tn's address, recorded as
// tn's.
func (ts *tenancy) nad(t *testing.T, tn *tenant, name, netdev, rdmaExtra string, opts ...nadOption) {
	t.Helper()
	nad(t, tn.ns, name, netdev, tn.addr, rdmaExtra, opts...)
	tn.nads = append(tn.nads, name)
	if m := rdmaDevNameOf.FindStringSubmatch(rdmaExtra); m != nil {
		tn.devNames = append(tn.devNames, m[1])
	}
	ts.nadWrites[tn.ns+"/"+name] = netdev + " " + rdmaExtra
}

func (ts *tenancy) tenantOf(ns string) *tenant {
	if ns == ts.t1.ns {
		return ts.t1
	}
	return ts.t2
}

// track records a pod the case creates: its name is its tenant's, and
// noLeak searches its events.
func (ts *tenancy) track(pod *corev1.Pod) {
	tn := ts.tenantOf(pod.Namespace)
	tn.pods = append(tn.pods, pod.Name)
	ts.pending = append(ts.pending, pod)
}

// runsWith is the package's runsWith for a pod of tn, tracked.
func (ts *tenancy) runsWith(t *testing.T, tn *tenant, name, network, dev string) string {
	t.Helper()
	ts.track(toolsPod(tn.ns, name, network))
	return runsWith(t, tn.ns, name, network, dev)
}

// noLeak searches the events of every pod created since the last search
// for every identifier of the other tenant, but what the pod itself wrote
// (its networks annotation, the NADs it names): a refusal quotes the
// value it refused. Each case ends with it.
func (ts *tenancy) noLeak(t *testing.T) {
	t.Helper()
	for _, pod := range ts.pending {
		other := ts.t2
		if ts.tenantOf(pod.Namespace) == ts.t2 {
			other = ts.t1
		}
		network := pod.Annotations["k8s.v1.cni.cncf.io/networks"]
		wrote := network
		for nad, w := range ts.nadWrites {
			ns, name, _ := strings.Cut(nad, "/")
			if ns == pod.Namespace && strings.Contains(network, name) {
				wrote += " " + w
			}
		}
		evs := events(t, pod.Namespace, pod.Name)
		if evs == "" {
			t.Errorf("pod %s/%s has no events: nothing to search", pod.Namespace, pod.Name)
		}
		for _, id := range other.identifiers() {
			if strings.Contains(evs, id) && !strings.Contains(wrote, id) {
				t.Errorf("pod %s/%s's events name %s of tenant %s, which the pod did not write:\n%s", pod.Namespace, pod.Name, id, other.ns, evs)
			}
		}
	}
	ts.pending = nil
}

// Issue 35 on a real node: two namespaces, t1 and t2, each with its NAD
// (host-device on a NIC of its own, then rdma-netns). A t1 pod writes in
// its k8s.v1.cni.cncf.io/networks annotation, as a tenant can, t2's RDMA
// device (cni-args rdmaDevice), t2's NIC's PCI address (deviceID), a
// malformed rdmaDevName, or the name t2's NAD gives its device; or its
// operator's NAD names the device t2's pod holds. Each is refused with an
// event that says which input, with which value, and why, and that names
// no other RDMA device of the node; t2's pod starts with its own device;
// after each the host has the tenants' NICs and RDMA devices back under
// their own names, and the NAD's next pod starts with its device. After
// every case (the control character in an interface name and 200,000
// '<' of cni-args too), the events of each pod it created, t1's and t2's,
// name nothing of the other tenant but what the pod itself wrote (noLeak:
// namespace, pods, NADs, netdev, RDMA devices, PCI address, a held
// device's pod UID, sandbox and netns).
//
// The cases run in two lanes at once, each on a NIC pair of its own
// (eth4/eth5, eth6/eth7) with NADs of its own in the same two namespaces:
// one after another they were 20 pod starts and 300-640 s of the first
// boot. Two lanes, not one per case: eight pods started at once have put
// Multus's daemon into CrashLoopBackOff (docs/kubernetes.md). When both
// lanes are done the host has every NIC and device it had before.
func TestTenants(t *testing.T) {
	for _, ns := range []string{"t1", "t2"} {
		createNamespace(t, ns)
	}
	everyNICHome(t)
	netdevs, rdma := hostState(t)
	lanes := []struct {
		nics  [2]string
		cases []func(*tenancy, *testing.T)
	}{
		{[2]string{"eth4", "eth5"}, []func(*tenancy, *testing.T){(*tenancy).otherNADsDevName, (*tenancy).otherDevice, (*tenancy).podChosenIfName}},
		{[2]string{"eth6", "eth7"}, []func(*tenancy, *testing.T){(*tenancy).otherDeviceID, (*tenancy).malformedDevName, (*tenancy).heldByOtherNamespace, (*tenancy).hugeCNIArgs}},
	}
	t.Run("lanes", func(t *testing.T) {
		for i, l := range lanes {
			t.Run(strings.Join(l.nics[:], ","), func(t *testing.T) {
				t.Parallel()
				ts := &tenancy{
					t1:      &tenant{ns: "t1", network: "t1-net-" + l.nics[0], addr: fmt.Sprintf("10.100.%d.1/29", 111+2*i), nic: nicNamed(t, l.nics[0])},
					t2:      &tenant{ns: "t2", network: "t2-net-" + l.nics[1], addr: fmt.Sprintf("10.100.%d.1/29", 112+2*i), nic: nicNamed(t, l.nics[1])},
					netdevs: netdevs, rdma: rdma, nadWrites: map[string]string{},
				}
				for _, tn := range []*tenant{ts.t1, ts.t2} {
					ts.nad(t, tn, tn.network, tn.nic.Netdev, "")
				}
				for _, c := range l.cases {
					c(ts, t)
					ts.noLeak(t)
				}
			})
		}
	})
	waitHostState(t, netdevs, rdma)
}

// everyNICHome waits for every NIC of the VM and its RDMA device to be on
// the host under its own name, so that the state the lanes compare with
// is the node's whole: the test before deleted its pods, and a sandbox's
// DEL, which returns its NIC, can end after the pod object is gone.
func everyNICHome(t *testing.T) {
	t.Helper()
	nics, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	err = cririg.Wait(2*time.Minute, "every NIC and RDMA device of the VM on the host", func() (bool, error) {
		netdevs, rdma := hostState(t)
		for _, n := range nics {
			if !slices.Contains(netdevs, n.Netdev) || !slices.Contains(rdma, n.RDMA) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		netdevs, rdma := hostState(t)
		t.Fatalf("%v: netdevs %v, RDMA %v", err, netdevs, rdma)
	}
}

// otherDevice: cni-args rdmaDevice names the other tenant's device.
func (ts *tenancy) otherDevice(t *testing.T) {
	t.Run("cni-args rdmaDevice of the other tenant's device", func(t *testing.T) {
		t1, t2 := ts.t1, ts.t2
		hostile := toolsPod(t1.ns, "t1-rdmadevice", selection(t1.network, "cni-args", map[string]any{"rdmaDevice": t2.nic.RDMA}))
		ts.refused(t, hostile, "args.cni.rdmaDevice", strconv.Quote(t2.nic.RDMA), "refused", "nothing was changed")
		// t2's pod starts with its own device while t1's keeps retrying.
		ts.runsWith(t, t2, "t2-rdmadevice", t2.network, t2.nic.RDMA)
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		deletePod(t, t2.ns, "t2-rdmadevice", metav1.DeleteOptions{})
		ts.settled(t)
		ts.nextStarts(t, "t1-rdmadevice-next", t1.network)
	})
}

// otherDeviceID: the network-selection element's deviceID names the other
// tenant's NIC.
func (ts *tenancy) otherDeviceID(t *testing.T) {
	t.Run("deviceID of the other tenant's NIC", func(t *testing.T) {
		t1, t2 := ts.t1, ts.t2
		// Multus passes a network-selection element's deviceID on as
		// runtimeConfig.deviceID to the plugins that declare the capability
		// (when no device plugin allocated one), as conf/nad-device-info.yaml
		// declares it.
		allowed := fmt.Sprintf(`, "capabilities": {"deviceID": true}, "allowedPodDevices": [%q]`, t1.nic.RDMA)
		ts.nad(t, t1, "t1-devid", t1.nic.Netdev, allowed)
		hostile := toolsPod(t1.ns, "t1-deviceid", selection("t1-devid", "deviceID", t2.nic.PCI))
		// The refusal names the list, never what the deviceID led to.
		ts.refused(t, hostile, "runtimeConfig.deviceID", strconv.Quote(t2.nic.PCI), "refused", "allowedPodDevices are "+t1.nic.RDMA, "nothing was changed")
		ts.runsWith(t, t2, "t2-deviceid", t2.network, t2.nic.RDMA)
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		deletePod(t, t2.ns, "t2-deviceid", metav1.DeleteOptions{})
		ts.settled(t)
		// A deviceID that names a device of the list is the pod's to pick:
		// the NAD's next pod starts with it.
		ts.nextStarts(t, "t1-deviceid-next", selection("t1-devid", "deviceID", t1.nic.PCI))

		// host-device takes the NIC the pod names (the deviceID capability,
		// no NIC of its own) and rdma-netns, which sees the same deviceID,
		// holds it to allowedPodDevices: t1's pod naming t2's free NIC is
		// refused, the chain's DEL gives the NIC back, and t2's pod starts.
		ts.nad(t, t1, "t1-pick", "", allowed, byPodDeviceID)
		hostile = toolsPod(t1.ns, "t1-pick", selection("t1-pick", "deviceID", t2.nic.PCI))
		ts.refused(t, hostile, "runtimeConfig.deviceID", strconv.Quote(t2.nic.PCI), "refused", "allowedPodDevices are "+t1.nic.RDMA, "nothing was changed")
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		ts.settled(t)
		ts.runsWith(t, t2, "t2-pick", t2.network, t2.nic.RDMA)
		deletePod(t, t2.ns, "t2-pick", metav1.DeleteOptions{})
		ts.settled(t)
		ts.nextStarts(t, "t1-pick-next", selection("t1-pick", "deviceID", t1.nic.PCI))
	})
}

// podChosenIfName: the network-selection element names the pod's
// interface with a control character, or with a ';', which Multus, libcni
// and the kernel pass. rdma-netns refuses the ADD; its DEL does not fail on
// the name, so host-device's DEL returns the NIC under its own name while
// the pod is retried, and the network's next pod starts.
func (ts *tenancy) podChosenIfName(t *testing.T) {
	t.Run("interface names ADD refuses", func(t *testing.T) {
		t1 := ts.t1
		for _, c := range []struct {
			pod, name string
			want      []string
		}{
			{"t1-ifname", "net\x01", nil},
			{"t1-ifname-semicolon", "a;b", []string{`"a;b": ';' is not a letter, digit, '-', '_' or '.'`}},
		} {
			hostile := toolsPod(t1.ns, c.pod, selection(t1.network, "interface", c.name))
			ts.refused(t, hostile, append(c.want, "invalid interface name", "nothing was changed")...)
			ts.settled(t)
			deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
			ts.settled(t)
		}
		ts.nextStarts(t, "t1-ifname-next", t1.network)
	})
}

// hugeCNIArgs: cni-args of 200,000 '<', which Multus re-encodes into 1.2 MB
// of every plugin's stdin. They are not rdma-netns's keys: the pod starts
// with its device, and its delete returns NIC and device.
func (ts *tenancy) hugeCNIArgs(t *testing.T) {
	t.Run("cni-args of 200,000 '<'", func(t *testing.T) {
		t1 := ts.t1
		ts.runsWith(t, t1, "t1-huge-args", selection(t1.network, "cni-args", map[string]any{"note": strings.Repeat("<", 200000)}), t1.nic.RDMA)
		deletePod(t, t1.ns, "t1-huge-args", metav1.DeleteOptions{})
		ts.settled(t)
		ts.nextStarts(t, "t1-huge-args-next", t1.network)
	})
}

// malformedDevName: cni-args rdmaDevName is no RDMA device name.
func (ts *tenancy) malformedDevName(t *testing.T) {
	t.Run("malformed cni-args rdmaDevName", func(t *testing.T) {
		t1 := ts.t1
		for _, c := range []struct {
			pod   string
			value any
		}{
			{"t1-devname-slash", "a/b"},
			{"t1-devname-number", 7},
			{"t1-devname-long", "t1-" + strings.Repeat("x", 67)},
		} {
			want := []string{"args.cni.rdmaDevName", "refused"}
			if s, ok := c.value.(string); ok {
				want = append(want, strconv.Quote(s))
			}
			hostile := toolsPod(t1.ns, c.pod, selection(t1.network, "cni-args", map[string]any{"rdmaDevName": c.value}))
			ts.refused(t, hostile, want...)
			// Its DEL does not fail on it: host-device's DEL ran after
			// rdma-netns's, and the NIC is back under its own name (no
			// net1 on the host).
			deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
			ts.settled(t)
		}
		ts.nextStarts(t, "t1-devname-next", t1.network)
	})
}

// otherNADsDevName: cni-args rdmaDevName is the name the other tenant's
// NAD gives its device.
func (ts *tenancy) otherNADsDevName(t *testing.T) {
	t.Run("cni-args rdmaDevName of the other tenant's NAD", func(t *testing.T) {
		t1, t2 := ts.t1, ts.t2
		const job = "rdma_job0"
		ts.nad(t, t2, "t2-job", t2.nic.Netdev, `, "rdmaDevName": "`+job+`"`)
		hostile := toolsPod(t1.ns, "t1-job", selection(t1.network, "cni-args", map[string]any{"rdmaDevName": job}))
		ts.refused(t, hostile, "args.cni.rdmaDevName", strconv.Quote(job), "refused", "nothing was changed")
		ts.runsWith(t, t2, "t2-job", "t2-job", job)
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		ts.settled(t, t2)
		ts.nextStarts(t, "t1-job-next", t1.network, t2)

		// A NAD that lets its pods name their device (podRdmaDevNamePrefix)
		// takes only names with its prefix, and only well-formed ones.
		ts.nad(t, t1, "t1-named", t1.nic.Netdev, `, "podRdmaDevNamePrefix": "t1-"`)
		hostile = toolsPod(t1.ns, "t1-named-job", selection("t1-named", "cni-args", map[string]any{"rdmaDevName": job}))
		ts.refused(t, hostile, "args.cni.rdmaDevName", strconv.Quote(job), "refused", "podRdmaDevNamePrefix", "nothing was changed")
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		ts.settled(t, t2)
		hostile = toolsPod(t1.ns, "t1-named-slash", selection("t1-named", "cni-args", map[string]any{"rdmaDevName": "t1-a/b"}))
		ts.refused(t, hostile, "args.cni.rdmaDevName", strconv.Quote("t1-a/b"), "refused")
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		ts.settled(t, t2)
		ts.runsWith(t, t1, "t1-named-next", selection("t1-named", "cni-args", map[string]any{"rdmaDevName": "t1-job0"}), "t1-job0")

		deletePod(t, t1.ns, "t1-named-next", metav1.DeleteOptions{})
		deletePod(t, t2.ns, "t2-job", metav1.DeleteOptions{})
		// Both devices are back under their own names.
		ts.settled(t)

		// A prefix that t2's name starts with: once t2's network has run a
		// pod on the node, its name is reserved there, and t1's pod cannot
		// take it even while no pod holds it; t2's next pod starts with it.
		ts.nad(t, t1, "t1-squat", t1.nic.Netdev, `, "podRdmaDevNamePrefix": "rdma_"`)
		hostile = toolsPod(t1.ns, "t1-squat", selection("t1-squat", "cni-args", map[string]any{"rdmaDevName": job}))
		ts.refused(t, hostile, "args.cni.rdmaDevName", strconv.Quote(job), "refused", "another network on this node gives its pods that name", "nothing was changed")
		deletePod(t, t1.ns, hostile.Name, metav1.DeleteOptions{})
		ts.settled(t)
		ts.runsWith(t, t2, "t2-job-next", "t2-job", job)
		deletePod(t, t2.ns, "t2-job-next", metav1.DeleteOptions{})
		ts.settled(t)
	})
}

// heldByOtherNamespace: the tenant's operator names in its NAD the device a
// pod of the other namespace holds.
func (ts *tenancy) heldByOtherNamespace(t *testing.T) {
	t.Run("device held by a pod of another namespace", func(t *testing.T) {
		t1, t2 := ts.t1, ts.t2
		held := t2.nic.RDMA
		holderNetns := ts.runsWith(t, t2, "t2-holder", t2.network, held)
		holder, err := cs.CoreV1().Pods(t2.ns).Get(ctx(t), "t2-holder", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sandbox := sandboxOf(t, t2.ns, "t2-holder").Id
		// t1's operator names t2's device in t1's NAD, on t1's NIC.
		ts.nad(t, t1, "t1-thief", t1.nic.Netdev, `, "rdmaDevice": "`+held+`"`)
		// What names the holder beyond its name, searched for in every
		// later t1 pod's events (noLeak).
		t2.secrets = append(t2.secrets, string(holder.UID), sandbox, holderNetns, filepath.Base(holderNetns))
		thief := toolsPod(t1.ns, "t1-thief", "t1-thief")
		ts.refused(t, thief, held, "held by a pod in another namespace", "nothing was changed")
		// t1's NIC came back with the failed ADD's DEL; the holder keeps
		// its device.
		ts.settled(t, t2)
		if in, err := rig.RDMAIn(holderNetns); err != nil || len(in) != 1 || in[0] != held {
			t.Errorf("t2's pod's RDMA devices %v (%v), want [%s]", in, err, held)
		}
		deletePod(t, t1.ns, thief.Name, metav1.DeleteOptions{})
		deletePod(t, t2.ns, "t2-holder", metav1.DeleteOptions{})
		ts.settled(t)
		ts.nextStarts(t, "t1-thief-next", t1.network)
	})
}

// selection is a pod's k8s.v1.cni.cncf.io/networks annotation in its JSON
// form: one network-selection element, of network, with key set to value
// as a tenant writes it.
func selection(network, key string, value any) string {
	// Without HTML escaping, as kubectl writes it: a '<' is one byte of the
	// annotation, not six.
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode([]map[string]any{{"name": network, key: value}}); err != nil {
		panic(err)
	}
	return strings.TrimSpace(b.String())
}

// refused creates a tenant's pod and waits for the event of its refused
// ADD, which says every one of want. The pod stays Pending, and its events
// name no RDMA device of the node but the two tenants'.
func (ts *tenancy) refused(t *testing.T, pod *corev1.Pod, want ...string) {
	t.Helper()
	ts.track(pod)
	startPod(t, pod)
	t.Logf("%s/%s's %s: %s", pod.Namespace, pod.Name, "networks", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
	msg := waitEvent(t, pod.Namespace, pod.Name, want...)
	t.Logf("event: %s", msg)
	if p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx(t), pod.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
		t.Errorf("pod %s/%s: %v %v, want Pending", pod.Namespace, pod.Name, p.Status.Phase, err)
	}
	nics, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	evs := events(t, pod.Namespace, pod.Name)
	for _, n := range nics {
		if n.RDMA != ts.t1.nic.RDMA && n.RDMA != ts.t2.nic.RDMA && strings.Contains(evs, n.RDMA) {
			t.Errorf("pod %s/%s's events name the node's RDMA device %s, which neither tenant has:\n%s", pod.Namespace, pod.Name, n.RDMA, evs)
		}
	}
}

// nextStarts: t1's next pod, on network as a tenant may write it, starts
// with t1's device, and deleting it gives the host its NIC and device back
// (settled, with the away tenants' pods still running).
func (ts *tenancy) nextStarts(t *testing.T, name, network string, away ...*tenant) {
	t.Helper()
	ts.runsWith(t, ts.t1, name, network, ts.t1.nic.RDMA)
	deletePod(t, ts.t1.ns, name, metav1.DeleteOptions{})
	ts.settled(t, away...)
}

// settled waits for the host to have the lane's NICs and RDMA devices
// under their own names, but the NIC and device of each away tenant, whose
// pod holds them, and no netdev or RDMA device it did not have before the
// test (a NIC back as net1, a device under its pod-side name). The other
// lane's NICs come and go meanwhile.
func (ts *tenancy) settled(t *testing.T, away ...*tenant) {
	t.Helper()
	var wrong string
	err := cririg.Wait(time.Minute, "the tenants' NICs and RDMA devices home", func() (bool, error) {
		netdevs, rdma := hostState(t)
		wrong = ts.unsettled(netdevs, rdma, away)
		return wrong == "", nil
	})
	if err != nil {
		t.Fatalf("%v: %s", err, wrong)
	}
}

// unsettled says what of the host's netdevs and RDMA devices settled waits
// for is not so, or "".
func (ts *tenancy) unsettled(netdevs, rdma []string, away []*tenant) string {
	for _, tn := range []*tenant{ts.t1, ts.t2} {
		held := slices.Contains(away, tn)
		for _, d := range []struct {
			kind, name string
			on         []string
		}{
			{"NIC", tn.nic.Netdev, netdevs}, {"RDMA device", tn.nic.RDMA, rdma},
		} {
			if on := slices.Contains(d.on, d.name); on == held {
				return fmt.Sprintf("%s's %s %s on the host: %v, want %v", tn.ns, d.kind, d.name, on, !held)
			}
		}
	}
	for _, d := range []struct {
		kind        string
		now, before []string
	}{
		{"netdev", netdevs, ts.netdevs}, {"RDMA device", rdma, ts.rdma},
	} {
		for _, n := range d.now {
			if !slices.Contains(d.before, n) {
				return fmt.Sprintf("the host has %s %s, which it did not have before the test", d.kind, n)
			}
		}
	}
	return ""
}

// runsWith creates a pod in ns on network and waits for it to be Running
// with dev, alone, in its netns, which it returns.
func runsWith(t *testing.T, ns, name, network, dev string) string {
	t.Helper()
	startPod(t, toolsPod(ns, name, network))
	took := waitRunning(t, ns, name, 3*time.Minute)
	netns := mustNetns(t, ns, name)
	if in, err := rig.RDMAIn(netns); err != nil || len(in) != 1 || in[0] != dev {
		t.Fatalf("pod %s/%s: RDMA devices %v (%v), want [%s]", ns, name, in, err, dev)
	}
	t.Logf("pod %s/%s Running with %s, %s after create", ns, name, dev, took.Round(time.Millisecond))
	return netns
}

// startPod creates the pod and deletes it when the test ends, if the test
// has not.
func startPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	createPod(t, pod)
	t.Cleanup(func() { deletePod(t, pod.Namespace, pod.Name, metav1.DeleteOptions{}) })
}

// createNamespace creates a namespace and deletes it, with all it holds,
// when the test ends.
func createNamespace(t *testing.T, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := cs.CoreV1().Namespaces().Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		err := cririg.Wait(3*time.Minute, "namespace "+name+" gone", func() (bool, error) {
			_, err := cs.CoreV1().Namespaces().Get(ctx(t), name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		if err != nil {
			t.Error(err)
		}
	})
}
