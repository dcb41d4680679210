// Command rdma-netns-dra is the node's DRA driver for its RDMA NICs: it
// publishes them in a ResourceSlice and, when kubelet prepares a claim,
// records which NICs the claim's pod gets, for the rdma-netns CNI plugin
// to attach (docs: the contract in package drarecord). It is a module of
// its own so that client-go and gRPC never link into the CNI plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/driver"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/publish"
	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

const (
	registrarDir = "/var/lib/kubelet/plugins_registry"
	pluginDir    = "/var/lib/kubelet/plugins/" + drarecord.DriverName
)

type options struct {
	node, recordDir, sysfs, kubeconfig string
	cdiDir                             string
	pciAddresses                       string
	rescan                             time.Duration
	busyWait                           time.Duration
}

func main() {
	logger := log.New(os.Stderr, "rdma-netns-dra: ", log.LstdFlags)
	var o options
	fl := flag.NewFlagSet("rdma-netns-dra", flag.ExitOnError)
	fl.StringVar(&o.node, "node-name", os.Getenv("NODE_NAME"), "this node's name: the pool's name and the slice's node (default $NODE_NAME)")
	fl.StringVar(&o.recordDir, "record-dir", drarecord.DefaultDir, "where the claims' records go, read by the rdma-netns CNI plugin; on the node's disk")
	fl.StringVar(&o.cdiDir, "cdi-dir", cdi.DefaultDir, "where each prepared claim's CDI spec goes (its NICs' verbs device nodes, for the containers that name the claim), a directory the runtime reads CDI specs from; empty: no CDI devices (the NRI plugin gives the nodes)")
	fl.StringVar(&o.sysfs, "sysfs", "/sys", "the sysfs to find the NICs in")
	fl.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fl.StringVar(&o.pciAddresses, "pci-addresses", "", "comma-separated PCI addresses (0000:3b:00.0) of the only NICs to offer (default: every RDMA NIC of the node); the others stay with whatever else hands NICs out here")
	fl.DurationVar(&o.rescan, "rescan", 30*time.Second, "how often to look at the NICs again; the slice is published again when they changed")
	fl.DurationVar(&o.busyWait, "busy-wait", 30*time.Second, "how long Prepare waits for a NIC that a claim being released still holds before it refuses the claim (kubelet's call times out at 45s; kubelet tries a refused claim again only 60-90s later)")
	fl.Parse(os.Args[1:])
	if err := run(o, logger); err != nil {
		logger.Printf("%v", err)
		os.Exit(1)
	}
}

func run(o options, logger *log.Logger) error {
	if o.node == "" {
		return fmt.Errorf("no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	}
	if o.rescan <= 0 {
		return fmt.Errorf("--rescan %s: want a positive interval", o.rescan)
	}
	if o.busyWait < 0 {
		return fmt.Errorf("--busy-wait %s: want 0 (refuse a busy NIC at once) or a positive duration", o.busyWait)
	}
	only, err := pciAllowList(o.pciAddresses)
	if err != nil {
		return err
	}
	client, err := kubeClient(o.kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	records := drarecord.Dir(o.recordDir)
	scanner := nics.Scanner{Root: o.sysfs, Only: only}
	d := &driver.Driver{Records: records, Scanner: scanner, Log: logger, BusyWait: o.busyWait}
	if o.cdiDir != "" {
		d.CDI = &cdi.Dir{Path: o.cdiDir}
		sweepCDI(*d.CDI, records, logger)
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(drarecord.DriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(o.node),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
		// The driver orders its calls itself (Driver.mu); serialized by the
		// helper, a Prepare waiting for a busy NIC would hold off the
		// Unprepare that releases it.
		kubeletplugin.Serialize(false),
	}
	if o.cdiDir != "" {
		// The device metadata file of each request (Driver.metadata), in
		// the plugin directory, bind-mounted into the containers by a CDI
		// spec of the helper's in the same CDI directory; only the latest
		// version of its format, which the helper requires.
		opts = append(opts, kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
			kubeletplugin.CDIDirectory(o.cdiDir))
	}
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin %s (registrar %s, plugin dir %s; both must be mounted from the host at the same paths): %w",
			drarecord.DriverName, registrarDir, pluginDir, err)
	}
	defer helper.Stop()
	logger.Printf("registered with kubelet as %s on node %s; records in %s, NICs from %s", drarecord.DriverName, o.node, o.recordDir, o.sysfs)

	p := &publish.Publisher{Node: o.node, Records: records, Scanner: scanner, Sysfs: o.sysfs, Log: logger, Publish: helper.PublishResources}
	tick := time.NewTicker(o.rescan)
	defer tick.Stop()
	for {
		if gone := missingSocket(kubeletSockets(registrarDir, pluginDir)); gone != "" {
			return fmt.Errorf("the kubelet's socket %s is gone: another instance of the driver removed it as it stopped "+
				"(an upgrade from a chart that ran the driver in the rdma-netns DaemonSet overlaps the two), so the kubelet no longer reaches this one; "+
				"exiting, for the kubelet to restart this container, which registers again", gone)
		}
		p.Once(ctx)
		select {
		case <-ctx.Done():
			logger.Printf("stopping: %v", context.Cause(ctx))
			return nil
		case <-tick.C:
		}
	}
}

// sweepCDI removes the CDI specs of claims that have no record (a driver
// stopped between an Unprepare's two removals). A spec whose claim the
// records cannot confirm is kept: a container of a prepared claim must
// not lose its nodes to a record this instance failed to read.
func sweepCDI(dir cdi.Dir, records drarecord.Dir, logger *log.Logger) {
	recs, bad, err := records.List()
	if err != nil || len(bad) > 0 {
		logger.Printf("CDI specs in %s: not swept, the records are unreadable (%v, %d damaged)", dir.Path, err, len(bad))
		return
	}
	keep := make(map[string]bool, len(recs))
	for _, r := range recs {
		keep[r.ClaimUID] = true
	}
	gone, err := dir.Sweep(keep)
	if err != nil {
		logger.Printf("CDI specs in %s: sweeping those of claims without a record: %v", dir.Path, err)
	}
	for _, uid := range gone {
		logger.Printf("CDI specs: removed claim %s's, which has no record", uid)
	}
}

// kubeletSockets are where kubeletplugin, given these directories,
// listens for the kubelet: the registration socket the kubelet watches
// for, and the DRA service's.
func kubeletSockets(registrar, plugin string) []string {
	return []string{
		filepath.Join(registrar, drarecord.DriverName+"-reg.sock"),
		filepath.Join(plugin, "dra.sock"),
	}
}

// missingSocket is the first of paths that is not there, "" when all are.
// A driver stopping removes its sockets by path as it closes them,
// whichever process listens there now: an instance that stops while
// another has started takes the other's sockets away.
func missingSocket(paths []string) string {
	for _, p := range paths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return p
		}
	}
	return ""
}

// pciAllowList parses --pci-addresses; empty means every NIC.
func pciAllowList(s string) (map[string]bool, error) {
	if s == "" {
		return nil, nil
	}
	only := map[string]bool{}
	for _, a := range strings.Split(s, ",") {
		a = strings.ToLower(strings.TrimSpace(a))
		if !rdmadev.IsPCIAddress(a) {
			return nil, fmt.Errorf("--pci-addresses: %q is not a PCI address (want domain:bus:device.function, 0000:3b:00.0)", a)
		}
		only[a] = true
	}
	return only, nil
}

func kubeClient(kubeconfig string) (*kubernetes.Clientset, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kube client config (pass --kubeconfig outside a pod): %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}
