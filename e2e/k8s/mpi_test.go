//go:build e2e

package k8s

// An MPI job across the two nodes (twonode_test.go), launched the way the
// MPI Operator launches one: the workers run sshd as an unprivileged user
// with the job's key from a Secret, and mpirun, in worker 0 (the
// operator's runLauncherAsWorker), starts the ranks over ssh. The image
// and the Open MPI settings for rxe: scripts/k8s/mpi-image.sh, docs/mpi.md.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

const (
	// mpiImage is scripts/k8s/mpi-image.sh's image, imported on every node
	// (payload.sh ships it as mpiImageTar).
	mpiImage    = "rdma-netns.test/rdma-mpi:1"
	mpiImageTar = "rdma-mpi-image.tar"
	mpiSecret   = "mpi-job-ssh"
	mpiUID      = 1000 // mpiuser in the image
	// sshdPort is the workers' sshd's (the image's sshd_config.mpi).
	sshdPort = 2222
)

// mpiSecretOf is a job's Secret as the MPI Operator makes one
// (kubernetes.io/ssh-auth) with a new key pair: the private key in
// OpenSSH's PEM form and the public key in authorized_keys form.
func mpiSecretOf() (*corev1.Secret, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "mpi job")
	if err != nil {
		return nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: mpiSecret, Namespace: workersNS},
		Type:       corev1.SecretTypeSSHAuth,
		Data:       map[string][]byte{corev1.SSHAuthPrivateKey: pem.EncodeToMemory(block), "ssh-publickey": ssh.MarshalAuthorizedKey(sshPub)},
	}, nil
}

// putMPISecret replaces the job's Secret with a new key.
func putMPISecret(c context.Context) error {
	s, err := mpiSecretOf()
	if err != nil {
		return err
	}
	_ = cs.CoreV1().Secrets(workersNS).Delete(c, mpiSecret, metav1.DeleteOptions{})
	if _, err := cs.CoreV1().Secrets(workersNS).Create(c, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// createMPISecret creates the job's Secret with a new key.
func createMPISecret(t *testing.T) {
	t.Helper()
	if err := putMPISecret(ctx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Secrets(workersNS).Delete(context.Background(), mpiSecret, metav1.DeleteOptions{})
	})
}

// mpiWorkerPod is spanWorkerPod running the MPI image's sshd as mpiuser,
// the job's key mounted where the image's sshd and ssh look for it (the
// MPI Operator's item names), group-readable through fsGroup: both
// programs accept a key file that another user owns.
func mpiWorkerPod(w spanWorker) *corev1.Pod {
	p := spanWorkerPod(w)
	c := &p.Spec.Containers[0]
	c.Image = mpiImage
	c.Command = []string{"/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config.mpi"}
	c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("512Mi")
	c.VolumeMounts = []corev1.VolumeMount{{Name: "ssh", MountPath: "/home/mpiuser/.ssh", ReadOnly: true}}
	uid := int64(mpiUID)
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid, RunAsNonRoot: new(true)}
	p.Spec.Volumes = []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName:  mpiSecret,
		DefaultMode: new(int32(0o440)),
		Items: []corev1.KeyToPath{
			{Key: corev1.SSHAuthPrivateKey, Path: "id_rsa"},
			{Key: "ssh-publickey", Path: "id_rsa.pub"},
			{Key: "ssh-publickey", Path: "authorized_keys"},
		},
	}}}}
	return p
}

// waitSSHD waits for the worker's sshd to listen.
func waitSSHD(t *testing.T, w spanWorker) {
	t.Helper()
	if err := waitListening(ctx(t), w, []int{sshdPort}, time.Minute); err != nil {
		t.Fatalf("%s's sshd: %v", w.name, err)
	}
}

// allreduce is allreduce.py's line of JSON.
type allreduce struct {
	Ranks        int     `json:"ranks"`
	BytesPerRank int64   `json:"bytes_per_rank"`
	Iterations   int     `json:"iterations"`
	Warmup       int     `json:"warmup"`
	Seconds      float64 `json:"seconds"`
	AlgBW        float64 `json:"algbw_GBps"`
	OK           bool    `json:"ok"`
	BytesSent    int64   `json:"est_bytes_sent_per_rank"`
	MPI          string  `json:"mpi"`
}

// mpiTransport is how the job's ranks talk: over RDMA (the job as users
// run it) or over TCP on the same NIC (the comparison).
type mpiTransport string

const (
	overRDMA mpiTransport = "rdma"
	overTCP  mpiTransport = "tcp"
)

// mpirunArgs is the launcher's command line: one rank on each worker,
// addressed by its net1 address (the pods' cluster network does not cross
// nodes in this rig), daemons started over ssh (the image's ssh_config),
// the out-of-band channel and any TCP on net1.
func mpirunArgs(workers []spanWorker, tr mpiTransport, extra ...string) []string {
	return mpirunWith(workers, mpiTransportArgs[tr], extra...)
}

