package doctor

import (
	"fmt"
	"slices"
	"strings"
)

// Thresholds of the pod checks. RDMA registers (pins) every buffer it
// sends from or receives into; NCCL alone registers tens of MiB per
// connection, so a limit below MinMemlock fails with `ibv_reg_mr failed`.
// NCCL and PyTorch DataLoader workers pass data through /dev/shm; the
// container default of 64MiB fails with `posix_fallocate failed: No space
// left on device` or a DataLoader "Bus error".
const (
	MinMemlock = 64 << 20
	MinShm     = 1 << 30
)

// The fixes of what a process needs: rdma-netns-nri (nriFix), or without
// it the pod spec asks for each (conf/pod-nccl-by-hand.yaml).
const (
	memlockRemedy = nriFix + " (it sets memlock unlimited); or by hand: give the container the IPC_LOCK capability (securityContext.capabilities.add: [\"IPC_LOCK\"]), " +
		"or raise its memlock limit: set the runtime's default ulimits (containerd: LimitMEMLOCK=infinity in its systemd unit; CRI-O: default_ulimits = [\"memlock=-1:-1\"]; docker: --ulimit memlock=-1)"
	shmRemedy = nriFix + " (it grows the pod's /dev/shm, rdma-netns.io/shm-size: 16Gi to choose, up to the node's --max-shm-size, 16Gi by default); or by hand: mount a memory-backed emptyDir on /dev/shm (volumes: emptyDir: {medium: Memory, sizeLimit: 16Gi}), or docker --shm-size=16g; " +
		"NCCL_SHM_DISABLE=1 avoids /dev/shm for NCCL at some speed cost, as a last resort"
	charRemedy = nriFix + " (it adds exactly the pod's uverbs nodes and rdma_cm); or by hand: let an RDMA device plugin (k8s-rdma-shared-dev-plugin, sriov-network-device-plugin) inject /dev/infiniband for the pod's resource, or run the container privileged"
)

// MemlockVerdict decides whether RDMA memory registration can work.
func MemlockVerdict(pr Process) (Severity, string) {
	switch {
	case !pr.Memlock.Known:
		return Warn, "cannot read its memlock limit"
	case pr.CapIPCLock:
		return OK, fmt.Sprintf("holds CAP_IPC_LOCK, so memory registration ignores its memlock limit (%s)", pr.Memlock)
	case pr.Memlock.Sufficient(MinMemlock):
		return OK, fmt.Sprintf("memlock limit %s is enough for RDMA memory registration", pr.Memlock)
	}
	// NCCL and MPI register far more than this per connection: this is
	// a certain failure, not a risk.
	return Fail, fmt.Sprintf("memlock limit %s (below %s) and no CAP_IPC_LOCK: RDMA memory registration will fail (NCCL: \"ibv_reg_mr failed\", \"Cannot allocate memory\")",
		pr.Memlock, FormatBytes(MinMemlock))
}

// ShmVerdict grades the size of /dev/shm.
func ShmVerdict(pr Process) (Severity, string) {
	switch {
	case pr.ShmErr != "":
		return Warn, "no usable /dev/shm: " + pr.ShmErr
	case pr.ShmBytes < MinShm:
		// Only workloads that pass data between processes through
		// /dev/shm (several GPUs per pod, DataLoader workers) hit this.
		return Warn, fmt.Sprintf("/dev/shm is only %s (below %s): NCCL between GPUs of this pod can fail with \"posix_fallocate failed: No space left on device\", PyTorch DataLoader workers with \"Bus error\"",
			FormatBytes(pr.ShmBytes), FormatBytes(MinShm))
	}
	return OK, fmt.Sprintf("/dev/shm is %s", FormatBytes(pr.ShmBytes))
}

// needsFindings checks what a process of a pod holding RDMA devices needs
// and rdma-netns-nri gives each of its containers: a memlock limit, a
// /dev/shm of a useful size, and the device nodes want of the pod's
// devices. lacks names what it lacks; hasNodes is set when want is not
// empty and it has all of them.
func needsFindings(fs *Findings, subj string, pr Process, want []string) (lacks []string, hasNodes bool) {
	for _, v := range []struct {
		check, lack, remedy string
		verdict             func(Process) (Severity, string)
	}{
		{"memlock", "a memlock limit for memory registration", memlockRemedy, MemlockVerdict},
		{"shm", "a /dev/shm of a useful size", shmRemedy, ShmVerdict},
	} {
		sev, reason := v.verdict(pr)
		if sev == OK {
			fs.add(sev, v.check, subj, reason, "")
			continue
		}
		fs.add(sev, v.check, subj, reason, v.remedy)
		lacks = append(lacks, v.lack)
	}
	var missing []string
	for _, w := range want {
		if !slices.Contains(pr.CharDevices, w) {
			missing = append(missing, "/dev/infiniband/"+w)
		}
	}
	switch {
	case len(missing) > 0:
		// Without its uverbs node no verbs application can start.
		fs.add(Fail, "char-devices", subj, fmt.Sprintf("cannot open %s: the container's /dev lacks them, so verbs (ibv_open_device) or rdma_cm fail", strings.Join(missing, " ")),
			charRemedy)
		lacks = append([]string{"the device nodes " + strings.Join(missing, " ")}, lacks...)
	case len(want) > 0:
		// Having them is not opening them: not the NRI plugin's to
		// give (its nodes are 0666), so not among lacks.
		fs.add(OK, "char-devices", subj, "sees "+strings.Join(want, " ")+" under /dev/infiniband", "")
		hasNodes = true
	}
	return lacks, hasNodes
}

// nriLacksFinding sums up what a process lacks of the three: they come
// together from the NRI plugin, so one missing alone is a pod setting, all
// of them the plugin not running.
func nriLacksFinding(fs *Findings, subj string, lacks []string) {
	if len(lacks) == 0 {
		return
	}
	fs.add(Warn, "nri", subj, fmt.Sprintf("lacks %d of the 3 things rdma-netns-nri gives each container of a pod holding RDMA devices: %s", len(lacks), strings.Join(lacks, "; ")),
		nriFix+"; the findings above give the by-hand fix of each")
}
