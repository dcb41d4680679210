package cririg

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// verbsPort is the TCP port on which ibv_rc_pingpong's and ib_write_bw's
// servers wait for the client's QP numbers (their default, 18515).
const verbsPort = 18515

// verbsTimeout bounds one side of a verbs tool run under the VM's
// emulated CPU.
const verbsTimeout = 2 * time.Minute

// Endpoint is one side of verbs traffic between two containers: the
// container, and the network of its pod (the RDMA device it opens and the
// pod's address).
type Endpoint struct {
	Ctr *Container
	Net Network
}

// serve starts the server side of a verbs tool in ctr and returns once it
// listens; wait returns the server's output when it has exited.
func (c *Containerd) serve(ctx context.Context, ctr *Container, argv []string) (wait func() (string, error), err error) {
	var wg sync.WaitGroup
	var out string
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var r ExecResult
		r, runErr = c.Exec(ctx, ctr, verbsTimeout, argv...)
		out = r.Stdout + r.Stderr
	}()
	if err := c.WaitListening(ctx, ctr, verbsPort, 30*time.Second); err != nil {
		wg.Wait()
		return nil, fmt.Errorf("%s server: %v\n%s", argv[0], err, out)
	}
	return func() (string, error) {
		wg.Wait()
		return out, runErr
	}, nil
}

// PingPong runs ibv_rc_pingpong (RC send/receive, iters round trips of
// size bytes) from cli to srv and returns the client's figures; a run that
// did not complete every iteration is an error.
func (c *Containerd) PingPong(ctx context.Context, srv, cli Endpoint, size, iters int) (rig.PingPong, error) {
	wait, err := c.serve(ctx, srv.Ctr, rig.PingPongArgs(srv.Net.RDMA, size, iters, ""))
	if err != nil {
		return rig.PingPong{}, err
	}
	r, cerr := c.Exec(ctx, cli.Ctr, verbsTimeout, rig.PingPongArgs(cli.Net.RDMA, size, iters, srv.Net.IP)...)
	sout, serr := wait()
	if cerr != nil || serr != nil {
		return rig.PingPong{}, fmt.Errorf("ibv_rc_pingpong: client: %v\n%s%s\nserver: %v\n%s", cerr, r.Stdout, r.Stderr, serr, sout)
	}
	pp, err := rig.ParsePingPong(r.Stdout + r.Stderr)
	if err != nil {
		return pp, err
	}
	if pp.Iters != iters {
		return pp, fmt.Errorf("ibv_rc_pingpong: %d iterations, want %d:\n%s%s", pp.Iters, iters, r.Stdout, r.Stderr)
	}
	return pp, nil
}

// WriteBW runs ib_write_bw (iters RDMA WRITEs of size bytes) from cli into
// srv's memory and returns the client's figures. perftest calibrates its
// clock at start, which sometimes fails under the VM's emulated CPU
// ("Correlation coefficient r^2", 0 MB/s although every write completed):
// such a run is repeated, twice at most.
func (c *Containerd) WriteBW(ctx context.Context, srv, cli Endpoint, size, iters int) (rig.WriteBW, error) {
	for try := 0; ; try++ {
		wait, err := c.serve(ctx, srv.Ctr, rig.WriteBWArgs(srv.Net.RDMA, size, iters, ""))
		if err != nil {
			return rig.WriteBW{}, err
		}
		r, cerr := c.Exec(ctx, cli.Ctr, verbsTimeout, rig.WriteBWArgs(cli.Net.RDMA, size, iters, srv.Net.IP)...)
		sout, serr := wait()
		out := r.Stdout + r.Stderr
		if cerr != nil || serr != nil {
			return rig.WriteBW{}, fmt.Errorf("ib_write_bw: client: %v\n%s\nserver: %v\n%s", cerr, out, serr, sout)
		}
		if strings.Contains(out, "Correlation coefficient r^2") && try < 2 {
			continue
		}
		bw, err := rig.ParseWriteBW(out)
		if err != nil {
			return bw, err
		}
		if bw.Iters != iters || bw.Bytes != size {
			return bw, fmt.Errorf("ib_write_bw: %d iterations of %d bytes, want %d of %d:\n%s", bw.Iters, bw.Bytes, iters, size, out)
		}
		return bw, nil
	}
}
