//go:build e2e

package k8s

// TestTwoNodes's job on the rails' layout takes its NICs from
// ResourceClaims (docs/dra.md): the chart's DRA driver offers each node
// VM's eth1..eth4, each worker's claim from conf's rails template
// (overlays/dra-claimtemplate-rails: nic<k> is eth<k+1>) and conf's
// nad-dra-rails (rdma-dra-rail<k> attaches nic<k> as rdma_r<k>). The rerun
// after node 2's reboot and railsAtARPDefaults take theirs through the
// NADs that name the NIC (jobRails), so both ways run in make test.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

const (
	// railsTemplate is conf/dra-claimtemplate-rails.yaml's template, and
	// railsClaim the workers' name for their claim of it.
	railsTemplate = "rdma-rails-4"
	railsClaim    = "rails"
	netdevAttr    = resourceapi.QualifiedName(draDriver + "/netdev")
)

// claimRails are the job's rails by claim: rail k is the claim's nic<k>,
// the node's eth<k+1>, attached by rdma-dra-rail<k> as rdma_r<k>. Rails 0
// and 1 are rail-optimized (a link each), 2 and 3 share the segment, as
// jobRails's; each has a subnet of its own (nad-dra-rails's static IPAM
// takes any address), and its tuning keeps the shared ones' ARP on their
// own NIC.
var claimRails = []rail{
	{network: "rdma-dra-rail0", nic: "eth1", name: "rdma_r0", subnet: 10},
	{network: "rdma-dra-rail1", nic: "eth2", name: "rdma_r1", subnet: 11},
	{network: "rdma-dra-rail2", nic: "eth3", name: "rdma_r2", subnet: 20},
	{network: "rdma-dra-rail3", nic: "eth4", name: "rdma_r3", subnet: 21},
}

// enableTwoNodeDRA applies the chart with dra.enabled over the installed
// DaemonSet, the driver offering claimRails's NICs (their PCI addresses
// are node 1's, the same on node 2: vm-pair.sh gives both VMs one QEMU
// layout), and conf's DeviceClass, rails template and networks in the
// workers' namespace (applyManifest's default, workersNS). It does not
// wait for the chart's pods (waitTwoNodeDRA), so that they roll out
// while the test does other work. The chart is not put back: the
// two-node stage ends with TestTwoNodes, whose later parts name their
// NICs in NADs and leave the driver's NICs to no claim.
func enableTwoNodeDRA(t *testing.T) {
	t.Helper()
	var pcis []string
	for _, r := range claimRails {
		pcis = append(pcis, nicNamed(t, r.nic).PCI)
	}
	started := time.Now()
	applyChartDRA(t, pcis)
	for _, m := range []string{"dra-deviceclass", "dra-claimtemplate-rails", "nad-dra-rails"} {
		applyManifest(t, m)
	}
	t.Logf("the chart with dra.enabled (NICs %v) and conf's rails by claim applied in %s", pcis, time.Since(started).Round(time.Second))
}

// waitTwoNodeDRA waits for both nodes to run the chart's pods, the DRA
// driver's among them (waitDriverOn), and for the driver to publish
// claimRails's NICs, by their netdevs, for both nodes.
func waitTwoNodeDRA(t *testing.T) {
	t.Helper()
	started := time.Now()
	names := []string{cluster.NodeName(1), cluster.NodeName(2)}
	waitDriverOn(t, true, names...)
	for _, n := range names {
		waitRailsPublished(t, n)
	}
	t.Logf("DRA on both nodes: the driver's pods Ready and their NICs published %s after waiting began", time.Since(started).Round(time.Second))
}

// waitRailsPublished waits for the driver's slice of the node named
// nodeName to hold claimRails's NICs, and only them, by netdev.
func waitRailsPublished(t *testing.T, nodeName string) {
	t.Helper()
	devs := waitSliceOn(t, nodeName, len(claimRails))
	var got, want []string
	for _, attrs := range devs {
		if v := attrText(attrs, netdevAttr); v != "" {
			got = append(got, v)
		}
	}
	for _, r := range claimRails {
		want = append(want, r.nic)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("%s's slice publishes netdevs %v, want %v: %s", nodeName, got, want, attrsText(devs))
	}
}

