// Package cri holds the tests that run rdma-netns under a real container
// runtime: containerd 2.x, driven over CRI by a small client of our own
// standing in for kubelet, in the test VM (scripts/README.md). A module of
// its own, like e2e/multus, so that the CRI API, gRPC and
// go-containerregistry never enter the plugin's dependencies.
//
// cririg is the reusable rig (containerd's lifecycle, images, pods,
// containers, exec); cmd/pause is the pods' pause program; cmd/rdma-netns-cri
// is the bench and the stress mode that kill containerd mid
// RunPodSandbox; the tests (build tag e2e) are the scenarios `make test`
// runs.
package cri
