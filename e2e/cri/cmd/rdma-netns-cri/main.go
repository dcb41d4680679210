// Command rdma-netns-cri runs rdma-netns under containerd, driven over CRI
// as kubelet would, in the test VM (e2e/cri/cririg):
//
//	rdma-netns-cri bench [-rounds N]    `make bench`: pod start and stop with and without rdma-netns
//	rdma-netns-cri stress [-rounds N]   `make stress`: containerd SIGKILLed in the middle of RunPodSandbox
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "bench":
		err = bench(os.Args[2:])
	case "stress":
		err = stress(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdma-netns-cri %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rdma-netns-cri bench|stress [flags]")
	os.Exit(2)
}
