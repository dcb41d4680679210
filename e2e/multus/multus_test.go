//go:build e2e

package multus

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	netfake "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/client/clientset/versioned/fake"
	"gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/k8sclient"
	"gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/logging"
	"gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

const (
	namespace = "rdma"
	// Where Multus (through the network-attachment-definition
	// client) puts the device-info files it passes to plugins, and where a
	// device plugin leaves its own.
	cniDevInfoDir = "/run/k8s.cni.cncf.io/devinfo/cni"
	dpDevInfoDir  = "/run/k8s.cni.cncf.io/devinfo/dp"
	// The kubelet's device manager checkpoint, which Multus reads for a
	// NAD's resourceName when the pod-resources socket is absent.
	checkpointFile = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
	podResources   = "/var/lib/kubelet/pod-resources/kubelet.sock"
	multusCacheDir = "/var/lib/cni/multus"
)

var nics []rig.NIC

func TestMain(m *testing.M) {
	var err error
	if nics, err = rig.Layout(); err != nil || len(nics) < 4 {
		fmt.Fprintf(os.Stderr, "multus e2e: needs the test VM's %s with at least 4 NICs (got %d, %v); run `make e2e`\n", rig.LayoutF, len(nics), err)
		os.Exit(2)
	}
	if lvl := os.Getenv("MULTUS_LOG_LEVEL"); lvl != "" {
		logging.SetLogLevel(lvl)
	}
	logging.SetLogStderr(true)
	code := m.Run()
	if err := nodeClean(); err != nil {
		fmt.Fprintf(os.Stderr, "multus e2e: FAIL: end-of-suite check: %v\n", err)
		code = 1
	} else {
		fmt.Println("multus e2e: end-of-suite check: every RDMA device and netdev is back in the host, no records or device-info files left")
	}
	os.Exit(code)
}

// nodeClean checks what a pod that came and went must not leave behind.
func nodeClean() error {
	missing, err := rig.Missing(nics)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("not in the host: %s", strings.Join(missing, ", "))
	}
	if recs := rig.Records(rig.StateDir); len(recs) > 0 {
		return fmt.Errorf("attachment records left in %s: %v", rig.StateDir, recs)
	}
	if left := files(cniDevInfoDir); len(left) > 0 {
		return fmt.Errorf("device-info files left in %s: %v", cniDevInfoDir, left)
	}
	return nil
}

