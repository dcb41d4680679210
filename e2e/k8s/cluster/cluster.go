// Package cluster runs the control plane of the e2e tests' one-node
// cluster on the build host's loopback: etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, built by scripts/k8s/build.sh.
// kubelet runs in the test VM (package node) and reaches the API server
// through the VM's restricted user-mode NIC (scripts/vm-run.sh --k8s-api),
// the only way out of the guest.
//
// Why on the host: the VM is emulated (TCG, 2 vCPUs); the API server and
// etcd there would take the CPU the pods and kubelet under test need, and
// would make every figure the suite prints about pods slower for reasons
// that are not ours. The host runs them natively in a couple of seconds.
package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The addresses the guest uses: vm-run.sh's user-mode NIC forwards
// GuestAPIServer to the host's API server port, and the host's
// 127.0.0.N:KubeletPort to node N's kubelet (exec, logs): kubelet
// listens on the same port in the guest and reports it in the Node's
// status, which is where the API server takes the port from. The first
// node is named localhost, and the API server prefers the Hostname
// address, so it dials localhost:KubeletPort (kubelet refuses a loopback
// --node-ip); further nodes are named by their address (NodeName).
const (
	GuestAPIServer = "10.0.2.100:6443"
	ServiceCIDR    = "10.96.0.0/16"
	// serviceIP is the kubernetes Service's address, the first of ServiceCIDR.
	serviceIP = "10.96.0.1"
)

// Config says where the binaries are and where to write.
type Config struct {
	BinDir string // kube-apiserver, etcd, ... (scripts/k8s/build.sh)
	Dir    string // state, certificates, kubeconfigs, logs (emptied first)
	// GuestDir receives what the node needs, for the VM's payload: ca.crt,
	// kubelet.conf and admin.conf, both pointing at GuestAPIServer.
	GuestDir      string
	APIServerPort int
	EtcdPort      int // client port; the peer port is the next one
	// KubeletPort is kubelet's port, the same on the host (forwarded) and
	// in the guest; written to GuestDir/kubelet-port for the node. Distinct
	// ports let two suites run side by side on one machine.
	KubeletPort int
	// Nodes is how many nodes (VMs) join the cluster (0 is 1): each gets
	// its kubelet identity, KubeletConf(n) in GuestDir, and its kubelet
	// port forwarded from KubeletAddr(n).
	Nodes int
	// Args are further flags of a component, by its binary's name, after
	// the suite's own: make bench-cluster, which has no kubelet, runs the
	// controller-manager's resourceclaim controller alone (a node
	// lifecycle controller would taint its kubelet-less nodes) and raises
	// the clients' request rates, as Kubernetes' scheduler_perf does.
	Args map[string][]string
}

// NodeName is node n's name (1 for the first). The API server dials a
// node by its name (the Hostname address kubelet reports), and nodes
// after the first are named by the loopback address their kubelet's port
// is forwarded from: an address resolves to itself, and the host's
// /etc/hosts stays untouched.
func NodeName(n int) string {
	if n <= 1 {
		return FirstNodeName
	}
	return KubeletAddr(n)
}

// FirstNodeName is the first node's name, localhost, which the suite's
// one-node runs and the README's examples use.
const FirstNodeName = "localhost"

// KubeletAddr is the host address node n's kubelet port is forwarded
// from (vm-run.sh --node n --k8s-api): 127.0.0.n.
func KubeletAddr(n int) string {
	return fmt.Sprintf("127.0.0.%d", max(n, 1))
}

// KubeletConf is the file name, in GuestDir, of node n's kubelet
// kubeconfig (its client certificate names the node).
func KubeletConf(n int) string {
	if n <= 1 {
		return "kubelet.conf"
	}
	return fmt.Sprintf("kubelet-%d.conf", n)
}

// kubeletCert is the name of node n's kubelet client certificate in the PKI.
func kubeletCert(n int) string {
	return strings.TrimSuffix(KubeletConf(n), ".conf")
}

// DefaultKubeletPort is kubelet's usual port.
const DefaultKubeletPort = 10250

