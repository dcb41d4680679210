package doctor

import (
	"fmt"
	"slices"
	"strings"
)

// mapped: the node's ID id has an ID in the process's user namespace.
func mapped(m []IDRange, id uint32) bool {
	for _, r := range m {
		if id >= r.Outside && uint64(id) < uint64(r.Outside)+uint64(r.Count) {
			return true
		}
	}
	return false
}

// CanOpenRW says whether a process with creds c may open n for reading and
// writing, as verbs opens its nodes, by the kernel's permission check of a
// file: the owner's bits if it is the owner, else the group's if it is in
// the group, else the others'; failing those, CAP_DAC_OVERRIDE, which in a
// user namespace counts only for a file whose owner and group are mapped
// into it. Device cgroup rules and LSMs come on top; the NRI plugin allows
// the nodes it adds in the container's device cgroup.
func CanOpenRW(c Creds, n DevNode) bool {
	bits := uint32(n.Perm) & 0o7
	switch {
	case c.FSUID == n.UID:
		bits = uint32(n.Perm) >> 6 & 0o7
	case c.FSGID == n.GID || slices.Contains(c.Groups, n.GID):
		bits = uint32(n.Perm) >> 3 & 0o7
	}
	if bits&0o6 == 0o6 {
		return true
	}
	return c.DACOverride && mapped(c.UIDMap, n.UID) && mapped(c.GIDMap, n.GID)
}

// accessFinding: a process that has its pod's nodes but may not open
// them. In a user namespace of its own (hostUsers: false) the runtime
// bind-mounts the node's own device nodes into the container, since it
// cannot create device nodes there (runc: "containers running in a user
// namespace are not allowed to mknod devices"), so the node's owner and
// mode apply to a container root that is an unprivileged uid on the node.
func accessFinding(fs *Findings, subj string, pr Process, want []string) {
	if !pr.Creds.Known {
		return
	}
	var denied []string
	for _, n := range pr.Nodes {
		if slices.Contains(want, n.Name) && !CanOpenRW(pr.Creds, n) {
			denied = append(denied, n.String())
		}
	}
	if len(denied) == 0 {
		return
	}
	c := pr.Creds
	if c.UserNS {
		caps := "no capability would help: CAP_DAC_OVERRIDE of a user namespace does not count for a node whose owner is not mapped into it"
		fs.add(Fail, "char-access", subj, fmt.Sprintf("cannot open %s for reading and writing, so verbs fail (ibv_open_device: Permission denied): "+
			"the process runs in a user namespace of its own (hostUsers: false) as uid %d on the node, which the mode does not admit, and %s; "+
			"the runtime bind-mounts the node's own device nodes into such a container (it cannot create them there), so the node's mode applies, not the one the pod was given",
			strings.Join(denied, ", "), c.FSUID, caps),
			"make the node's /dev/infiniband/uverbs* and rdma_cm mode 0666, as the kernel creates them and rdma-core's udev rules keep them "+
				"(find the udev rule or chmod that narrowed them; a rule such as KERNEL==\"uverbs*\", MODE=\"0666\" restores them at boot), or run the pod with hostUsers: true")
		return
	}
	fs.add(Fail, "char-access", subj, fmt.Sprintf("cannot open %s for reading and writing, so verbs fail (ibv_open_device: Permission denied): the process runs as uid %d gid %d without CAP_DAC_OVERRIDE, which the mode does not admit",
		strings.Join(denied, ", "), c.FSUID, c.FSGID),
		nriFix+" (it creates the nodes mode 0666 in the container); or give the container nodes it may open: whatever injected them (a device plugin, the pod spec) sets their mode")
}
