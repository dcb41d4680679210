package rig

import (
	"math"
	"strings"
	"testing"
)

// ib_send_lat's result line as perftest 4.5 prints it, timed and, when its
// clock calibration failed, with every time "inf": both parse, the second
// as +Inf, so that a run whose round trips all completed is not mistaken
// for a failed one.
func TestParseSendLat(t *testing.T) {
	timed, err := ParseSendLat(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n" +
		" 2       500          272.50         8084.24      377.10   \t       1033.06     \t1358.03\t\t6153.84 \t\t8084.24\n")
	if err != nil || timed.Bytes != 2 || timed.Iters != 500 || timed.TypicalUsec != 377.10 || timed.MinUsec != 272.50 {
		t.Errorf("timed line: %+v, %v", timed, err)
	}
	untimed, err := ParseSendLat(" 2       500          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    \nCorrelation coefficient r^2: 0.71 < 0.9\n")
	if err != nil || untimed.Iters != 500 || !math.IsInf(untimed.TypicalUsec, 1) {
		t.Errorf("untimed line: %+v, %v", untimed, err)
	}
	if _, err := ParseSendLat("Couldn't connect to 10.99.1.2:18515\n"); err == nil {
		t.Error("no result line: want an error")
	}
}

// Both perftest tools get the same command line but for the tool: the
// device by name, the RoCEv2 GID, iteration mode, and the server last.
func TestPerftestArgs(t *testing.T) {
	want := "ib_send_lat -d rdma_net1 -x 1 -F -s 2 -n 500 10.99.1.2"
	if got := strings.Join(SendLatArgs("rdma_net1", 2, 500, "10.99.1.2"), " "); got != want {
		t.Errorf("SendLatArgs: %q, want %q", got, want)
	}
	want = "ib_write_bw -d rxe1 -x 1 -F -s 65536 -n 200"
	if got := strings.Join(WriteBWArgs("rxe1", 65536, 200, ""), " "); got != want {
		t.Errorf("WriteBWArgs: %q, want %q", got, want)
	}
}

// A server is seen listening only on its own port and only in state 0A
// (LISTEN), in /proc/net/tcp's and tcp6's lines alike; a connection on the
// port (01, ESTABLISHED) is not a server.
func TestListening(t *testing.T) {
	tcp := "  sl  local_address rem_address   st tx_queue rx_queue\n" +
		"   0: 00000000:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000\n" +
		"   1: 0B0A630A:4854 0C0A630A:9C40 01 00000000:00000000 00:00000000 00000000     0\n" +
		"   0: 00000000000000000000000000000000:485D 00000000000000000000000000000000:0000 0A 00000000:00000000\n"
	for port, want := range map[int]bool{2222: true, 18516: false, 18525: true, PerftestPort: false} {
		if got := Listening(tcp, port); got != want {
			t.Errorf("Listening(port %d) = %v, want %v", port, got, want)
		}
	}
}
