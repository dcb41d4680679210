package cririg

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
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

// MustMemlockKiB is containerd's soft memlock limit as `ulimit -l` prints
// it (KiB, or "unlimited"): what a container gets from the runtime when
// nothing sets it. A limit it cannot read fails t.
func (c *Containerd) MustMemlockKiB(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", c.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(l, "Max locked memory")
		f := strings.Fields(rest)
		if !ok || len(f) == 0 {
			continue
		}
		if f[0] == "unlimited" {
			return f[0]
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			t.Fatalf("containerd's limits: %q", l)
		}
		return strconv.FormatUint(n/1024, 10)
	}
	t.Fatalf("no memlock in containerd's limits:\n%s", data)
	return ""
}
