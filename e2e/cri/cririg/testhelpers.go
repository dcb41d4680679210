package cririg

import (
	"context"
	"testing"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// SkipUnlessExclusive skips a test written for the exclusive-mode VM.
func SkipUnlessExclusive(t testing.TB) {
	t.Helper()
	if NetnsMode() != "exclusive" {
		t.Skip("the exclusive-mode VM's test")
	}
}

// MustNetworkOf is NetworkOf for a test, which fails when handler's network
// cannot be read.
func MustNetworkOf(t testing.TB, handler string) Network {
	t.Helper()
	n, err := NetworkOf(handler)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// MustExchange runs the two exchanges the CRI tests check pods with,
// ibv_rc_pingpong of 4KiB messages and ib_write_bw of 64KiB writes, iters
// of each, from cli to srv, each under a context of its own from ctx; an
// exchange that fails fails t.
func (c *Containerd) MustExchange(t *testing.T, ctx func(*testing.T) context.Context, srv, cli Endpoint, iters int) (rig.PingPong, rig.WriteBW) {
	t.Helper()
	pp, err := c.PingPong(ctx(t), srv, cli, 4096, iters)
	if err != nil {
		t.Fatal(err)
	}
	bw, err := c.WriteBW(ctx(t), srv, cli, 65536, iters)
	if err != nil {
		t.Fatal(err)
	}
	return pp, bw
}
