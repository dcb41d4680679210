// Command rdma-netns-cri drives containerd over CRI in the test VM.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "usage: rdma-netns-cri demo|bench|stress")
	os.Exit(2)
}