// ControlPlane is the running control plane.
type ControlPlane struct {
	cfg   Config
	procs []*proc
	// Admin is the admin kubeconfig on the host (127.0.0.1).
	Admin string
	// Ready is how long the API server took to answer /readyz.
	Ready time.Duration
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start writes the certificates and kubeconfigs and starts etcd, the API
// server, the controller-manager and the scheduler. On error what was
// started is stopped.
func Start(cfg Config) (*ControlPlane, error) {
	if cfg.KubeletPort == 0 {
		cfg.KubeletPort = DefaultKubeletPort
	}
	cfg.Nodes = max(cfg.Nodes, 1)
	if cfg.Nodes > 200 {
		return nil, fmt.Errorf("%d nodes: at most 200 (vm-run.sh --node)", cfg.Nodes)
	}
	for _, p := range []int{cfg.APIServerPort, cfg.EtcdPort, cfg.EtcdPort + 1} {
		if err := portFree("127.0.0.1", p); err != nil {
			return nil, err
		}
	}
	for n := 1; n <= cfg.Nodes; n++ {
		if err := portFree(KubeletAddr(n), cfg.KubeletPort); err != nil {
			return nil, err
		}
	}
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, err
	}
	pki := filepath.Join(cfg.Dir, "pki")
	for _, d := range []string{pki, filepath.Join(cfg.Dir, "logs"), cfg.GuestDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := writePKI(pki, cfg.Nodes); err != nil {
		return nil, fmt.Errorf("certificates: %v", err)
	}
	cp := &ControlPlane{cfg: cfg, Admin: filepath.Join(cfg.Dir, "admin.conf")}
	host := fmt.Sprintf("https://127.0.0.1:%d", cfg.APIServerPort)
	guest := "https://" + GuestAPIServer
	kubeconfigs := []struct{ path, server, cert string }{
		{cp.Admin, host, "admin"},
		{filepath.Join(cfg.Dir, "controller-manager.conf"), host, "controller-manager"},
		{filepath.Join(cfg.Dir, "scheduler.conf"), host, "scheduler"},
		{filepath.Join(cfg.GuestDir, "admin.conf"), guest, "admin"},
	}
	for n := 1; n <= cfg.Nodes; n++ {
		kubeconfigs = append(kubeconfigs, struct{ path, server, cert string }{filepath.Join(cfg.GuestDir, KubeletConf(n)), guest, kubeletCert(n)})
	}
	for _, kc := range kubeconfigs {
		if err := writeKubeconfig(kc.path, kc.server, pki, kc.cert); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %v", kc.path, err)
		}
	}
	if err := copyFile(filepath.Join(pki, "ca.crt"), filepath.Join(cfg.GuestDir, "ca.crt")); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.GuestDir, "kubelet-port"), []byte(strconv.Itoa(cfg.KubeletPort)+"\n"), 0o644); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			cp.Stop()
		}
	}()
	started := time.Now()
	if err := cp.start("etcd", cp.etcdArgs()...); err != nil {
		return nil, err
	}
	if err := cp.start("kube-apiserver", cp.apiserverArgs(pki)...); err != nil {
		return nil, err
	}
	if err := cp.waitReady(90 * time.Second); err != nil {
		return nil, err
	}
	cp.Ready = time.Since(started)
	if err := cp.start("kube-controller-manager", cp.controllerManagerArgs(pki)...); err != nil {
		return nil, err
	}
	if err := cp.start("kube-scheduler",
		"--kubeconfig", filepath.Join(cfg.Dir, "scheduler.conf"),
		"--authentication-kubeconfig", filepath.Join(cfg.Dir, "scheduler.conf"),
		"--authorization-kubeconfig", filepath.Join(cfg.Dir, "scheduler.conf"),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0"); err != nil {
		return nil, err
	}
	ok = true
	return cp, nil
}

