package scripts

// The two-VM link's sockets (scripts/link-sockets.pl, vm-run.sh --link,
// vm-pair.sh): each socket's own receive buffer, and the host's
// net.core.rmem_default left as it was, even when the pair is killed.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const rmemDefaultFile = "/proc/sys/net/core/rmem_default"

// linkRmem is vm-run.sh's LINK_RMEM default: the buffer the link needs.
const linkRmem = 4 << 20

// socketProbe, run by perl, prints for each fd argument its socket's
// local address, peer address and SO_RCVBUF: what a program exec'd by
// link-sockets.pl (QEMU) finds on that descriptor.
const socketProbe = `use Socket qw(SOL_SOCKET SO_RCVBUF unpack_sockaddr_in inet_ntoa);
for my $fd (@ARGV) {
    open(my $h, "+<&=", $fd) or do { print "$fd closed\n"; next };
    my ($lp, $la) = unpack_sockaddr_in(getsockname($h));
    my $peer = getpeername($h);
    my $p = "none";
    if ($peer) { my ($rp, $ra) = unpack_sockaddr_in($peer); $p = inet_ntoa($ra) . ":$rp" }
    printf "%d %s:%d %s %d\n", $fd, inet_ntoa($la), $lp, $p, unpack("i", getsockopt($h, SOL_SOCKET, SO_RCVBUF));
}`

func readRmemDefault(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(rmemDefaultFile)
	if err != nil {
		t.Skipf("cannot read the host's rmem_default: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// hostRmemUnchanged fails the test if the host's net.core.rmem_default
// moved while it ran.
func hostRmemUnchanged(t *testing.T) {
	t.Helper()
	before := readRmemDefault(t)
	t.Cleanup(func() {
		if after := readRmemDefault(t); after != before {
			t.Errorf("the host's net.core.rmem_default went from %s to %s", before, after)
		}
	})
}

// freeUDPPorts returns n UDP ports on 127.0.0.1 that were free a moment
// ago, each followed by a free one (a link's local and peer port).
func freeUDPPorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		p := c.LocalAddr().(*net.UDPAddr).Port
		c.Close()
		if c2, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p + 1}); err == nil {
			c2.Close()
			ports = append(ports, p)
		}
	}
	return ports
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (SO_RCVBUFFORCE, as vm-run.sh runs)")
	}
}

func TestLinkSocketsOwnBuffer(t *testing.T) {
	needRoot(t)
	hostRmemUnchanged(t)
	ps := freeUDPPorts(t, 2)
	spec := func(fd, p int) string { return fmt.Sprintf("%d:127.0.0.1:%d:%d", fd, p, p+1) }

	for _, tc := range []struct {
		name string
		rmem string
		want string // SO_RCVBUF
	}{
		{"LINK_RMEM default", strconv.Itoa(linkRmem), strconv.Itoa(linkRmem)},
		{"LINK_RMEM=0: the host's default", "0", readRmemDefault(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("./link-sockets.pl", "--rmem", tc.rmem, spec(10, ps[0]), spec(11, ps[1]),
				"--", "perl", "-e", socketProbe, "10", "11", "12")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("link-sockets.pl: %v\n%s", err, stderr.String())
			}
			want := fmt.Sprintf("10 127.0.0.1:%d 127.0.0.1:%d %s\n11 127.0.0.1:%d 127.0.0.1:%d %s\n12 closed\n",
				ps[0], ps[0]+1, tc.want, ps[1], ps[1]+1, tc.want)
			if string(out) != want {
				t.Errorf("the exec'd command found on its fds (fd local peer SO_RCVBUF):\n%s\nwant:\n%s", out, want)
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr: %s", stderr.String())
			}
		})
	}
}

