// Package node runs the e2e cluster's node in the test VM: containerd as
// e2e/cri/cririg sets it up, and kubelet, named localhost (the first
// node) or by its address (cluster.NodeName), registered with the API
// server on the host (package cluster) through the VM's user-mode NIC. It
// only works inside the test VM booted with vm-run.sh --k8s-api; which
// node the VM is comes from vm-run.sh --node (VM_NODE in /etc/vm.conf).
package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
)

// Paths in the guest: what cluster.Config.GuestDir holds is shipped in the
// payload as ConfDir.
const (
	ConfDir    = "/payload/k8s"
	Dir        = "/run/k8s-node"
	KubeletBin = "/usr/local/bin/kubelet"
	// NodeIP is the guest's address on the user-mode NIC (vm-run.sh).
	NodeIP = "10.0.2.15"
	// AdminKubeconfig is an admin's kubeconfig for the tests.
	AdminKubeconfig = ConfDir + "/admin.conf"
	// RDMALabelKey and RDMALabelValue are the label the chart's DaemonSet
	// selects its nodes by (rdmaNodeLabel), which Node Feature Discovery
	// puts on nodes with an NVIDIA/Mellanox NIC. The VM's RDMA devices
	// are soft-RoCE, which NFD does not see, so kubelet registers the node
	// with it, as an operator labels an RDMA node of another make.
	RDMALabelKey   = "feature.node.kubernetes.io/rdma.capable"
	RDMALabelValue = "true"
)

// Number is which node this VM is (vm-run.sh --node), Name its name and
// ClusterSubnet its pods' cluster network (eth0), one /24 of 10.244.0.0/16
// per node as a cluster's pod CIDR allocation would give.
var (
	Number        = vmNode()
	Name          = cluster.NodeName(Number)
	ClusterSubnet = fmt.Sprintf("10.244.%d.0/24", Number-1)
)

// The two-node rig's layout (vm-run.sh --rails and --arp-defaults,
// scripts/README.md). Rails is how many test NICs are rails of their own:
// eth1..ethRails, NIC k on a link of its own with the peer node's NIC k
// (rail-optimized, one segment per rail); eth0 (the management addresses)
// and the NICs after the rails share the base link. 0 without --rails:
// every test NIC on one segment. ARPDefaults says the node's
// arp_ignore/arp_announce, and so its pods', were left at the kernel's
// 0/0 (a real node's defaults); otherwise a node on a link has 1/2.
var (
	Rails       = vmConfInt(vmConf, "VM_RAILS", 0, 0)
	ARPDefaults = vmConfValue(vmConf, "VM_ARP_DEFAULTS") == "1"
)

// VMTimeout is how long vm-run.sh lets this VM run before it kills it
// (--timeout, VM_TIMEOUT), 0 outside the test VM.
var VMTimeout = time.Duration(vmConfInt(vmConf, "VM_TIMEOUT", 1, 0)) * time.Second

// RailsLayoutMissing says what this VM lacks of the rails' layout with
// rails rails of their own, ARP at the kernel's defaults and nics NICs
// (vm-run.sh --rails, --arp-defaults, --nics), as /etc/vm.conf says: ""
// when it has it all.
func RailsLayoutMissing(rails, nics int) string { return railsMissing(vmConf, rails, nics) }

func railsMissing(conf string, rails, nics int) string {
	var why []string
	if n := vmConfInt(conf, "VM_RAILS", 0, 0); n < rails {
		why = append(why, fmt.Sprintf("VM_RAILS=%d, want %d (vm-run.sh --rails %d)", n, rails, rails))
	}
	if vmConfValue(conf, "VM_ARP_DEFAULTS") != "1" {
		why = append(why, "no VM_ARP_DEFAULTS=1 (vm-run.sh --arp-defaults)")
	}
	if n := vmConfInt(conf, "VM_NICS", 0, 0); n < nics {
		why = append(why, fmt.Sprintf("VM_NICS=%d, want %d (vm-run.sh --nics %d)", n, nics, nics))
	}
	if len(why) == 0 {
		return ""
	}
	return "/etc/vm.conf has " + strings.Join(why, ", ")
}

// vmConf is the guest's /etc/vm.conf, written by vm-run.sh ("" outside
// the test VM).
var vmConf = func() string {
	data, _ := os.ReadFile("/etc/vm.conf")
	return string(data)
}()

// vmNode reads VM_NODE (1 when absent, as vm-run.sh's default).
func vmNode() int { return vmConfInt(vmConf, "VM_NODE", 1, 1) }