// claimWorkerPod is an MPI worker holding a claim from the rails
// template.
func claimWorkerPod(w spanWorker) *corev1.Pod {
	p := mpiWorkerPod(w)
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: railsClaim, ResourceClaimTemplateName: new(railsTemplate)}}
	return p
}

// startClaimJob starts the job's two MPI workers on claimRails, each
// with its claim, waits for their sshds and checks each claim's
// allocation (claimsOnRails).
func startClaimJob(t *testing.T) railWorkers {
	t.Helper()
	job := startRailWorkersOf(t, "span-worker", withDevs(t, claimRails), claimWorkerPod)
	job.claims = true
	for _, w := range job.pods {
		waitSSHD(t, w)
	}
	job.claimsOnRails(t)
	return job
}

// claimsOnRails checks, from the API, that each worker's claim is
// allocated on its node with nic<k> the device of that node's slice
// whose netdev is rail k's NIC, and reserved for the worker; then, in the
// worker, that rail k's interface and RDMA device are that device
// (railsInPod).
func (job railWorkers) claimsOnRails(t *testing.T) {
	t.Helper()
	for _, w := range job.pods {
		nodeName := cluster.NodeName(w.node)
		claim := podClaim(t, workersNS, w.name, railsClaim)
		a := claim.Status.Allocation
		if a == nil {
			t.Fatalf("%s's claim %s is not allocated", w.label(), claim.Name)
		}
		if !selectsNode(a.NodeSelector, nodeName) {
			t.Errorf("%s's claim %s: allocated for nodes %+v, want %s", w.label(), claim.Name, a.NodeSelector, nodeName)
		}
		if !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.Resource == "pods" && r.Name == w.name
		}) {
			t.Errorf("%s's claim %s: reserved for %+v, not for the pod", w.label(), claim.Name, claim.Status.ReservedFor)
		}
		published, err := nodeSlices(ctx(t), draDriver, nodeName)
		if err != nil {
			t.Fatal(err)
		}
		attrsOf := map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{} // by pool/device
		for _, s := range published {
			for _, d := range s.Spec.Devices {
				attrsOf[s.Spec.Pool.Name+"/"+d.Name] = d.Attributes
			}
		}
		var got []string
		pcis := make([]string, len(job.rails))
		for k, r := range job.rails {
			req := fmt.Sprintf("nic%d", k)
			i := slices.IndexFunc(a.Devices.Results, func(res resourceapi.DeviceRequestAllocationResult) bool { return res.Request == req })
			if i < 0 {
				t.Errorf("%s's claim %s has no result for request %s: %+v", w.label(), claim.Name, req, a.Devices.Results)
				continue
			}
			res := a.Devices.Results[i]
			attrs, ok := attrsOf[res.Pool+"/"+res.Device]
			nd, pci := attrText(attrs, netdevAttr), attrText(attrs, pciBusIDAttr)
			if res.Driver != draDriver || !ok || nd != r.nic {
				t.Errorf("%s's claim %s: %s is %s/%s/%s (netdev %q in %s's slice), want the device whose netdev is %s",
					w.label(), claim.Name, req, res.Driver, res.Pool, res.Device, nd, nodeName, r.nic)
			}
			pcis[k] = pci
			got = append(got, fmt.Sprintf("%s=%s(%s,%s)", req, res.Device, nd, pci))
		}
		t.Logf("%s's claim %s allocated on %s: %s", w.label(), claim.Name, nodeName, strings.Join(got, " "))
		job.railsInPod(t, w, pcis)
	}
}

// attrText is a device's string attribute, "" when it has none.
func attrText(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, name resourceapi.QualifiedName) string {
	if v := attrs[name].StringValue; v != nil {
		return *v
	}
	return ""
}

