// Command rdma-netns-nri is the NRI plugin that gives the containers of a
// pod holding RDMA devices their device nodes, memlock limit and /dev/shm
// (pkg/nriplugin). It is a binary of its own so that the NRI stub and
// ttrpc never link into the CNI plugin, which every pod start executes.
package main

import (
	"os"

	"github.com/rdma-netns/rdma-netns/pkg/nriplugin"
)

func main() {
	os.Exit(nriplugin.Main(os.Args[1:], os.Stderr))
}