func (cp *ControlPlane) etcdArgs() []string {
	client := fmt.Sprintf("http://127.0.0.1:%d", cp.cfg.EtcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", cp.cfg.EtcdPort+1)
	return []string{
		"--name", "e2e", "--data-dir", filepath.Join(cp.cfg.Dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "e2e=" + peer,
		// A test cluster's state is thrown away with it: no fsync, which
		// on a shared machine is most of etcd's latency.
		"--unsafe-no-fsync",
	}
}

func (cp *ControlPlane) apiserverArgs(pki string) []string {
	f := func(name string) string { return filepath.Join(pki, name) }
	return []string{
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", cp.cfg.EtcdPort),
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(cp.cfg.APIServerPort),
		// Otherwise it advertises the machine's address in the kubernetes
		// Service's endpoints.
		"--advertise-address", "127.0.0.1",
		"--tls-cert-file", f("apiserver.crt"), "--tls-private-key-file", f("apiserver.key"),
		"--client-ca-file", f("ca.crt"),
		// As clusters run: the node's kubelet is limited to its own node
		// and pods, and the RBAC of the manifests we apply is checked.
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		// conf/daemonset.yaml's init container is privileged.
		"--allow-privileged=true",
		"--service-account-key-file", f("sa.pub"),
		"--service-account-signing-key-file", f("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-cluster-ip-range", ServiceCIDR,
		"--kubelet-client-certificate", f("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", f("apiserver-kubelet-client.key"),
		// The node is "localhost" and its InternalIP is the guest's
		// user-mode address, which the host cannot reach: Hostname first
		// makes exec and logs go to 127.0.0.1:KubeletPort, forwarded to kubelet.
		"--kubelet-preferred-address-types", "Hostname,InternalIP",
		"--cert-dir", filepath.Join(cp.cfg.Dir, "apiserver-certs"),
		// The kubernetes Service's endpoint would be 127.0.0.1, which the
		// API refuses (loopback), every ten seconds in the log; nothing in
		// the node reaches the API server through that Service anyway
		// (no kube-proxy), but through the user-mode NIC.
		"--endpoint-reconciler-type", "none",
	}
}

func (cp *ControlPlane) controllerManagerArgs(pki string) []string {
	f := func(name string) string { return filepath.Join(pki, name) }
	kc := filepath.Join(cp.cfg.Dir, "controller-manager.conf")
	return []string{
		"--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0",
		// One identity per controller, so that their RBAC is what clusters use.
		"--use-service-account-credentials",
		"--service-account-private-key-file", f("sa.key"),
		"--root-ca-file", f("ca.crt"),
		"--cluster-signing-cert-file", f("ca.crt"), "--cluster-signing-key-file", f("ca.key"),
		"--service-cluster-ip-range", ServiceCIDR,
	}
}

// writePKI writes the CA and every certificate, a kubelet's for each of
// nodes.
func writePKI(dir string, nodes int) error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.certPEM(), 0o644); err != nil {
		return err
	}
	if err := ca.writeKey(filepath.Join(dir, "ca.key")); err != nil {
		return err
	}
	leaves := map[string]leaf{
		"apiserver": {cn: "kube-apiserver", server: true,
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
			ips: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(strings.Split(GuestAPIServer, ":")[0]), net.ParseIP(serviceIP)}},
		"apiserver-kubelet-client": {cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		"admin":                    {cn: "kubernetes-admin", orgs: []string{"system:masters"}},
		"controller-manager":       {cn: "system:kube-controller-manager"},
		"scheduler":                {cn: "system:kube-scheduler"},
	}
	for n := 1; n <= max(nodes, 1); n++ {
		leaves[kubeletCert(n)] = leaf{cn: "system:node:" + NodeName(n), orgs: []string{"system:nodes"}}
	}
	for name, l := range leaves {
		if err := ca.writeSigned(dir, name, l); err != nil {
			return err
		}
	}
	return writeServiceAccountKeys(dir)
}

// writeKubeconfig writes a self-contained kubeconfig (certificates
// embedded) for the client certificate pki/NAME.crt.
func writeKubeconfig(path, server, pki, name string) error {
	read := func(f string) ([]byte, error) { return os.ReadFile(filepath.Join(pki, f)) }
	ca, err := read("ca.crt")
	if err != nil {
		return err
	}
	crt, err := read(name + ".crt")
	if err != nil {
		return err
	}
	key, err := read(name + ".key")
	if err != nil {
		return err
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	c.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	c.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: name}
	c.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*c, path)
}

func (cp *ControlPlane) start(name string, args ...string) error {
	logf, err := os.Create(filepath.Join(cp.cfg.Dir, "logs", name+".log"))
	if err != nil {
		return err
	}
	args = append(args, cp.cfg.Args[name]...)
	cmd := exec.Command(filepath.Join(cp.cfg.BinDir, name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	cp.procs = append(cp.procs, p)
	return nil
}

// waitReady polls the API server's /readyz until it answers ok.
func (cp *ControlPlane) waitReady(timeout time.Duration) error {
	cs, err := cp.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, p := range cp.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited (%v): see %s", p.name, p.cmd.ProcessState, cp.LogPath(p.name))
			default:
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && strings.TrimSpace(string(body)) == "ok" {
			return nil
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %v (last: %v): see %s", timeout, last, cp.LogPath("kube-apiserver"))
}

// Client is an admin client of the API server.
func (cp *ControlPlane) Client() (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Admin)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// LogPath is where a component's output goes.
func (cp *ControlPlane) LogPath(name string) string {
	return filepath.Join(cp.cfg.Dir, "logs", name+".log")
}

// CPU is the CPU time (user + system) each component has used so far,
// read from /proc, for the suite's figures.
func (cp *ControlPlane) CPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, p := range cp.procs {
		if d, err := CPUTime(p.cmd.Process.Pid); err == nil {
			out[p.name] = d
		}
	}
	return out
}

// Stop stops the components in reverse order: SIGTERM, then SIGKILL after
// ten seconds.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		Terminate(cp.procs[i].cmd, cp.procs[i].done)
	}
	cp.procs = nil
}

// Terminate stops the process of cmd, whose waiter closes done: SIGTERM,
// then SIGKILL after ten seconds. It returns once the process is gone.
func Terminate(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// CPUTime is the CPU time (user + system, all threads) process pid has
// used, from /proc/PID/stat.
func CPUTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14, stime 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	// USER_HZ is 100 on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

func portFree(addr string, port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("port %s:%d is taken (%v): stop what listens there or choose other ports", addr, port, err)
	}
	return l.Close()
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o644)
}
