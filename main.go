// Command rdma-netns is a CNI meta-plugin that moves the RDMA device of a
// pod's netdev into the pod's network namespace. Run by a person as
// `rdma-netns doctor`, it diagnoses the node and pods instead;
// `rdma-netns install` copies it into a CNI bin directory (the DaemonSet).
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/version"
	bv "github.com/containernetworking/plugins/pkg/utils/buildversion"

	"github.com/rdma-netns/rdma-netns/pkg/cnimain"
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/install"
	"github.com/rdma-netns/rdma-netns/plugin"
)

func main() {
	if os.Getenv("CNI_COMMAND") == "" && len(os.Args) > 1 {
		switch os.Args[1] {
		case "doctor":
			os.Exit(doctor.Main(os.Args[2:], os.Stdout, os.Stderr))
		case "install":
			os.Exit(install.Main(os.Args[2:], bv.BuildVersion, os.Stdout, os.Stderr))
		}
	}
	cnimain.Main(plugin.New().Funcs(), version.PluginSupports(config.SupportedVersions...), bv.BuildString("rdma-netns"))
}
