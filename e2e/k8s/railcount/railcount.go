// Package railcount reads what a round of the rails tests
// (e2e/k8s/rails_test.go) left in each rail's packet counters, and says
// whether every stream kept to its rail: the writer's and the reader's
// counters of a stream's rail count its packets exactly, every other
// rail nothing of it, and a stream whose packets went to another rail's
// NIC is named with the netdev they reached. Apart from the e2e build tag
// so that make unit tests it on recorded counters.
package railcount

import (
	"fmt"
	"strconv"
	"strings"
)

// Counters are one pod's packet counters of one rail: its RDMA device's
// (rxe's hw_counters sent_pkts and rcvd_pkts: RoCE packets the device
// sent, and received for itself) and its netdev's (tx_packets,
// rx_packets: every frame).
type Counters struct{ RDMASent, RDMARcvd, NetTx, NetRx int64 }

// Minus is what c counted since o.
func (c Counters) Minus(o Counters) Counters {
	return Counters{c.RDMASent - o.RDMASent, c.RDMARcvd - o.RDMARcvd, c.NetTx - o.NetTx, c.NetRx - o.NetRx}
}

// Rail is a rail as a pod sees it: its RDMA device and its netdev.
type Rail struct{ Dev, Netdev string }

// Files are the sysfs files of every rail's counters in a pod, four per
// rail in Counters' order.
func Files(rails []Rail) []string {
	var files []string
	for _, r := range rails {
		hw := "/sys/class/infiniband/" + r.Dev + "/ports/1/hw_counters/"
		st := "/sys/class/net/" + r.Netdev + "/statistics/"
		files = append(files, hw+"sent_pkts", hw+"rcvd_pkts", st+"tx_packets", st+"rx_packets")
	}
	return files
}

// Parse reads the contents of n rails' Files, as cat prints them.
func Parse(out string, n int) ([]Counters, error) {
	f := strings.Fields(out)
	if len(f) != 4*n {
		return nil, fmt.Errorf("%d counters, want %d: %q", len(f), 4*n, out)
	}
	v := make([]int64, len(f))
	for i, s := range f {
		var err error
		if v[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("counter %d: %q", i, s)
		}
	}
	cs := make([]Counters, n)
	for k := range cs {
		cs[k] = Counters{v[4*k], v[4*k+1], v[4*k+2], v[4*k+3]}
	}
	return cs, nil
}

// NetdevAllowance is how many frames a rail's netdev may count in a round
// beyond its RDMA device's RoCE packets: perftest's TCP exchange of the
// streams that went out by it (connection, the parameters and queue pairs
// swapped, the barriers and the close: a few dozen frames each way) and
// ARP. The TCP of a stream on a shared rail may leave by its neighbour's
// netdev (sbr's addSourceHints gives sockets bound to no address one rail
// of the subnet), so two exchanges can fall on one netdev. A stream astray
// puts a window of RoCE packets (128 for rxe) on another rail's NIC at
// each retry, more than this.
const NetdevAllowance = 100

// Stream is one rail's part of a round: whether a stream ran on it, its
// packets, and what the writer's and the reader's counters of the rail
// counted over the round.
type Stream struct {
	Idle       bool  // no stream of the round on this rail
	Err        error // the stream did not complete as it should
	Want       int64 // a stream's RoCE packets: its bytes / the RoCE MTU
	Sent, Rcvd Counters
}

// Fault is one thing a round's counters say went wrong on a rail.
type Fault struct {
	Rail int // index into the round's rails
	// Reached are, for a stream astray, the rails whose netdev in the
	// reader counted frames that were not its own device's.
	Reached []int
	Msg     string
}

// Astray says whether f is a stream whose packets reached rail k's NIC.
func (f Fault) Astray(k int) bool {
	for _, r := range f.Reached {
		if r == k {
			return true
		}
	}
	return false
}