func files(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestMultusPlainAnnotation: the pod names a host-device + rdma-netns NAD
// and nothing else. Multus runs the chain, rdma-netns finds the RDMA device
// through net1, and — with no deviceID anywhere — Multus passes no
// device-info file, so network-status has no device-info.
func TestMultusPlainAnnotation(t *testing.T) {
	n := nics[1]
	nad := newNAD("rdma-net", "", hostDevice(map[string]any{"device": n.Netdev}, 11), rdmaNetns(t, true))
	p := startPod(t, "plain", "rdma-net", nad)

	status := p.add(t)
	p.assertAttached(t, n)
	p.assertResolvedBy(t, "by netdev net1")
	st := status.find(t, namespace+"/rdma-net")
	if st.Interface != "net1" {
		t.Errorf("network-status interface %q, want net1", st.Interface)
	}
	if st.DeviceInfo != nil {
		t.Errorf("network-status has device-info %+v without any deviceID; Multus passes no CNIDeviceInfoFile then", *st.DeviceInfo)
	}
	p.delTwice(t, n)
}

// TestMultusSelectionDeviceID: the pod's network-selection element names
// the NIC by PCI address. Multus hands it to every plugin that declares the
// deviceID capability and passes a CNIDeviceInfoFile, which rdma-netns
// writes and Multus copies into network-status. The deviceID is the pod's
// own pick, which host-device followed too, so rdma-netns holds it to the
// network's allowedPodDevices and moves the device it names.
func TestMultusSelectionDeviceID(t *testing.T) {
	n := nics[2]
	hd := hostDevice(map[string]any{"capabilities": map[string]any{"deviceID": true}}, 12)
	rn := rdmaNetns(t, true)
	rn["allowedPodDevices"] = []string{n.RDMA}
	nad := newNAD("rdma-net-pci", "", hd, rn)
	sel := fmt.Sprintf(`[{"name": "rdma-net-pci", "deviceID": %q}]`, n.PCI)
	p := startPod(t, "selection", sel, nad)

	status := p.add(t)
	p.assertAttached(t, n)
	p.assertResolvedBy(t, "by runtimeConfig.deviceID "+n.PCI)
	st := status.find(t, namespace+"/rdma-net-pci")
	want := nadv1.PciDevice{PciAddress: n.PCI, RdmaDevice: n.RDMA}
	assertDeviceInfo(t, st, want)
	p.delTwice(t, n)
}

// TestMultusResourceName: the NAD carries a resourceName; the kubelet's
// device manager checkpoint says which device the pod was allocated, and a
// device plugin left a device-info file for it. Multus injects deviceID and
// pciBusID into every plugin, copies the device plugin's file to the path it
// passes, and rdma-netns adds rdma-device keeping the device plugin's
// fields.
func TestMultusResourceName(t *testing.T) {
	n := nics[3]
	const resource = "example.com/rdma_nic"
	// host-device gets the NIC only from the pciBusID Multus injects.
	nad := newNAD("rdma-net-res", resource, hostDevice(nil, 13), rdmaNetns(t, true))
	p := startPod(t, "resource", "rdma-net-res", nad)

	if _, err := os.Stat(podResources); err == nil {
		t.Fatalf("%s exists: Multus would ask it instead of the checkpoint", podResources)
	}
	writeFile(t, checkpointFile, checkpoint(p.pod, "worker", resource, n.PCI))
	// What a device plugin leaves, including a field rdma-netns does not
	// know about from the Multus side (pf-pci-address): it must survive.
	dpFile := filepath.Join(dpDevInfoDir, strings.ReplaceAll(resource, "/", "-")+"-"+n.PCI+"-device.json")
	writeFile(t, dpFile, []byte(fmt.Sprintf(`{"type":"pci","version":"1.1.0","pci":{"pci-address":%q,"pf-pci-address":"0000:00:1f.0"}}`, n.PCI)))

	status := p.add(t)
	p.assertAttached(t, n)
	p.assertResolvedBy(t, "by runtimeConfig.deviceID "+n.PCI)
	st := status.find(t, namespace+"/rdma-net-res")
	want := nadv1.PciDevice{PciAddress: n.PCI, PfPciAddress: "0000:00:1f.0", RdmaDevice: n.RDMA}
	assertDeviceInfo(t, st, want)
	p.delTwice(t, n)
}

// hostDevice is the host-device entry with a static address; extra adds
// how it finds its NIC.
func hostDevice(extra map[string]any, addr int) map[string]any {
	hd := map[string]any{
		"type": "host-device",
		"ipam": map[string]any{
			"type":      "static",
			"addresses": []map[string]any{{"address": fmt.Sprintf("10.100.%d.2/24", addr)}},
		},
	}
	for k, v := range extra {
		hd[k] = v
	}
	return hd
}

// rdmaNetns is the rdma-netns entry as conf/ spells it, logging to a file
// per test so the resolution rule can be checked.
func rdmaNetns(t *testing.T, deviceID bool) map[string]any {
	caps := map[string]any{"CNIDeviceInfoFile": true}
	if deviceID {
		caps["deviceID"] = true
	}
	return map[string]any{"type": "rdma-netns", "capabilities": caps, "logFile": logPath(t), "logLevel": "debug"}
}

// logPath is the test's log file, in the node's log directory (the only
// place rdma-netns writes one), a plain name there.
func logPath(t *testing.T) string {
	return "/var/log/rdma-netns/multus-" + strings.ReplaceAll(t.Name(), "/", "_") + ".log"
}

func newNAD(name, resource string, plugins ...map[string]any) *nadv1.NetworkAttachmentDefinition {
	conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins})
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: string(conf)},
	}
	if resource != "" {
		nad.Annotations = map[string]string{"k8s.v1.cni.cncf.io/resourceName": resource}
	}
	return nad
}

