package rig

// Verbs traffic between two containers, whatever runs commands in them:
// containerd's ExecSync (e2e/cri) or the API server's exec through kubelet
// (e2e/k8s). The tools run inside the containers, as a workload would.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Runner runs argv in one side's container, waiting up to timeout, and
// returns what it printed; a non-zero exit status is an error.
type Runner func(ctx context.Context, timeout time.Duration, argv ...string) (stdout, stderr string, err error)

// Peer is one side of verbs traffic between containers: how to run a
// command in its container, the RDMA device it opens by name (as
// NCCL_IB_HCA does) and its pod's address on that device's netdev.
type Peer struct {
	Run Runner
	Dev string
	IP  string
}

// VerbsTimeout bounds one side of a verbs tool run under the VM's
// emulated CPU.
const VerbsTimeout = 2 * time.Minute

// Serve starts the server side of a verbs tool and returns once it listens
// on TCP 18515 (both tools exchange QP numbers there first); wait returns
// the server's output once it has exited.
func Serve(ctx context.Context, p Peer, argv []string) (wait func() (string, error), err error) {
	var wg sync.WaitGroup
	var out string
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var so, se string
		so, se, runErr = p.Run(ctx, VerbsTimeout, argv...)
		out = so + se
	}()
	wait = func() (string, error) {
		wg.Wait()
		return out, runErr
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		tcp, _, err := p.Run(ctx, 10*time.Second, "cat", "/proc/net/tcp", "/proc/net/tcp6")
		if err == nil && Listening(tcp, PerftestPort) {
			return wait, nil
		}
	}
	// The server never listened: it exited (its error says why) or hangs
	// until VerbsTimeout.
	sout, serr := wait()
	return nil, fmt.Errorf("%s server on %s did not listen on TCP 18515 within 30s: %v\n%s", argv[0], p.Dev, serr, sout)
}

// PingPongBetween runs ibv_rc_pingpong (RC send/receive, iters round trips
// of size bytes) from cli to srv and returns the client's figures; a run
// that did not complete every iteration is an error.
func PingPongBetween(ctx context.Context, srv, cli Peer, size, iters int) (PingPong, error) {
	wait, err := Serve(ctx, srv, PingPongArgs(srv.Dev, size, iters, ""))
	if err != nil {
		return PingPong{}, err
	}
	co, ce, cerr := cli.Run(ctx, VerbsTimeout, PingPongArgs(cli.Dev, size, iters, srv.IP)...)
	sout, serr := wait()
	if cerr != nil || serr != nil {
		return PingPong{}, fmt.Errorf("ibv_rc_pingpong %s -> %s: client: %v\n%s%s\nserver: %v\n%s", cli.Dev, srv.Dev, cerr, co, ce, serr, sout)
	}
	pp, err := ParsePingPong(co + ce)
	if err != nil {
		return pp, err
	}
	if pp.Iters != iters {
		return pp, fmt.Errorf("ibv_rc_pingpong: %d iterations, want %d:\n%s%s", pp.Iters, iters, co, ce)
	}
	return pp, nil
}

// WriteBWBetween runs ib_write_bw (iters RDMA WRITEs of size bytes) from
// cli into srv's memory and returns the client's figures.
func WriteBWBetween(ctx context.Context, srv, cli Peer, size, iters int) (WriteBW, error) {
	return perftestRun(ctx, srv, cli, "ib_write_bw", size, iters, ParseWriteBW, func(r WriteBW) (int, int) { return r.Bytes, r.Iters })
}

// SendLatBetween runs ib_send_lat (iters round trips of RC sends of size
// bytes) between cli and srv and returns the client's figures.
func SendLatBetween(ctx context.Context, srv, cli Peer, size, iters int) (SendLat, error) {
	return perftestRun(ctx, srv, cli, "ib_send_lat", size, iters, ParseSendLat, func(r SendLat) (int, int) { return r.Bytes, r.Iters })
}

// perftestRun runs perftest's tool between srv and cli (perftestBetween),
// reads the client's figures with parse and checks, with ran, that the run
// was of the size and length asked for: a run cut short reports figures
// for fewer iterations.
func perftestRun[R any](ctx context.Context, srv, cli Peer, tool string, size, iters int, parse func(string) (R, error), ran func(R) (bytes, iters int)) (R, error) {
	out, err := perftestBetween(ctx, srv, cli, perftestArgs(tool, srv.Dev, size, iters, ""), perftestArgs(tool, cli.Dev, size, iters, srv.IP))
	if err != nil {
		var none R
		return none, err
	}
	r, err := parse(out)
	if err != nil {
		return r, err
	}
	if gotBytes, gotIters := ran(r); gotIters != iters || gotBytes != size {
		return r, fmt.Errorf("%s: %d iterations of %d bytes, want %d of %d:\n%s", tool, gotIters, gotBytes, iters, size, out)
	}
	return r, nil
}

// perftestBetween runs a perftest tool's server in srv and its client in
// cli and returns the client's output. perftest calibrates its clock at
// start, which sometimes fails under the VM's emulated CPU ("Correlation
// coefficient r^2", 0 MB/s although every write completed, or latencies
// of "inf"), the more often the busier the machine's cores (two node VMs
// and their kubelets): such a run is repeated, five times at most.
func perftestBetween(ctx context.Context, srv, cli Peer, srvArgs, cliArgs []string) (string, error) {
	for try := 0; ; try++ {
		wait, err := Serve(ctx, srv, srvArgs)
		if err != nil {
			return "", err
		}
		co, ce, cerr := cli.Run(ctx, VerbsTimeout, cliArgs...)
		sout, serr := wait()
		out := co + ce
		if cerr != nil || serr != nil {
			return "", fmt.Errorf("%s %s -> %s: client: %v\n%s\nserver: %v\n%s", cliArgs[0], cli.Dev, srv.Dev, cerr, out, serr, sout)
		}
		if strings.Contains(out, "Correlation coefficient r^2") && try < 5 {
			continue
		}
		return out, nil
	}
}