// Verdict is what went wrong in a round from writer into reader, one Fault
// per failed check, none when every stream kept to its rail: each stream
// completed; its rail's RDMA device sent exactly its packets in the
// writer and received them exactly in the reader (rxe counts what it
// resends; a packet that reached another rail's NIC is dropped there, and
// resent); its rail's netdevs counted them and at most NetdevAllowance
// frames more; a rail without a stream counted no RoCE packet and at most
// NetdevAllowance frames. A stream whose reader's device received fewer
// packets than its writer's sent while another rail's netdev in the
// reader counted more than NetdevAllowance frames beyond its own stream's
// packets went astray there: its Fault names those rails (Reached).
func Verdict(rails []Rail, streams []Stream, writer, reader string) []Fault {
	var faults []Fault
	for k, s := range streams {
		r := rails[k]
		if s.Err != nil {
			faults = append(faults, Fault{Rail: k, Msg: fmt.Sprintf("rail %s, %s -> %s: %v", r.Dev, writer, reader, s.Err)})
		}
		roce, what := s.Want, fmt.Sprintf("its stream's %d", s.Want)
		if s.Idle {
			roce, what = 0, "no stream of its own"
		}
		for _, c := range []struct {
			who, dev, counted string
			n, lo, hi         int64
			why               string
		}{
			{writer, r.Dev, "sent", s.Sent.RDMASent, roce, roce, what},
			{reader, r.Dev, "received", s.Rcvd.RDMARcvd, roce, roce, what},
			{writer, r.Netdev, "transmitted", s.Sent.NetTx, roce, roce + NetdevAllowance, fmt.Sprintf("%s, and up to %d frames of perftest's TCP and ARP", what, NetdevAllowance)},
			{reader, r.Netdev, "received", s.Rcvd.NetRx, roce, roce + NetdevAllowance, fmt.Sprintf("%s, and up to %d frames of perftest's TCP and ARP", what, NetdevAllowance)},
		} {
			if c.n < c.lo || c.n > c.hi {
				want := strconv.FormatInt(c.lo, 10)
				if c.hi != c.lo {
					want = fmt.Sprintf("%d to %d", c.lo, c.hi)
				}
				faults = append(faults, Fault{Rail: k, Msg: fmt.Sprintf("rail %s: %s's %s %s %d packets, want %s (%s)", r.Dev, c.who, c.dev, c.counted, c.n, want, c.why)})
			}
		}
	}
	// Rails whose netdev in the reader counted frames beyond its own
	// stream's packets: those its device accepted, none on a quiet rail
	// (rxe drops a packet whose address is another rail's before counting
	// it; should a quiet rail's device count one, it was no less astray).
	var foreign []int
	for k, s := range streams {
		own := s.Rcvd.RDMARcvd
		if s.Idle {
			own = 0
		}
		if s.Rcvd.NetRx-own > NetdevAllowance {
			foreign = append(foreign, k)
		}
	}
	for j, s := range streams {
		lost := s.Sent.RDMASent - s.Rcvd.RDMARcvd
		if s.Idle || lost <= 0 {
			continue
		}
		var reached []int
		var where []string
		for _, k := range foreign {
			if k != j {
				reached = append(reached, k)
				rx, own := streams[k].Rcvd, "no stream of its own"
				if !streams[k].Idle {
					own = fmt.Sprintf("its stream's %d packets", rx.RDMARcvd)
				}
				where = append(where, fmt.Sprintf("%s (%s's netdev) counted %d frames, %s", rails[k].Netdev, rails[k].Dev, rx.NetRx, own))
			}
		}
		if len(reached) == 0 {
			continue
		}
		faults = append(faults, Fault{Rail: j, Reached: reached, Msg: fmt.Sprintf("rail %s's stream astray: %s's %s sent %d packets, %s's %s received %d; in %s, %s: its packets reached %s",
			rails[j].Dev, writer, rails[j].Dev, s.Sent.RDMASent, reader, rails[j].Dev, s.Rcvd.RDMARcvd, reader, strings.Join(where, ", "), netdevs(rails, reached))})
	}
	return faults
}

func netdevs(rails []Rail, ks []int) string {
	var out []string
	for _, k := range ks {
		out = append(out, rails[k].Netdev)
	}
	return strings.Join(out, " and ")
}