// mpirunWith is mpirunArgs with the transport's settings given.
func mpirunWith(workers []spanWorker, transport []string, extra ...string) []string {
	hosts := make([]string, len(workers))
	for i, w := range workers {
		hosts[i] = w.ip + ":1"
	}
	argv := []string{"mpirun", "-np", strconv.Itoa(len(workers)), "-H", strings.Join(hosts, ","),
		"--mca", "oob_tcp_if_include", "net1",
		// A rank or daemon lost with its node ends the job: the ssh
		// session that holds the remote daemon gives up on a silent peer
		// after 3 x 5 s. RDMA itself never would on rxe (retry count 7
		// means retry forever there).
		"--mca", "plm_rsh_args", "-o ServerAliveInterval=5 -o ServerAliveCountMax=3",
	}
	argv = append(argv, transport...)
	return append(argv, extra...)
}

// mpiTransportArgs are each transport's settings (docs/mpi.md, "What
// drives rxe"): over RDMA, ucxOver the pod's device; over TCP, Open MPI's
// TCP transport on the same NIC.
var mpiTransportArgs = map[mpiTransport][]string{
	overRDMA: ucxOver(twoNodeName),
	overTCP:  {"--mca", "pml", "ob1", "--mca", "btl", "tcp,self,vader", "--mca", "btl_tcp_if_include", "net1"},
}

// ucxOver is ucxAtDefaultRails with UCX's rail counts raised to the
// devices', so that with several devices (rails) a message's bytes spread
// over all of them: UCX's defaults send eager messages on one and
// rendezvous on two (TestBenchRailsUCX measures what they do on rxe).
func ucxOver(devs ...string) []string {
	argv := ucxAtDefaultRails(devs...)
	if len(devs) > 1 {
		n := strconv.Itoa(len(devs))
		argv = append(argv, "-x", "UCX_MAX_EAGER_RAILS="+n, "-x", "UCX_MAX_RNDV_RAILS="+n)
	}
	return argv
}

// ucxAtDefaultRails is UCX on the pod's RDMA devices devs alone, its UD
// transport (RC needs UD beside it for the wire-up and retransmits on rxe
// until it crawls), UD's destination GID check off (with it UCX drops
// every packet rxe delivers); `--mca pml ucx` also overrides Debian's
// default of excluding UCX, so that a pod without its device fails rather
// than runs over TCP. UCX's rail counts stay its own (UCX 1.13: eager
// messages on one device, rendezvous on two), however many devs.
func ucxAtDefaultRails(devs ...string) []string {
	return []string{"--mca", "pml", "ucx", "-x", "UCX_NET_DEVICES=" + ucxPorts(devs),
		"-x", "UCX_TLS=ud_verbs,self", "-x", "UCX_UD_VERBS_ETH_DGID_CHECK=n"}
}

// ucxPorts is UCX_NET_DEVICES for port 1 of each of devs.
func ucxPorts(devs []string) string {
	ports := make([]string, len(devs))
	for i, d := range devs {
		ports[i] = d + ":1"
	}
	return strings.Join(ports, ",")
}

// runAllreduce runs allreduce.py from worker 0 and returns its result.
func runAllreduce(t *testing.T, workers []spanWorker, tr mpiTransport, bytes, iters int) (allreduce, string) {
	t.Helper()
	return runAllreduceWith(t, workers, string(tr), mpiTransportArgs[tr], bytes, iters)
}

// runAllreduceWith is runAllreduce with the transport's settings given,
// and what to call it in its errors.
func runAllreduceWith(t *testing.T, workers []spanWorker, tr string, transport []string, bytes, iters int) (allreduce, string) {
	t.Helper()
	argv := mpirunWith(workers, transport, "python3", "/usr/local/bin/allreduce.py", "--bytes", strconv.Itoa(bytes), "--iters", strconv.Itoa(iters))
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, stderr, err := execCtx(c, workersNS, workers[0].name, "worker", argv...)
	if err != nil {
		t.Fatalf("mpirun over %s: %v\n%s\n%s", tr, err, out, stderr)
	}
	var r allreduce
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("allreduce.py's result %q: %v", l, err)
			}
		}
	}
	if r.Ranks != len(workers) || !r.OK {
		t.Fatalf("mpirun over %s: result %+v (want %d ranks, every element right)\n%s\n%s", tr, r, len(workers), out, stderr)
	}
	return r, out + stderr
}

