package railcount

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// The job's four rails as TestTwoNodes's pods hold them.
var jobRails = []Rail{{"rdma_r0", "net1"}, {"rdma_r1", "net2"}, {"rdma_s0", "net3"}, {"rdma_s1", "net4"}}

// want is a stream of 200 x 64 KiB at the VMs' 1024-byte RoCE MTU.
const want = 12800

// kept is a stream that kept to its rail: exactly its packets on both
// devices, perftest's TCP exchange on the netdevs.
func kept(tcp int64) Stream {
	return Stream{Want: want, Sent: Counters{want, 0, want + tcp, 0}, Rcvd: Counters{0, want, 0, want + tcp}}
}

func quiet(tx, rx int64) Stream {
	return Stream{Idle: true, Want: want, Sent: Counters{0, 0, tx, 0}, Rcvd: Counters{0, 0, 0, rx}}
}

func TestParse(t *testing.T) {
	cs, err := Parse("12800\n3\n12831\n40\n0\n0\n1\n1\n", 2)
	if err != nil || len(cs) != 2 || cs[0] != (Counters{12800, 3, 12831, 40}) || cs[1] != (Counters{0, 0, 1, 1}) {
		t.Fatalf("%+v %v", cs, err)
	}
	for _, bad := range []string{"1 2 3", "1 2 3 4 5 6 7 x", ""} {
		if _, err := Parse(bad, 2); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
	if f := Files(jobRails[2:3]); len(f) != 4 || f[0] != "/sys/class/infiniband/rdma_s0/ports/1/hw_counters/sent_pkts" || f[3] != "/sys/class/net/net3/statistics/rx_packets" {
		t.Errorf("Files: %q", f)
	}
}

// Rounds that kept every stream on its rail pass: all four at once, and
// two with the other two quiet, the TCP of rdma_s0's stream leaving by
// net4 (sbr's source hint), within the allowance.
func TestVerdictKept(t *testing.T) {
	for name, streams := range map[string][]Stream{
		"all four":                            {kept(31), kept(29), kept(30), kept(62)},
		"r0 and s0, s1 quiet with s0's TCP":   {kept(30), quiet(1, 1), kept(1), quiet(31, 2)},
		"r1 and s1, r0 and s0 quiet":          {quiet(0, 1), kept(30), quiet(1, 1), kept(33)},
		"at the bounds: the allowance itself": {kept(NetdevAllowance), quiet(NetdevAllowance, NetdevAllowance), kept(0), quiet(0, 0)},
	} {
		if f := Verdict(jobRails, streams, "node 2's pod", "node 1's pod"); len(f) != 0 {
			t.Errorf("%s: %+v", name, f)
		}
	}
}

// rdma_s0's stream sent to rdma_s1's MAC, as at the kernel's ARP defaults
// (docs/kubernetes.md: the writer stopped at 645 packets, the reader's
// device counted none; they reached net2, the other shared rail, in the
// bare pods that hold only the shared two): the stream failed, its
// counts are short, and it went astray to net2.
func TestVerdictAstray(t *testing.T) {
	rails := []Rail{{"rdma_s0", "net1"}, {"rdma_s1", "net2"}} // the bare pods hold these two alone
	streams := []Stream{
		{Want: want, Err: errors.New("ib_write_bw did not complete"), Sent: Counters{645, 0, 652, 3}, Rcvd: Counters{0, 0, 0, 4}},
		quiet(2, 651),
	}
	faults := Verdict(rails, streams, "node 1's bare-0", "node 2's bare-1")
	var astray []Fault
	for _, f := range faults {
		if len(f.Reached) > 0 {
			astray = append(astray, f)
		}
	}
	if len(astray) != 1 || astray[0].Rail != 0 || !astray[0].Astray(1) || astray[0].Astray(0) {
		t.Fatalf("astray %+v, want rdma_s0's stream reaching net2 alone; all: %+v", astray, faults)
	}
	for _, s := range []string{"rdma_s0's stream astray", "node 1's bare-0's rdma_s0 sent 645", "node 2's bare-1's rdma_s0 received 0", "net2 (rdma_s1's netdev) counted 651 frames, no stream of its own", "reached net2"} {
		if !strings.Contains(astray[0].Msg, s) {
			t.Errorf("%q, want it to say %q", astray[0].Msg, s)
		}
	}
	if len(faults) < 4 {
		t.Errorf("faults %+v, want the failed run and the short counts too", faults)
	}
	// Had the quiet rail's device counted them, they went astray all
	// the same.
	streams[1].Rcvd.RDMARcvd = 645
	if f := Verdict(rails, streams, "node 1's bare-0", "node 2's bare-1"); !slices.ContainsFunc(f, func(f Fault) bool { return f.Rail == 0 && f.Astray(1) }) {
		t.Errorf("the quiet rail's device counting the packets: %+v", f)
	}
}

// A stream that crossed to its neighbour on the segment while both
// streamed: rdma_s1's writer resent 1,800 packets that reached rdma_s0's
// NIC, whose own stream was exact. Within the +15 % bound (1,920) the
// rails check had before, and caught now: rdma_s1's writer sent more than
// its stream, and net3 counted 1,800 frames beyond its device's.
func TestVerdictAstrayOnABusyRail(t *testing.T) {
	s1 := kept(30)
	s1.Sent.RDMASent += 1800
	s1.Sent.NetTx += 1800
	s0 := kept(30)
	s0.Rcvd.NetRx += 1800
	faults := Verdict(jobRails, []Stream{kept(30), kept(30), s0, s1}, "node 2's pod", "node 1's pod")
	var found bool
	for _, f := range faults {
		if f.Rail == 2 && len(f.Reached) > 0 {
			t.Errorf("rdma_s0's stream blamed: %+v", f)
		}
		found = found || f.Rail == 3 && f.Astray(2) && strings.Contains(f.Msg, "reached net3")
	}
	if !found {
		t.Errorf("faults %+v, want rdma_s1's stream astray to net3", faults)
	}
}

// Counts off by any packet fail, each naming its rail, counter and pod;
// resends with no other netdev counting them are not called astray.
func TestVerdictExact(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func([]Stream)
		want   string
	}{
		{"one resend", func(s []Stream) { s[0].Sent.RDMASent++ }, "rail rdma_r0: node 2's pod's rdma_r0 sent 12801 packets, want 12800"},
		{"one missing", func(s []Stream) { s[1].Rcvd.RDMARcvd-- }, "rail rdma_r1: node 1's pod's rdma_r1 received 12799 packets, want 12800"},
		{"a netdev over the allowance", func(s []Stream) { s[2].Sent.NetTx = want + NetdevAllowance + 1 }, "node 2's pod's net3 transmitted 12901 packets, want 12800 to 12900"},
		{"a quiet device", func(s []Stream) { s[3].Rcvd.RDMARcvd = 1 }, "rail rdma_s1: node 1's pod's rdma_s1 received 1 packets, want 0 (no stream of its own)"},
		{"a quiet netdev", func(s []Stream) { s[3].Sent.NetTx = NetdevAllowance + 1 }, "node 2's pod's net4 transmitted 101 packets, want 0 to 100"},
		{"a failed run", func(s []Stream) { s[0].Err = errors.New("ib_write_bw: 199 iterations, want 200") }, "rail rdma_r0, node 2's pod -> node 1's pod: ib_write_bw: 199 iterations"},
	} {
		s := []Stream{kept(30), kept(30), kept(30), quiet(30, 2)}
		c.change(s)
		faults := Verdict(jobRails, s, "node 2's pod", "node 1's pod")
		if len(faults) != 1 || !strings.Contains(faults[0].Msg, c.want) || len(faults[0].Reached) != 0 {
			t.Errorf("%s: %+v, want one fault saying %q", c.name, faults, c.want)
		}
	}
}