func TestLinkSocketsPortInUse(t *testing.T) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.LocalAddr().(*net.UDPAddr).Port
	out, err := exec.Command("./link-sockets.pl", fmt.Sprintf("10:127.0.0.1:%d:%d", p, p+1), "--", "true").CombinedOutput()
	if err == nil {
		t.Fatalf("link-sockets.pl ran its command with UDP 127.0.0.1:%d held by another socket (two VMs would share it)", p)
	}
	if w := fmt.Sprintf("cannot bind UDP 127.0.0.1:%d", p); !strings.Contains(string(out), w) {
		t.Errorf("output %q does not say %q", out, w)
	}
}

// TestLinkSocketsQEMU: QEMU takes link-sockets.pl's socket as a dgram
// netdev and keeps it working after frames to a peer not yet up were
// refused (ICMP port unreachable on a connected socket), both ways. A hub
// joins the link to a second dgram netdev that the test speaks to, in
// place of a guest.
func TestLinkSocketsQEMU(t *testing.T) {
	needRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64 (scripts/apt.sh install qemu-system-x86)")
	}
	hostRmemUnchanged(t)
	ps := freeUDPPorts(t, 2)
	link, peer, tap, us := ps[0], ps[0]+1, ps[1], ps[1]+1
	lo := func(p int) *net.UDPAddr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p} }
	usConn, err := net.ListenUDP("udp4", lo(us))
	if err != nil {
		t.Fatal(err)
	}
	defer usConn.Close()

	cmd := exec.Command("./link-sockets.pl", "--rmem", strconv.Itoa(linkRmem), fmt.Sprintf("10:127.0.0.1:%d:%d", link, peer), "--",
		qemu, "-machine", "none", "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "none",
		"-netdev", "dgram,id=link,local.type=fd,local.str=10",
		"-netdev", fmt.Sprintf("dgram,id=tap,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d", tap, us),
		"-netdev", "hubport,hubid=0,id=p0,netdev=link", "-netdev", "hubport,hubid=0,id=p1,netdev=tap")
	var qout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &qout, &qout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill(); <-exited }()

	// QEMU is up once its tap socket is bound (link-sockets.pl bound the
	// link's before QEMU started).
	deadline := time.Now().Add(20 * time.Second)
	for !udpBound(t, tap) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("qemu exited (%v) without taking the netdevs:\n%s", err, qout.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu did not bind UDP %d in 20 s:\n%s", tap, qout.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rb := ssRcvbuf(t, link); rb != "" && rb != strconv.Itoa(linkRmem) {
		t.Errorf("ss: the link socket QEMU holds has rb%s, want rb%d", rb, linkRmem)
	}

	// The peer is not up: each frame QEMU sends on the link is refused.
	for i := 0; i < 5; i++ {
		if _, err := usConn.WriteToUDP([]byte("before the peer"), lo(tap)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	peerConn, err := net.ListenUDP("udp4", lo(peer))
	if err != nil {
		t.Fatal(err)
	}
	defer peerConn.Close()
	// Out (guest to peer) and back (peer to guest), each retried until it
	// arrives: a frame that meets a slow QEMU is simply lost.
	expectFrame(t, "out", usConn, lo(tap), peerConn, link)
	expectFrame(t, "back", peerConn, lo(link), usConn, tap)
}

// expectFrame sends a frame from `from` to `to` until `at` receives it
// from port src.
func expectFrame(t *testing.T, what string, from *net.UDPConn, to *net.UDPAddr, at *net.UDPConn, src int) {
	t.Helper()
	frame := []byte("frame " + what)
	buf := make([]byte, 2048)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		if _, err := from.WriteToUDP(frame, to); err != nil {
			t.Fatal(err)
		}
		_ = at.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, addr, err := at.ReadFromUDP(buf)
		if err != nil {
			continue
		}
		if addr.Port != src || !bytes.Equal(buf[:n], frame) {
			t.Fatalf("%s: got %q from %v, want %q from port %d", what, buf[:n], addr, frame, src)
		}
		return
	}
	t.Fatalf("%s: no frame through QEMU's link in 10 s", what)
}

// udpBound reports whether a UDP socket is bound to port p (/proc/net/udp).
func udpBound(t *testing.T, p int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, fmt.Appendf(nil, ":%04X ", p))
}