// podCounters is the exporter's packet counters of the RDMA devices each
// pod holds, summed (rdma_port_hw_stat_total, rxe's sent_pkts and rcvd_pkts), read
// from the exporter of the pod's node as Prometheus scrapes it: node 1's
// on the loopback, node 2's at its management address.
func podCounters(t *testing.T, workers []spanWorker) map[string][2]int64 {
	t.Helper()
	token := scraperToken(t)
	out := map[string][2]int64{}
	for _, w := range workers {
		url := exporterURL
		if w.node != node.Number {
			url = strings.Replace(exporterURL, "127.0.0.1", mgmtIP(w.node), 1)
		}
		code, body, err := getMetricsAt(url, token)
		if err != nil || code != 200 {
			t.Fatalf("GET %s: %d (%v)\n%.300s", url, code, err, body)
		}
		var c [2]int64
		for i, name := range []string{"sent_pkts", "rcvd_pkts"} {
			v, ok := counterOf(body, name, w.name)
			if !ok {
				t.Fatalf("%s (node %d's exporter) has no %s for pod %s:\n%s", url, w.node, name, w.name, grepLines(body, "rdma_port_hw_stat_total"))
			}
			c[i] = v
		}
		out[w.name] = c
	}
	return out
}

var hwStat = regexp.MustCompile(`(?m)^rdma_port_hw_stat_total\{([^}]*)\} (\d+)`)

// counterOf is a pod's counter in an exposition, summed over the RDMA
// devices it holds (its rails).
func counterOf(body, counter, pod string) (int64, bool) {
	var sum int64
	found := false
	for _, m := range hwStat.FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], `counter="`+counter+`"`) && strings.Contains(m[1], `pod="`+pod+`"`) && strings.Contains(m[1], `namespace="`+workersNS+`"`) {
			v, err := strconv.ParseInt(m[2], 10, 64)
			if err != nil {
				return 0, false
			}
			sum += v
			found = true
		}
	}
	return sum, found
}