// railsInPod checks, in w's pod, that rail k's interface (the one
// Multus's network-status gives for rail k's network) and its RDMA device
// (rail k's name) are both the PCI function pcis[k], the claim's nic<k>
// by its node's slice (pciBusID): what the API allocated is what the pod
// got, read in the pod's own sysfs.
func (job railWorkers) railsInPod(t *testing.T, w spanWorker, pcis []string) {
	t.Helper()
	nodeName := cluster.NodeName(w.node)
	status, raw := networkStatus(t, workersNS, w.name)
	var ifs, paths []string
	for _, r := range job.rails {
		a := attachment(status, workersNS+"/"+r.network, "")
		if a == nil {
			t.Fatalf("%s on %s: network-status has no attachment of %s:\n%s", w.name, nodeName, r.network, raw)
		}
		ifs = append(ifs, a.Interface)
		paths = append(paths, "/sys/class/net/"+a.Interface+"/device", "/sys/class/infiniband/"+r.name+"/device")
	}
	resolved := resolveIn(t, workersNS, w.name, "worker", paths...)
	var got []string
	for k, r := range job.rails {
		nic, dev := node.PCIFunction(resolved[2*k]), node.PCIFunction(resolved[2*k+1])
		if nic != pcis[k] {
			t.Errorf("%s on %s: rail %d's interface %q (%s) is PCI function %q (%s), want the claim's nic%d %q",
				w.name, nodeName, k, ifs[k], r.network, nic, resolved[2*k], k, pcis[k])
		}
		if dev != pcis[k] {
			t.Errorf("%s on %s: rail %d's RDMA device %s is PCI function %q (%s), want its interface %q's, the claim's nic%d %q",
				w.name, nodeName, k, r.name, dev, resolved[2*k+1], ifs[k], k, pcis[k])
		}
		got = append(got, fmt.Sprintf("%s=%s=%s(%s)", r.network, ifs[k], r.name, nic))
	}
	t.Logf("%s on %s, in its sysfs: %s", w.name, nodeName, strings.Join(got, " "))
}

// selectsNode: the allocation's node selector picks the node named
// nodeName by its name, as the allocator writes it for a node's own
// devices.
func selectsNode(sel *corev1.NodeSelector, nodeName string) bool {
	if sel == nil {
		return false
	}
	for _, term := range sel.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && slices.Equal(f.Values, []string{nodeName}) {
				return true
			}
		}
	}
	return false
}

// waitNoClaims waits for the workers' namespace to hold no
// ResourceClaim: the claims generated for deleted pods are deleted.
func waitNoClaims(t *testing.T) {
	t.Helper()
	var left []string
	err := cririg.Wait(2*time.Minute, "no ResourceClaim left in "+workersNS, func() (bool, error) {
		list, err := cs.ResourceV1().ResourceClaims(workersNS).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		left = left[:0]
		for _, c := range list.Items {
			left = append(left, fmt.Sprintf("%s (reserved for %+v)", c.Name, c.Status.ReservedFor))
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v: %v", err, left)
	}
}

// noDRARecords fails t unless both nodes have their record directory and
// no claim record in it, whole or damaged: read here for node 1, asked of
// its agent for node 2.
func noDRARecords(t *testing.T) {
	t.Helper()
	for n := 1; n <= 2; n++ {
		var last nodeNetns
		var lastErr error
		// The driver removes a record when the kubelet unprepares the
		// claim, which may come after the claim is gone from the API.
		err := cririg.Wait(time.Minute, fmt.Sprintf("no DRA claim record on node %d", n), func() (bool, error) {
			last, lastErr = netnsOf(ctx(t), n)
			return lastErr == nil && last.DRADir && len(last.DRARecords) == 0, nil
		})
		if err != nil {
			t.Errorf("%v: %s there %v, holds %v (%v)", err, draRecordDir, last.DRADir, last.DRARecords, lastErr)
		}
	}
}