// checkpoint is the kubelet device manager's checkpoint as Multus reads it:
// one container of the pod was allocated deviceID from resource.
func checkpoint(pod *v1.Pod, container, resource, deviceID string) []byte {
	type entry struct {
		PodUID        string
		ContainerName string
		ResourceName  string
		DeviceIDs     map[int64][]string
		AllocResp     []byte
	}
	cp := map[string]any{
		"Data": map[string]any{
			"PodDeviceEntries": []entry{{
				PodUID: string(pod.UID), ContainerName: container, ResourceName: resource,
				DeviceIDs: map[int64][]string{0: {deviceID}},
			}},
			"RegisteredDevices": map[string][]string{resource: {deviceID}},
		},
		"Checksum": 0,
	}
	b, _ := json.Marshal(cp)
	return b
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

// pod is one pod: its object in the fake API, its sandbox netns, and the
// Multus invocation a runtime would make for it.
type pod struct {
	pod    *v1.Pod
	netns  *rig.Pod
	client *k8sclient.ClientInfo
	args   *skel.CmdArgs
}

// startPod puts the pod (with its k8s.v1.cni.cncf.io/networks annotation)
// and the NADs into a fake API server and creates the sandbox netns.
func startPod(t *testing.T, name, networks string, nads ...*nadv1.NetworkAttachmentDefinition) *pod {
	t.Helper()
	os.Remove(logPath(t))
	k8sPod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, UID: types.UID("uid-" + name),
			Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": networks},
		},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "worker", Image: "busybox"}}},
	}
	client := &k8sclient.ClientInfo{
		Client:        fake.NewSimpleClientset(k8sPod),
		NetClient:     netfake.NewSimpleClientset(),
		EventRecorder: record.NewFakeRecorder(100),
	}
	// Created through the API rather than seeded into the fake: the
	// tracker would guess the resource name "networkattachmentdefinitions"
	// and Multus's lookup of network-attachment-definitions would miss.
	for _, n := range nads {
		if _, err := client.NetClient.K8sCniCncfIoV1().NetworkAttachmentDefinitions(namespace).Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sandbox, err := rig.NewPod()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A failed test must not strand its NIC in a dead netns for the
		// next one: destroying the netns returns it, under a new name.
		if err := sandbox.Destroy(); err != nil {
			t.Errorf("destroy pod netns: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		if err := rig.RestoreNetdevNames(nics); err != nil {
			t.Errorf("restore netdev names: %v", err)
		}
		os.RemoveAll(filepath.Join(multusCacheDir, "sandbox-"+name))
	})
	// The Multus configuration: loopback stands in for the cluster network
	// (the first, master delegate); the NADs come from the pod annotation.
	conf := `{"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus",
	  "binDir": "` + rig.CNIBinDir + `",
	  "delegates": [{"cniVersion": "1.0.0", "name": "cluster", "type": "loopback"}]}`
	args := &skel.CmdArgs{
		ContainerID: "sandbox-" + name,
		Netns:       sandbox.Path(),
		IfName:      "eth0",
		Path:        rig.CNIBinDir,
		Args: fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=sandbox-%s;K8S_POD_UID=%s",
			namespace, name, name, k8sPod.UID),
		StdinData: []byte(conf),
	}
	return &pod{pod: k8sPod, netns: sandbox, client: client, args: args}
}

// add runs Multus ADD, with the real plugin binaries from /opt/cni/bin, and
// returns the network-status Multus wrote to the pod.
func (p *pod) add(t *testing.T) networkStatus {
	t.Helper()
	if _, err := multus.CmdAdd(p.args, nil, p.client); err != nil {
		t.Fatalf("Multus ADD: %v\nrdma-netns log:\n%s", err, readLog(t))
	}
	got, err := p.client.Client.CoreV1().Pods(namespace).Get(t.Context(), p.pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw := got.Annotations[nadv1.NetworkStatusAnnot]
	t.Logf("network-status: %s", raw)
	var st networkStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("network-status annotation %q: %v", raw, err)
	}
	return st
}

type networkStatus []nadv1.NetworkStatus