// vmConfValue is key's value in conf (KEY=VALUE lines, shell syntax as
// vm-run.sh writes them: double quotes around a value with spaces), ""
// when absent.
func vmConfValue(conf, key string) string {
	for _, l := range strings.Split(conf, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}

// vmConfInt is key's value in conf as a number no less than least, def when
// absent or not such a number.
func vmConfInt(conf, key string, least, def int) int {
	if n, err := strconv.Atoi(vmConfValue(conf, key)); err == nil && n >= least {
		return n
	}
	return def
}

// UsernsHandler is the node's runtime handler for user-namespaced pods
// (hostUsers: false), runc at versions.env's RUNC_VERSION
// (scripts/k8s/build.sh, in the payload as UsernsRunc). The node's own
// runc, Debian bookworm's 1.1.5, has no idmapped mounts: containerd then
// reports, and kubelet refuses, user namespaces for its handlers.
const (
	UsernsHandler = "runc-userns"
	UsernsRunc    = "/usr/local/bin/runc-userns"
)

// ContainerdConfig is the node's containerd config on top of the suite's
// (cririg.WriteConfig; its Options.Extra): UsernsHandler, with
// NoPivotRoot as cririg gives every handler (the guest's root is an
// initramfs).
var ContainerdConfig = fmt.Sprintf(`[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
  runtime_type = 'io.containerd.runc.v2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
  BinaryName = %[2]q
  NoPivotRoot = true
`, UsernsHandler, UsernsRunc)

// kubeletConfig is the node's KubeletConfiguration. What the test VM needs
// on top of a node's defaults:
//   - cgroupfs, as containerd's runc here (no systemd in the guest);
//   - no local storage accounting: the guest root is an initramfs, whose
//     capacity cadvisor cannot measure;
//   - memory the only eviction signal, for the same reason;
//   - client certificates from the cluster's CA, and the API server's
//     kubelet client (system:masters) allowed everything.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: ` + ConfDir + `/ca.crt
authorization:
  mode: AlwaysAllow
failSwapOn: false
localStorageCapacityIsolation: false
evictionHard:
  memory.available: 50Mi
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
registerNode: true
`

// nodeFiles are what a node's root has and the initramfs lacks: kubelet
// reads /etc/passwd and /etc/group for its user-namespace mappings (the
// kubelet user's subordinate IDs; it fails to start without them), and
// cadvisor reports /etc/machine-id as the node's machine ID.
var nodeFiles = map[string]string{
	"/etc/passwd":     "root:x:0:0:root:/root:/bin/sh\n",
	"/etc/group":      "root:x:0:\n",
	"/etc/machine-id": "5f2e0c5e6b1d4c0a9a7e3d2b1c0f9e8d\n",
}

// prepareRoot makes the guest's root what a node's is: the files above,
// and / a shared mount (systemd does that on a node), without which kubelet
// refuses the DaemonSet's HostToContainer mounts of /run/netns.
func prepareRoot() error {
	if err := syscall.Mount("", "/", "", syscall.MS_SHARED|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("make / a shared mount: %v", err)
	}
	return writeNodeFiles()
}

func writeNodeFiles() error {
	for path, content := range nodeFiles {
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Kubelet is a running kubelet.
type Kubelet struct {
	cmd     *exec.Cmd
	done    chan struct{}
	Log     string
	Started time.Time
}

// StartKubelet writes the config and starts kubelet (containerd must run).
func StartKubelet() (*Kubelet, error) {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return nil, err
	}
	if err := prepareRoot(); err != nil {
		return nil, err
	}
	cfg := filepath.Join(Dir, "kubelet.yaml")
	if err := os.WriteFile(cfg, []byte(kubeletConfig), 0o644); err != nil {
		return nil, err
	}
	k := &Kubelet{Log: filepath.Join(Dir, "kubelet.log"), done: make(chan struct{})}
	logf, err := os.OpenFile(k.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	port, err := kubeletPort()
	if err != nil {
		logf.Close()
		return nil, err
	}
	k.cmd = exec.Command(KubeletBin,
		"--config", cfg,
		"--port", port,
		"--kubeconfig", filepath.Join(ConfDir, cluster.KubeletConf(Number)),
		"--hostname-override", Name,
		// kubelet refuses a loopback node IP; the API server reaches it by
		// its name, "localhost" or 127.0.0.N (the host's <addr>:<port>,
		// forwarded here).
		"--node-ip", NodeIP,
		// A kubelet may set labels of the node.kubernetes.io namespace
		// and its subdomains on its own node (NodeRestriction allows them).
		"--node-labels", RDMALabelKey+"="+RDMALabelValue,
		"--v", "1")
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start kubelet: %v", err)
	}
	k.Started = time.Now()
	go func() {
		_ = k.cmd.Wait()
		logf.Close()
		close(k.done)
	}()
	return k, nil
}

// kubeletPort is the port the cluster chose (ConfDir/kubelet-port): the
// host forwards the same port here, and the API server dials the one
// kubelet reports in the Node's status.
func kubeletPort() (string, error) {
	data, err := os.ReadFile(filepath.Join(ConfDir, "kubelet-port"))
	if err != nil {
		return "", fmt.Errorf("kubelet's port: %v (written by the cluster, rdma-netns-k8s-cluster -guest-dir)", err)
	}
	port := strings.TrimSpace(string(data))
	if _, err := strconv.Atoi(port); err != nil {
		return "", fmt.Errorf("kubelet's port %q in %s/kubelet-port is not a number", port, ConfDir)
	}
	return port, nil
}

// Pid is kubelet's process ID.
func (k *Kubelet) Pid() int { return k.cmd.Process.Pid }

// Alive says whether kubelet is still running.
func (k *Kubelet) Alive() bool { return !rig.Closed(k.done) }

// Stop stops kubelet (SIGTERM, SIGKILL after ten seconds). Pods keep
// running in containerd, as on a node.
func (k *Kubelet) Stop() {
	cluster.Terminate(k.cmd, k.done)
}

// LogTail is the last n lines of kubelet's log, for failure messages.
func (k *Kubelet) LogTail(n int) string { return Tail(k.Log, n) }

// Tail is the last n lines of file ("" if it cannot be read).
func Tail(file string, n int) string {
	data, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ManifestDir holds the manifests of conf/ as the tests apply them
// (e2e/k8s/overlays rendered by scripts/k8s/payload.sh) and the
// DaemonSet's image.
const ManifestDir = "/payload/k8s-manifests"

// ImportImage imports an OCI archive into containerd's CRI namespace,
// unpacked for the native snapshotter, as a registry pull would leave it.
func ImportImage(archive string) error {
	// Bounded: an import that hangs on containerd must fail the step, not
	// the whole suite's time.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/usr/local/bin/ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io",
		"images", "import", "--local", "--snapshotter", "native", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %v\n%s", archive, err, out)
	}
	return nil
}

// The pods' cluster network (eth0): a ptp network with host-local IPAM,
// written into /etc/cni/net.d as a cluster's network plugin would. It
// sorts before conf/containerd's rdma-eth0.conflist, so that it is the
// node's primary network, which Multus's daemon finds and delegates eth0 to.
const (
	ClusterNetworkConf = "/etc/cni/net.d/10-cluster.conflist"
	// MultusConf is the configuration Multus's daemon generates
	// (multusConfigFile: auto) from the primary network: containerd then
	// runs multus-shim for every pod.
	MultusConf = "/etc/cni/net.d/00-multus.conf"
)

const clusterNetwork = `{
  "cniVersion": "1.0.0",
  "name": "cluster",
  "plugins": [
    {"type": "ptp", "ipam": {"type": "host-local", "subnet": %q}}
  ]
}
`

// InstallClusterNetwork writes the cluster network's configuration.
func InstallClusterNetwork() error {
	return os.WriteFile(ClusterNetworkConf, []byte(fmt.Sprintf(clusterNetwork, ClusterSubnet)), 0o644)
}

// The kubernetes Service as the node's host-network pods reach it
// (in-cluster config: KUBERNETES_SERVICE_HOST and _PORT, which kubelet sets
// from the Service's cluster IP). There is no kube-proxy: ServiceForward
// stands in for it on this one Service.
const (
	ServiceIP   = "10.96.0.1"
	ServicePort = "443"
)

// ServiceForward puts the kubernetes Service's cluster IP on the node's
// loopback and forwards each connection to it, in user space, to the API
// server as the guest reaches it (cluster.GuestAPIServer, QEMU's forward
// to the host's loopback): the guest reaches nothing else. Multus's
// daemon, a host-network pod, talks to the API server through it. Close
// the listener to stop it.
func ServiceForward() (net.Listener, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	addr, err := netlink.ParseAddr(ServiceIP + "/32")
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrReplace(lo, addr); err != nil {
		return nil, fmt.Errorf("add the kubernetes Service's IP %s to lo: %v", ServiceIP, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ServiceIP, ServicePort))
	if err != nil {
		return nil, fmt.Errorf("listen on the kubernetes Service's %s:%s: %v", ServiceIP, ServicePort, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go forward(c, cluster.GuestAPIServer)
		}
	}()
	return ln, nil
}

// forward copies a connection both ways to dst until either side closes.
func forward(c net.Conn, dst string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", dst, 10*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}
