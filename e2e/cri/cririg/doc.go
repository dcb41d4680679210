// Package cririg runs containerd in the test VM and drives it over CRI the
// way kubelet does, for the tests, the demo and the bench of e2e/cri and for
// any other VM test that needs a real container runtime (the NRI plugin's).
// It only works inside the test VM (scripts/README.md), as root.
//
// What a test does:
//
//	if err := cririg.Setup(); err != nil { ... }          // once per boot: guest setup, images
//	ctd, err := cririg.Start(cririg.Options{})            // containerd with the suite's config
//	n, err := cririg.NetworkOf("rdma-eth1")               // its NIC, address, RDMA device
//	defer ctd.Stop()
//	pod, err := ctd.RunPod(ctx, cririg.PodSpec{Name: "a", Handler: "rdma-eth1"})
//	devs, err := cririg.VerbsDevices(pod.Netns, n.RDMA)   // /dev/infiniband/uverbsN, rdma_cm
//	ctr, err := ctd.RunContainer(ctx, pod, cririg.ContainerSpec{Name: "tools", Devices: devs, AddCaps: []string{"IPC_LOCK"}})
//	res, err := ctd.Exec(ctx, ctr, time.Minute, "ibv_devices")
//	err = ctd.StopPod(ctx, pod.ID); err = ctd.RemovePod(ctx, pod.ID)
//
// Setup runs scripts/guest/cri-setup.sh (shipped in the payload as
// /payload/cri-setup.sh): cgroup v2 at /sys/fs/cgroup, /etc/hosts, a tmpfs
// for containerd's root, and the files of conf/containerd installed where
// a node has them (/etc/containerd/conf.d/rdma-netns.toml, /etc/cni/net.d,
// /etc/cni/rdma-eth<N>.d). Then it builds the two images (BuildImages) and
// Start imports them once (ImportImages): no registry, containerd never pulls.
//
// Start writes containerd's main config (Options.Config, see WriteConfig):
// what the test VM needs on top of a node's (runc's NoPivotRoot, since the
// guest root is an initramfs; the native snapshotter; no AppArmor; the
// pause image pinned), NRI enabled on its default socket
// (/var/run/nri/nri.sock), and an import of /etc/containerd/conf.d/*.toml,
// which brings conf/containerd/rdma-netns.toml's runtime handlers in as a
// node would. Kill SIGKILLs containerd (its shims and pods live on) and
// Start again restarts it on the same state.
//
// TraceCNI puts wrappers in front of the CNI plugins that log every call
// containerd makes (Calls reads them back) and can hold a plugin's call
// before or after the real plugin runs (Hold), to kill containerd, or let
// a RunPodSandbox deadline expire, in the middle of RunPodSandbox; Killed
// lists the calls containerd SIGKILLed.
package cririg
