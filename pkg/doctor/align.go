package doctor

import (
	"fmt"
	"strings"
)

// A GPU reaches the network fastest through a NIC under its own PCIe root:
// GPUDirect RDMA then moves data between them below that root, without
// passing through the CPU from one root to another, nor, for a NIC on
// another NUMA node, over the link between sockets. NCCL picks each GPU's nearest
// NIC among those the pod has; when the scheduler gave the pod GPUs and
// NICs that are not pairs, no choice of NCCL's makes up for it.

// GPUAlignment is one GPU of the pod with the pod's NICs near it.
type GPUAlignment struct {
	GPU
	// NICsSameRoot are the RDMA devices of the pod under the GPU's PCIe
	// root; NICsSameNUMA those on its NUMA node.
	NICsSameRoot []string `json:"nicsSameRoot"`
	NICsSameNUMA []string `json:"nicsSameNuma"`
}

// alignFindings judges each GPU by the pod's NICs: OK with a NIC under its
// PCIe root, WARN without one. Nothing is judged without NICs: the
// devices check already says the pod has none.
func alignFindings(fs *Findings, gpus []GPU, nics []NIC) []GPUAlignment {
	out := []GPUAlignment{}
	for _, g := range gpus {
		a := GPUAlignment{GPU: g, NICsSameRoot: []string{}, NICsSameNUMA: []string{}}
		var sameRoot, sameNUMA []NIC
		for _, n := range nics {
			if g.PCIeRoot != "" && n.PCIeRoot == g.PCIeRoot {
				sameRoot = append(sameRoot, n)
				a.NICsSameRoot = append(a.NICsSameRoot, n.Device)
			}
			if g.NUMANode >= 0 && n.NUMANode == g.NUMANode {
				sameNUMA = append(sameNUMA, n)
				a.NICsSameNUMA = append(a.NICsSameNUMA, n.Device)
			}
		}
		out = append(out, a)
		if len(nics) > 0 {
			gpuFinding(fs, g, nics, sameRoot, sameNUMA)
		}
	}
	return out
}

func gpuFinding(fs *Findings, g GPU, nics, sameRoot, sameNUMA []NIC) {
	subj := "GPU " + g.PCIAddress
	if g.PCIAddress == "" {
		subj = "GPU " + strings.Join(g.FoundBy, ",")
	}
	switch {
	case g.Error != "":
		fs.add(Warn, "gpu-nic", subj, fmt.Sprintf("cannot tell where the GPU sits, so its NICs were not judged: %s", g.Error),
			"name the pod's GPUs by PCI address with --gpus (lspci -D on the node; for a DRA claim, kubectl get resourceclaim -o yaml shows its devices)")
	case len(sameRoot) > 0:
		fs.add(OK, "gpu-nic", subj, fmt.Sprintf("GPU %s (%s) has %s %s under its PCIe root",
			g.PCIAddress, placeString(g.PCIPlace), plural(len(sameRoot), "NIC", "NICs"), nicList(sameRoot)), "")
	default:
		var where []string
		for _, n := range nics {
			where = append(where, fmt.Sprintf("%s under %s", n, placeString(n.PCIPlace)))
		}
		reason := fmt.Sprintf("no NIC of the pod is under the PCIe root of GPU %s (%s): %s", g.PCIAddress, placeString(g.PCIPlace), strings.Join(where, "; "))
		if len(sameNUMA) > 0 {
			reason += "; same NUMA node only: " + nicList(sameNUMA)
		}
		reason += "; GPUDirect RDMA between them passes through the CPU from one PCIe root to the other"
		fs.add(Warn, "gpu-nic", subj, reason,
			"allocate each GPU with a NIC under its root: a ResourceClaim whose GPU and NIC requests share a constraint (matchAttribute: resource.kubernetes.io/pcieRoot), or the kubelet's Topology Manager with device plugins that report topology; a pod that does not use GPUDirect RDMA can ignore this")
	}
}

// placeString is "pci0000:3a, NUMA 0", or "unknown root" for a function
// that could not be found.
func placeString(p PCIPlace) string {
	root := p.PCIeRoot
	if root == "" {
		root = "unknown root"
	}
	if p.NUMANode < 0 {
		return root + ", no NUMA node"
	}
	return fmt.Sprintf("%s, NUMA %d", root, p.NUMANode)
}

func nicList(nics []NIC) string {
	s := make([]string, len(nics))
	for i, n := range nics {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// alignSection shows each GPU with the NICs of the pod under its PCIe root
// and on its NUMA node.
func alignSection(gpus []GPUAlignment, nics []NIC) section {
	s := section{heading: "GPUs of the pod and their NICs",
		header: []string{"GPU", "FOUND BY", "PCIE ROOT", "NUMA", "NICS UNDER ITS ROOT", "NICS ON ITS NUMA NODE"}}
	byDevice := map[string]NIC{}
	for _, n := range nics {
		byDevice[n.Device] = n
	}
	names := func(devs []string) string {
		var out []string
		for _, d := range devs {
			out = append(out, byDevice[d].String())
		}
		return dash(strings.Join(out, ", "))
	}
	for _, g := range gpus {
		numa := "-"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		s.rows = append(s.rows, []string{dash(g.PCIAddress), strings.Join(g.FoundBy, " "), dash(g.PCIeRoot), numa,
			names(g.NICsSameRoot), names(g.NICsSameNUMA)})
	}
	return s
}
