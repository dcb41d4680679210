package cririg

import (
	"context"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// Endpoint is one side of verbs traffic between two containers: the
// container, and the network of its pod (the RDMA device it opens and the
// pod's address).
type Endpoint struct {
	Ctr *Container
	Net Network
}

// peer is the endpoint as rig's traffic helpers see it: commands run in
// the container through CRI ExecSync.
func (c *Containerd) peer(ep Endpoint) rig.Peer {
	run := func(ctx context.Context, timeout time.Duration, argv ...string) (string, string, error) {
		r, err := c.Exec(ctx, ep.Ctr, timeout, argv...)
		return r.Stdout, r.Stderr, err
	}
	return rig.Peer{Run: run, Dev: ep.Net.RDMA, IP: ep.Net.IP}
}

// PingPong runs ibv_rc_pingpong (RC send/receive, iters round trips of
// size bytes) from cli to srv and returns the client's figures
// (rig.PingPongBetween).
func (c *Containerd) PingPong(ctx context.Context, srv, cli Endpoint, size, iters int) (rig.PingPong, error) {
	return rig.PingPongBetween(ctx, c.peer(srv), c.peer(cli), size, iters)
}

// WriteBW runs ib_write_bw (iters RDMA WRITEs of size bytes) from cli into
// srv's memory and returns the client's figures (rig.WriteBWBetween).
func (c *Containerd) WriteBW(ctx context.Context, srv, cli Endpoint, size, iters int) (rig.WriteBW, error) {
	return rig.WriteBWBetween(ctx, c.peer(srv), c.peer(cli), size, iters)
}