// activeMTU is the RDMA path MTU of the worker's device dev (ibv_devinfo's
// active_mtu): the most payload one RoCE packet carries.
func activeMTU(t *testing.T, w spanWorker, dev string) int64 {
	t.Helper()
	out, stderr, err := execIn(t, workersNS, w.name, "worker", "ibv_devinfo", "-d", dev)
	if err != nil {
		t.Fatalf("%s: ibv_devinfo: %v\n%s", w.name, err, stderr)
	}
	m := regexp.MustCompile(`active_mtu:\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s: no active_mtu in ibv_devinfo:\n%s", w.name, out)
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}

// allreduceOverRDMA runs an allreduce across the two nodes over RDMA
// through the moved devices, UCX on every rail: each pod's devices (read
// from our exporter on its node) must send and receive at least as many
// RoCE packets as the bytes the job moved need at the path MTU, and with
// several rails each rail's device a quarter of an even share of them
// (its sysfs counters). The same job over TCP on the same NICs must move
// (almost) nothing over RDMA.
func (job railWorkers) allreduceOverRDMA(t *testing.T) {
	workers := job.pods[:]
	mtu := activeMTU(t, workers[0], job.rails[0].name)

	const size, iters = 1 << 20, 5
	transports := []struct {
		name string
		args []string
	}{{"RDMA", job.ucx()}, {"TCP", mpiTransportArgs[overTCP]}}
	var results [2]allreduce
	var moved [2]map[string][2]int64
	var perRail [2][]railCounters // the RDMA run's, per worker and rail
	for i, tr := range transports {
		before := podCounters(t, workers)
		var railsBefore [2][]railCounters // per rail, read around the RDMA run only
		if i == 0 {
			railsBefore = job.countersNow(t)
		}
		r, out := runAllreduceWith(t, workers, tr.name, tr.args, size, iters)
		after := podCounters(t, workers)
		results[i] = r
		moved[i] = map[string][2]int64{}
		for _, wk := range workers {
			moved[i][wk.name] = [2]int64{after[wk.name][0] - before[wk.name][0], after[wk.name][1] - before[wk.name][1]}
		}
		if i == 0 {
			perRail = job.countersSince(t, railsBefore)
		}
		t.Logf("allreduce over %s: %d ranks, %d B x %d (+%d warm-up) in %.2f s (%.4f GB/s algbw), each rank sent ~%d B; RoCE packets sent/received: %v\n%s",
			tr.name, r.Ranks, r.BytesPerRank, r.Iterations, r.Warmup, r.Seconds, r.AlgBW, r.BytesSent, moved[i], lastLines(out, 5))
	}
	// At least the job's bytes at the path MTU, in both directions, on
	// both pods: the RDMA run moved its data over RDMA.
	need := results[0].BytesSent / mtu
	for _, w := range workers {
		if d := moved[0][w.name]; d[0] < need || d[1] < need {
			t.Errorf("allreduce over RDMA: %s's devices sent %d and received %d RoCE packets, want >= %d each (%d B at MTU %d)",
				w.name, d[0], d[1], need, results[0].BytesSent, mtu)
		}
		// The TCP run's data went over the NIC's netdev, not its RDMA
		// device: a tenth of the bound is far above anything but data.
		if d := moved[1][w.name]; d[0] > need/10 || d[1] > need/10 {
			t.Errorf("allreduce over TCP: %s's devices sent %d and received %d RoCE packets, want (almost) none (< %d)", w.name, d[0], d[1], need/10)
		}
	}
	if len(job.rails) > 1 {
		share := need / int64(4*len(job.rails))
		var per []string
		for w, wk := range workers {
			for k, r := range job.rails {
				d := perRail[w][k]
				per = append(per, fmt.Sprintf("%s %s %d/%d", wk.name, r.name, d.RDMASent, d.RDMARcvd))
				if d.RDMASent < share || d.RDMARcvd < share {
					t.Errorf("allreduce over every rail: %s's %s sent %d and received %d RoCE packets, want >= %d each (a quarter of an even share of %d over %d rails)",
						wk.name, r.name, d.RDMASent, d.RDMARcvd, share, need, len(job.rails))
				}
			}
		}
		t.Logf("allreduce over RDMA, RoCE packets sent/received per rail: %s", strings.Join(per, ", "))
	}
	t.Logf("allreduce of %d B x %d: RDMA %.2f s, TCP %.2f s (TCP/RDMA time %.2f)", size, iters, results[0].Seconds, results[1].Seconds, results[1].Seconds/results[0].Seconds)
}

// importMPIImage imports the MPI image into this node's containerd (the
// other nodes import it when they join).
func importMPIImage(t *testing.T) {
	t.Helper()
	if err := node.ImportImage(node.ManifestDir + "/" + mpiImageTar); err != nil {
		t.Fatal(err)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// rebootMidJob reboots node 2 in the middle of the job: the job
// must fail, promptly and saying so, rather than hang; the node must come
// back (on a boot other than bootID) with every rail's device and NIC home (its
// pod's netns died with the old kernel); then the job's pods are deleted,
// as a job controller deletes them, and both nodes' devices are home.
// With claims, node 2 must run the DRA driver's pod again
// first: the kubelet frees a deleted pod's claim through the driver
// (NodeUnprepareResources), so the pod and its claim are gone only then.
// Node 2 reboots through its agent: nothing is stopped, as with
// `reboot -f`.
//
// What ends the job is Open MPI losing its daemon on node 2 (the ssh
// session's keepalive, mpirunArgs): RDMA alone would not, since rxe, like
// the InfiniBand spec for RNR retries, takes a retry count of 7 (what Open
// MPI and perftest ask for) as "retry forever" for transport retries too,
// so a write to a vanished peer never completes with an error.
func (job railWorkers) rebootMidJob(t *testing.T, bootID string) {
	workers := job.pods[:]
	// Long enough to outlast the reboot request under the emulated CPU.
	argv := mpirunWith(workers, job.ucx(), "python3", "/usr/local/bin/allreduce.py", "--bytes", strconv.Itoa(1<<20), "--iters", "100000")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		so, se, err := execCtx(c, workersNS, workers[0].name, "worker", argv...)
		done <- result{so + se, err}
	}()
	job.waitSending(t, workers[0])
	resp, err := agent(ctx(t), 2, http.MethodPost, "/reboot")
	if err != nil {
		t.Fatalf("reboot node 2: %v", err)
	}
	resp.Body.Close()
	rebooted := time.Now()
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("the allreduce completed although node 2 rebooted in the middle:\n%s", r.out)
		}
		t.Logf("the job failed %s after node 2's reboot began: %v\n%s", time.Since(rebooted).Round(time.Second), r.err, lastLines(r.out, 8))
	case <-time.After(5 * time.Minute):
		t.Fatalf("mpirun still running 5 minutes after node 2 rebooted: the job hangs")
	}

	after := waitJoined(t, 2, bootID)
	t.Logf("node 2 Ready on its next boot %s after the reboot began", time.Since(rebooted).Round(time.Second))
	for _, r := range job.rails {
		if !rig.Contains(after.RDMA, r.dev) || !rig.Contains(after.Links, r.nic) {
			t.Errorf("node 2 after its reboot: RDMA %v, links %v; want %s and %s home", after.RDMA, after.Links, r.dev, r.nic)
		}
	}
	if p, err := cs.CoreV1().Pods(workersNS).Get(ctx(t), workers[1].name, metav1.GetOptions{}); err == nil {
		t.Logf("%s after node 2's reboot: %s", workers[1].name, p.Status.Phase)
	}
	if job.claims {
		name := cluster.NodeName(2)
		waitDriverOn(t, true, name)
		waitRailsPublished(t, name)
		t.Logf("node 2's driver pod Ready and its NICs published %s after the reboot began", time.Since(rebooted).Round(time.Second))
	}
	job.stop(t)
}
