package rig

// Real verbs traffic between pods: the test VM ships Debian's rdma-core
// userspace and perftest, and its rxe sends and receives RoCEv2 in the
// netns its netdev is in (scripts/README.md). The tools run through
// `ip netns exec`, which also remounts /sys for the pod, so libibverbs sees
// exactly the RDMA devices the pod sees, as in a container.

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RoCEv2GID is the GID index of the IPv4 RoCEv2 address of an rxe port
// (index 0 is the IPv6 link-local one). Both peers must use it.
const RoCEv2GID = "1"

// Endpoint is one side of a verbs test: the pod's netns, the RDMA device
// the workload opens by name (as NCCL_IB_HCA would) and the pod's IP on
// that device's netdev.
type Endpoint struct {
	Netns string // path, under /run/netns
	Dev   string
	IP    string
}

// InPod returns a command running argv in the pod's netns with the pod's
// view of /sys. argv[0] is looked up in the guest's PATH.
func InPod(netnsPath string, argv ...string) *exec.Cmd {
	args := append([]string{"netns", "exec", filepath.Base(netnsPath)}, argv...)
	cmd := exec.Command(IPTool, args...)
	// Its own process group: Kill takes `ip netns exec` and the tool.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// Proc is a verbs tool running in a pod.
type Proc struct {
	Cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// Start runs cmd (from InPod) in the background, collecting its output.
func Start(cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Cmd: cmd, done: make(chan struct{})}
	cmd.Stdout = &p.out
	cmd.Stderr = &p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %v", strings.Join(cmd.Args, " "), err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Wait waits up to timeout for the tool to exit and returns its output.
func (p *Proc) Wait(timeout time.Duration) (string, error) {
	select {
	case <-p.done:
		if p.err != nil {
			return p.out.String(), fmt.Errorf("%s: %v", p.name(), p.err)
		}
		return p.out.String(), nil
	case <-time.After(timeout):
		p.Kill()
		return p.out.String(), fmt.Errorf("%s: still running after %s", p.name(), timeout)
	}
}

// name is the command line without InPod's `ip netns exec NAME`.
func (p *Proc) name() string {
	args := p.Cmd.Args
	if len(args) > 3 && args[0] == IPTool && args[1] == "netns" {
		args = args[3:]
	}
	return strings.Join(args, " ")
}

// Exited tells whether the tool has exited.
func (p *Proc) Exited() bool { return Closed(p.done) }

// Closed tells, without waiting, whether done is closed: whether the
// process whose end it marks has ended.
func Closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Kill SIGKILLs the tool's process group, as kubelet kills a pod's
// containers, and waits for it to be gone. The test rxe cannot revoke a
// device from a process that still has it open when the device leaves the
// netns (its disassociate_ucontext is empty), so tests kill a pod's verbs
// processes before its DEL, as Kubernetes does.
func (p *Proc) Kill() {
	if p == nil || p.Cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Output is what the tool printed so far (complete once it exited).
func (p *Proc) Output() string {
	if p.Exited() {
		return p.out.String()
	}
	return "(still running)"
}

// PingPong is what ibv_rc_pingpong reports on one side.
type PingPong struct {
	Bytes       int64
	Iters       int
	Seconds     float64
	UsecPerIter float64
}

var (
	ppBytes = regexp.MustCompile(`(\d+) bytes in ([\d.]+) seconds`)
	ppIters = regexp.MustCompile(`(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter`)
)

// ParsePingPong reads ibv_rc_pingpong's two result lines.
func ParsePingPong(out string) (PingPong, error) {
	b, i := ppBytes.FindStringSubmatch(out), ppIters.FindStringSubmatch(out)
	if b == nil || i == nil {
		return PingPong{}, fmt.Errorf("no ibv_rc_pingpong result in:\n%s", out)
	}
	var r PingPong
	r.Bytes, _ = strconv.ParseInt(b[1], 10, 64)
	r.Iters, _ = strconv.Atoi(i[1])
	r.Seconds, _ = strconv.ParseFloat(i[2], 64)
	r.UsecPerIter, _ = strconv.ParseFloat(i[3], 64)
	return r, nil
}

// PingPongArgs is ibv_rc_pingpong's command line for one side: server is
// the server's IP for the client, empty for the server itself.
func PingPongArgs(dev string, size, iters int, server string) []string {
	argv := []string{"ibv_rc_pingpong", "-d", dev, "-g", RoCEv2GID,
		"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters)}
	if server != "" {
		argv = append(argv, server)
	}
	return argv
}

// StartServer starts the server side of a verbs tool and gives it time to
// listen on its TCP port (the tools exchange QP numbers over TCP first).
func StartServer(ep Endpoint, argv ...string) (*Proc, error) {
	p, err := Start(InPod(ep.Netns, argv...))
	if err != nil {
		return nil, err
	}
	if err := waitListening(ep.Netns, p); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// waitListening waits until a TCP socket listens in the pod on 18515, the
// port both the verbs examples and perftest exchange QP numbers on.
func waitListening(netnsPath string, p *Proc) error {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if p.Exited() {
			return fmt.Errorf("server exited before listening: %s", p.out.String())
		}
		out, err := InPod(netnsPath, "cat", "/proc/net/tcp", "/proc/net/tcp6").Output()
		if err == nil && Listening(string(out), PerftestPort) {
			return nil
		}
	}
	return errors.New("server is not listening on TCP 18515 after 20s")
}

// PerftestPort is the TCP port perftest's tools meet on unless told
// another (-p).
const PerftestPort = 18515

// Listening reports whether tcp, what /proc/net/tcp and /proc/net/tcp6
// read, holds a socket listening (state 0A) on port.
func Listening(tcp string, port int) bool {
	return regexp.MustCompile(fmt.Sprintf(`:%04X 0+:0000 0A`, port)).MatchString(tcp)
}

// RunPingPong runs ibv_rc_pingpong (RC send/receive, size bytes, iters
// round trips) between two pods and returns both sides' figures.
func RunPingPong(server, client Endpoint, size, iters int, timeout time.Duration) (srv, cli PingPong, err error) {
	s, err := StartServer(server, PingPongArgs(server.Dev, size, iters, "")...)
	if err != nil {
		return srv, cli, err
	}
	defer s.Kill()
	c, err := Start(InPod(client.Netns, PingPongArgs(client.Dev, size, iters, server.IP)...))
	if err != nil {
		return srv, cli, err
	}
	cout, cerr := c.Wait(timeout)
	sout, serr := s.Wait(10 * time.Second)
	if cerr != nil || serr != nil {
		return srv, cli, fmt.Errorf("ibv_rc_pingpong: client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout)
	}
	if srv, err = ParsePingPong(sout); err != nil {
		return srv, cli, err
	}
	cli, err = ParsePingPong(cout)
	return srv, cli, err
}

// WriteBW is perftest's ib_write_bw result line.
type WriteBW struct {
	Bytes       int
	Iters       int
	PeakMBps    float64
	AverageMBps float64
	MsgRateMpps float64
	Output      string // all the tool printed
}

var bwLine = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$`)

// ParseWriteBW reads ib_write_bw's result line.
func ParseWriteBW(out string) (WriteBW, error) {
	r := WriteBW{Output: out}
	if err := parseResultLine(bwLine, "ib_write_bw", out, &r.Bytes, &r.Iters, &r.PeakMBps, &r.AverageMBps, &r.MsgRateMpps); err != nil {
		return WriteBW{}, err
	}
	return r, nil
}

// parseResultLine reads a perftest result line that re matches: bytes and
// iterations, then the figures. The conversions cannot fail: re matches
// only numbers there, or "inf", which ParseFloat reads as +Inf.
func parseResultLine(re *regexp.Regexp, tool, out string, bytes, iters *int, figures ...*float64) error {
	m := re.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("no %s result in:\n%s", tool, out)
	}
	*bytes, _ = strconv.Atoi(m[1])
	*iters, _ = strconv.Atoi(m[2])
	for i, f := range figures {
		*f, _ = strconv.ParseFloat(m[3+i], 64)
	}
	return nil
}

// WriteBWArgs is ib_write_bw's command line (server as for PingPongArgs)
// in iteration mode (-n, -F):
// its duration mode (-D) refuses to report under the VM's emulated CPU
// ("Correlation coefficient r^2 < 0.9").
func WriteBWArgs(dev string, size, iters int, server string) []string {
	return perftestArgs("ib_write_bw", dev, size, iters, server)
}

// perftestArgs is a perftest tool's command line in iteration mode: the
// device by name, the port's RoCEv2 GID, no cpufreq warning, size bytes
// iters times; server as for PingPongArgs.
func perftestArgs(tool, dev string, size, iters int, server string) []string {
	argv := []string{tool, "-d", dev, "-x", RoCEv2GID, "-F",
		"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters)}
	if server != "" {
		argv = append(argv, server)
	}
	return argv
}

// SendLat is what ib_send_lat's client reports.
type SendLat struct {
	Bytes       int
	Iters       int
	MinUsec     float64
	MaxUsec     float64
	TypicalUsec float64
	Output      string // all the tool printed
}

// latLine is ib_send_lat's result line: bytes, iterations, t_min, t_max,
// t_typical, then averages and percentiles. The times are "inf" when
// perftest's clock calibration failed (every round trip still ran).
var latLine = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([\d.]+|inf)\s+([\d.]+|inf)\s+([\d.]+|inf)\s+([\d.]+|inf)`)

// ParseSendLat reads ib_send_lat's result line; times perftest could not
// measure are +Inf.
func ParseSendLat(out string) (SendLat, error) {
	r := SendLat{Output: out}
	if err := parseResultLine(latLine, "ib_send_lat", out, &r.Bytes, &r.Iters, &r.MinUsec, &r.MaxUsec, &r.TypicalUsec); err != nil {
		return SendLat{}, err
	}
	return r, nil
}

// SendLatArgs is ib_send_lat's command line (server as for
// PingPongArgs), in iteration mode as WriteBWArgs.
func SendLatArgs(dev string, size, iters int, server string) []string {
	return perftestArgs("ib_send_lat", dev, size, iters, server)
}

// RunWriteBW runs ib_write_bw (RDMA writes of size bytes, iters of them)
// from client to server and returns the client's figures.
//
// perftest converts CPU cycles to time with a clock rate it calibrates at
// start; under the VM's emulated CPU that calibration sometimes fails
// ("Correlation coefficient r^2 < 0.9") and the run reports 0 MB/s although
// every write completed. Such a run is repeated, up to three times.
func RunWriteBW(server, client Endpoint, size, iters int, timeout time.Duration) (WriteBW, error) {
	var bw WriteBW
	var err error
	for try := 0; try < 3; try++ {
		bw, err = runWriteBW(server, client, size, iters, timeout)
		if err != nil || !strings.Contains(bw.Output, "Correlation coefficient r^2") {
			break
		}
	}
	return bw, err
}

func runWriteBW(server, client Endpoint, size, iters int, timeout time.Duration) (WriteBW, error) {
	s, err := StartServer(server, WriteBWArgs(server.Dev, size, iters, "")...)
	if err != nil {
		return WriteBW{}, err
	}
	defer s.Kill()
	c, err := Start(InPod(client.Netns, WriteBWArgs(client.Dev, size, iters, server.IP)...))
	if err != nil {
		return WriteBW{}, err
	}
	cout, cerr := c.Wait(timeout)
	sout, serr := s.Wait(10 * time.Second)
	if cerr != nil || serr != nil {
		return WriteBW{}, fmt.Errorf("ib_write_bw: client: %v\n%s\nserver: %v\n%s", cerr, cout, serr, sout)
	}
	return ParseWriteBW(cout)
}

// SentPackets is the device's RoCE packets sent so far (rxe's sent_pkts
// counter), read in the pod, where the device is.
func SentPackets(ep Endpoint) (int64, error) {
	f := "/sys/class/infiniband/" + ep.Dev + "/ports/1/hw_counters/sent_pkts"
	out, err := InPod(ep.Netns, "cat", f).Output()
	if err != nil {
		return 0, fmt.Errorf("read %s in %s: %v", f, ep.Netns, err)
	}
	return strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
}

// RunRping runs rdma_cm's rping (connection set up by rdma_cm, as MPI and
// UCX do, instead of the verbs examples' TCP exchange) from client to
// server, count pings, and returns how many the client verified. rping
// finds the device from the address, so Endpoint.Dev is not used.
func RunRping(server, client Endpoint, count int, timeout time.Duration) (int, error) {
	n := strconv.Itoa(count)
	s, err := Start(InPod(server.Netns, "rping", "-s", "-a", server.IP, "-C", n, "-v"))
	if err != nil {
		return 0, err
	}
	defer s.Kill()
	// rping listens through rdma_cm, not on a TCP port: give it a moment.
	time.Sleep(time.Second)
	c, err := Start(InPod(client.Netns, "rping", "-c", "-a", server.IP, "-C", n, "-v"))
	if err != nil {
		return 0, err
	}
	cout, cerr := c.Wait(timeout)
	pings := strings.Count(cout, "ping data: rdma-ping-")
	if cerr != nil {
		return pings, fmt.Errorf("rping client: %v\n%s\nserver:\n%s", cerr, cout, s.Output())
	}
	return pings, nil
}
