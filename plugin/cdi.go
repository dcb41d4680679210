package plugin

import (
	"fmt"

	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// writeCDI writes, in dra mode, the CDI spec of the claimed NIC whose
// claim the driver prepared with CDI (its record names the directory):
// the uverbs node the kernel gave its RDMA device in the pod, which the
// move made anew, and rdma_cm. The kubelet has already handed the
// runtime the spec's ID for each container that names the claim, and
// the runtime refuses such a container until the spec is there (package
// cdi). It returns what takes the spec back.
func (c *call) writeCDI(rec *state.Record) (func() error, error) {
	cl, dev := c.claim, c.claimed
	if cl == nil || dev == nil || cl.CDIDir == "" {
		return nil, nil
	}
	nodes, err := c.p.Kernel.VerbsNodesIn(c.args.Netns)
	if err != nil {
		return nil, fmt.Errorf("cannot read the verbs node of RDMA device %s in the pod, which the containers of claim %s/%s get: %v",
			rec.InPod(), cl.ClaimNamespace, cl.ClaimName, err)
	}
	var uverbs *cdi.Node
	for _, v := range nodes.Devices {
		if v.Device == rec.InPod() && v.Uverbs != nil {
			uverbs = &cdi.Node{Name: v.Uverbs.Name, Major: v.Uverbs.Major, Minor: v.Uverbs.Minor}
		}
	}
	if uverbs == nil {
		return nil, fmt.Errorf("RDMA device %s has no verbs node in the pod: load ib_uverbs on the node; the containers of claim %s/%s cannot use it without one",
			rec.InPod(), cl.ClaimNamespace, cl.ClaimName)
	}
	var cm *cdi.Node
	if n := nodes.RdmaCM; n != nil {
		cm = &cdi.Node{Name: n.Name, Major: n.Major, Minor: n.Minor}
	} else {
		c.log.Warnf("the kernel has no rdma_cm node (load rdma_ucm): the containers of claim %s/%s get %s alone", cl.ClaimNamespace, cl.ClaimName, uverbs.Name)
	}
	dir := cdi.Dir{Path: cl.CDIDir}
	if err := dir.Write(cl.ClaimUID, dev.Device, *uverbs, cm); err != nil {
		return nil, err
	}
	c.log.Infof("CDI device %s: %s of RDMA device %s, in %s", config.Quote(cdi.ID(cl.ClaimUID, dev.Device)), uverbs.Name, rec.InPod(), cl.CDIDir)
	return func() error { return dir.RemoveDevice(cl.ClaimUID, dev.Device) }, nil
}
