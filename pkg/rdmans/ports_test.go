package rdmans

import (
	"encoding/binary"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

func TestParsePort(t *testing.T) {
	u32 := make([]byte, 4)
	binary.NativeEndian.PutUint32(u32, 1)
	var msg []byte
	for _, a := range []*nl.RtAttr{
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, u32),
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_NAME, nl.ZeroTerminated("rxe0")),
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_PORT_INDEX, u32),
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_PORT_STATE, []byte{4}),
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_PORT_PHYS_STATE, []byte{5}),
		nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_NDEV_NAME, nl.ZeroTerminated("net1")),
	} {
		msg = append(msg, a.Serialize()...)
	}
	want := PortInfo{Port: 1, State: 4, PhysState: 5, Netdev: "net1"}
	if got := parsePort(msg); got != want {
		t.Errorf("parsePort = %+v, want %+v", got, want)
	}
	// A port whose netdev sits in another netns comes without a name.
	if got := parsePort(msg[:len(msg)-len(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_NDEV_NAME, nl.ZeroTerminated("net1")).Serialize())]); got.Netdev != "" || got.Port != 1 {
		t.Errorf("without NDEV_NAME: %+v", got)
	}
	if got := parsePort(msg[:3]); got.Port != 0 {
		t.Errorf("truncated message parsed as port %d", got.Port)
	}
}