func (s networkStatus) find(t *testing.T, name string) nadv1.NetworkStatus {
	t.Helper()
	for _, st := range s {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("network-status has no entry for %s: %+v", name, s)
	return nadv1.NetworkStatus{}
}

func assertDeviceInfo(t *testing.T, st nadv1.NetworkStatus, want nadv1.PciDevice) {
	t.Helper()
	di := st.DeviceInfo
	if di == nil || di.Pci == nil {
		t.Fatalf("network-status for %s has no pci device-info: %+v", st.Name, di)
	}
	if di.Type != "pci" || di.Version != "1.1.0" || *di.Pci != want {
		t.Errorf("device-info = type %q version %q pci %+v, want type pci version 1.1.0 pci %+v", di.Type, di.Version, *di.Pci, want)
	}
}

// assertAttached: the NIC is net1 in the pod with its RDMA device, and
// neither is left in the host.
func (p *pod) assertAttached(t *testing.T, n rig.NIC) {
	t.Helper()
	podRDMA, err := rig.RDMAIn(p.netns.Path())
	if err != nil {
		t.Fatal(err)
	}
	podNet, err := rig.NetdevsIn(p.netns.Path())
	if err != nil {
		t.Fatal(err)
	}
	if !rig.Contains(podRDMA, n.RDMA) || !rig.Contains(podNet, "net1") {
		t.Errorf("pod has RDMA %v and netdevs %v, want %s and net1", podRDMA, podNet, n.RDMA)
	}
	hostRDMA, _ := rig.RDMAIn("")
	hostNet, _ := rig.NetdevsIn("")
	if rig.Contains(hostRDMA, n.RDMA) || rig.Contains(hostNet, n.Netdev) {
		t.Errorf("host still has RDMA %v / netdevs %v, want %s and %s gone", hostRDMA, hostNet, n.RDMA, n.Netdev)
	}
}

func (p *pod) assertResolvedBy(t *testing.T, rule string) {
	t.Helper()
	if log := readLog(t); !strings.Contains(log, rule) {
		t.Errorf("rdma-netns log does not say %q:\n%s", rule, log)
	}
}

func readLog(t *testing.T) string {
	b, _ := os.ReadFile(logPath(t))
	return string(b)
}

// delTwice runs Multus DEL twice, as a runtime retrying a sandbox removal
// does. The first DEL uses Multus's cached delegates and the results libcni
// cached at ADD; the second finds neither and re-runs the chains from the
// pod's annotation, without prevResult.
func (p *pod) delTwice(t *testing.T, n rig.NIC) {
	t.Helper()
	if err := multus.CmdDel(p.args, nil, p.client); err != nil {
		t.Fatalf("Multus DEL: %v\nrdma-netns log:\n%s", err, readLog(t))
	}
	p.assertReleased(t, n, "DEL")
	// libcni deletes in reverse order, so rdma-netns runs first and an
	// error from host-device means rdma-netns succeeded. host-device v1.10.0
	// fails its own repeated DEL ("failed to find net1"); that is the only
	// error allowed, and nothing may come back.
	err := multus.CmdDel(p.args, nil, p.client)
	t.Logf("repeated Multus DEL: %v", err)
	if err != nil && !strings.Contains(err.Error(), `plugin type="host-device" failed (delete)`) {
		t.Errorf("repeated Multus DEL failed, and not in host-device: %v", err)
	}
	p.assertReleased(t, n, "repeated DEL")
}

func (p *pod) assertReleased(t *testing.T, n rig.NIC, verb string) {
	t.Helper()
	hostRDMA, _ := rig.RDMAIn("")
	hostNet, _ := rig.NetdevsIn("")
	podRDMA, _ := rig.RDMAIn(p.netns.Path())
	if !rig.Contains(hostRDMA, n.RDMA) || !rig.Contains(hostNet, n.Netdev) || len(podRDMA) > 0 {
		t.Errorf("after %s: host RDMA %v, host netdevs %v, pod RDMA %v; want %s and %s in the host", verb, hostRDMA, hostNet, podRDMA, n.RDMA, n.Netdev)
	}
	if recs := rig.Records(rig.StateDir); len(recs) > 0 {
		t.Errorf("after %s: records left: %v", verb, recs)
	}
	if left := files(cniDevInfoDir); len(left) > 0 {
		t.Errorf("after %s: device-info files left in %s: %v", verb, cniDevInfoDir, left)
	}
}
