// Command rdma-netns-exporter serves the RDMA counters of every device on
// the node, labelled with the pod that holds it, for Prometheus. It is a
// binary of its own so that the CNI plugin, executed at every pod start,
// never links client_golang.
package main

import (
	"os"

	"github.com/rdma-netns/rdma-netns/pkg/exporter"
)

func main() {
	os.Exit(exporter.Main(os.Args[1:], os.Stderr))
}
