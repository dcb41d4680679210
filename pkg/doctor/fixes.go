package doctor

// nriFix is the fix of what a container of a pod holding RDMA devices
// lacks that rdma-netns-nri gives it (memlock, /dev/shm, device nodes):
// with NRI (containerd >= 1.7, on by default in 2.x; CRI-O with
// enable_nri) the plugin gives every such container all three when it
// is created. Several checks start their fix with it.
const nriFix = "run rdma-netns-nri on the node (conf/daemonset.yaml, container nri) and recreate the pod: NRI changes containers only when they are created"