// ssRcvbuf is the receive buffer (ss -m's rb) of the UDP socket on port
// p, or "" without ss.
func ssRcvbuf(t *testing.T, p int) string {
	t.Helper()
	if _, err := exec.LookPath("ss"); err != nil {
		return ""
	}
	out, err := exec.Command("ss", "-Huanm", fmt.Sprintf("sport = :%d", p)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	s := string(out)
	i := strings.Index(s, ",rb")
	if i < 0 {
		t.Fatalf("ss -m shows no rb for UDP port %d: %q", p, s)
	}
	s = s[i+3:]
	return s[:strings.IndexByte(s, ',')]
}

// TestVMPairLeavesRmemDefault: vm-pair.sh killed with SIGKILL while its
// two VMs run (a CI timeout) leaves net.core.rmem_default as it found
// it, and the VMs never saw it changed. The pair runs in a mount
// namespace of its own over a stand-in rmem_default file, with stand-in
// VMs (a vm-run.sh that records the value and waits): whatever the script
// does, the host's own setting is out of its reach.
func TestVMPairLeavesRmemDefault(t *testing.T) {
	needRoot(t)
	hostRmemUnchanged(t)
	dir := t.TempDir()
	fake := filepath.Join(dir, "rmem_default")
	const was = "212992" // Linux's default, below the link's 4 MiB
	if err := os.WriteFile(fake, []byte(was+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "-m", "--propagation", "private", "mount", "--bind", fake, rmemDefaultFile).CombinedOutput(); err != nil {
		t.Skipf("cannot bind-mount over %s in a mount namespace of its own: %v %s", rmemDefaultFile, err, out)
	}
	script, err := os.ReadFile("vm-pair.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vm-pair.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	// vm-pair.sh runs it as vm-run.sh --node N ...
	vm := `#!/bin/sh
echo $$ > "$FAKE_DIR/pid$2"
cat ` + rmemDefaultFile + ` > "$FAKE_DIR/seen$2.tmp" && mv "$FAKE_DIR/seen$2.tmp" "$FAKE_DIR/seen$2"
i=0
while [ ! -e "$FAKE_DIR/stop" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
`
	if err := os.WriteFile(filepath.Join(dir, "vm-run.sh"), []byte(vm), 0o755); err != nil {
		t.Fatal(err)
	}
	// vm-pair.sh prepares the VMs' kernel and initramfs once for both.
	for name, body := range map[string]string{
		"vm-prepare.sh":     "#!/bin/sh\necho VM_CACHE_DIR=" + dir + "\n",
		"vm-prepare-cri.sh": "#!/bin/sh\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	ps := freeUDPPorts(t, 1)
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" `+rmemDefaultFile+` && exec "$2/vm-pair.sh" "$2/out" "$3" "-- true" "-- true"`,
		"sh", fake, dir, strconv.Itoa(ps[0]))
	cmd.Env = append(os.Environ(), "FAKE_DIR="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
		waitGone(t, dir)
	}()
	for end := time.Now().Add(30 * time.Second); !exists(dir, "seen1") || !exists(dir, "seen2"); {
		if time.Now().After(end) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the pair's VMs did not start in 30 s:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// unshare and sh exec'd vm-pair.sh: this is the pair's own process.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	for _, f := range []string{"seen1", "seen2"} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		if got := strings.TrimSpace(string(b)); got != was {
			t.Errorf("node %s's VM ran with net.core.rmem_default %s, want %s as the host had it", f[4:], got, was)
		}
	}
	b, _ := os.ReadFile(fake)
	if got := strings.TrimSpace(string(b)); got != was {
		t.Errorf("after vm-pair.sh was killed, net.core.rmem_default is %s, want %s as it was", got, was)
	}
}

func exists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// waitGone waits up to 5 s for the stand-in VMs (pid1, pid2) to end.
func waitGone(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"pid1", "pid2"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for end := time.Now().Add(5 * time.Second); pid > 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				break
			}
		}
	}
}
