// Command rdma-netns is a CNI meta-plugin that moves the RDMA device of a
// pod's netdev into the pod's network namespace.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/plugin"
)

func main() {
	skel.PluginMainFuncs(plugin.New().Funcs(), version.PluginSupports(config.SupportedVersions...), bv.BuildString("rdma-netns"))
}
