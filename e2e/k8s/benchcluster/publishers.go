package benchcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/driver"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/publish"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// driverPhase runs a publisher per node, wired as rdma-netns-dra's main
// wires it (kubeletplugin.Start with the driver, publish.Publisher on
// the helper's PublishResources, one round per Rescan), all in this
// process against the bench's API server: the first publish, Steady of
// nothing changing, then one NIC of the first node unplugged and plugged
// back. Stopped at the end; their slices stay for the scheduling phases.
func (b *bench) driverPhase(ctx context.Context, dir string) (*DriverResult, error) {
	d := &DriverResult{Nodes: b.nodes}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return d, err
	}
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return d, err
	}
	defer logf.Close()
	logger := log.New(logf, "", log.LstdFlags)
	// One client for every publisher, its rate limit out of the way: a
	// node's driver has its own client and limit, which its few requests
	// never reach.
	rc := *b.rc
	rc.QPS, rc.Burst = 5000, 10000
	cs, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		return d, err
	}
	pctx, stop := context.WithCancel(ctx)
	var helpers []*kubeletplugin.Helper
	var hmu sync.Mutex
	defer func() {
		stop()
		for _, h := range helpers {
			h.Stop()
		}
	}()

	b.progress("driver: starting %d publishers (rdma-netns-dra's publishing code, rescan %v)", b.nodes, b.cfg.Rescan)
	before, err := b.scrape(ctx)
	if err != nil {
		return d, err
	}
	start := time.Now()
	pubs := make([]*publish.Publisher, b.nodes)
	err = parallel(b.nodes, 8, func(i int) error {
		node, root := NodeName(i+1), b.base.Root
		if i == 0 {
			root = b.first.Root
		}
		pdir := filepath.Join(dir, "p", fmt.Sprint(i+1))
		for _, sub := range []string{"reg", "plugin"} {
			if err := os.MkdirAll(filepath.Join(pdir, sub), 0o750); err != nil {
				return err
			}
		}
		records := recordDir(dir, i+1)
		scanner := nics.Scanner{Root: root}
		h, err := kubeletplugin.Start(pctx, &driver.Driver{Records: records, Scanner: scanner, Log: logger},
			kubeletplugin.DriverName(drarecord.DriverName),
			kubeletplugin.KubeClient(cs),
			kubeletplugin.NodeName(node),
			kubeletplugin.RegistrarDirectoryPath(filepath.Join(pdir, "reg")),
			kubeletplugin.PluginDataDirectoryPath(filepath.Join(pdir, "plugin")),
			kubeletplugin.HealthService(false),
		)
		if err != nil {
			return fmt.Errorf("node %s: starting the kubelet plugin helper: %w", node, err)
		}
		hmu.Lock()
		helpers = append(helpers, h)
		hmu.Unlock()
		p := &publish.Publisher{Node: node, Records: records, Scanner: scanner, Sysfs: root, Log: logger, Publish: h.PublishResources}
		p.Once(pctx)
		pubs[i] = p
		return nil
	})
	if err != nil {
		return d, err
	}
	polls, pollBytes, err := b.waitSlices(ctx, 5*time.Minute)
	if err != nil {
		return d, err
	}
	d.FirstPublishTime = time.Since(start)
	// The publishers' rounds from now on, spread over the interval as
	// nodes started at different times spread them.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(rand.N(b.cfg.Rescan)):
			case <-pctx.Done():
				return
			}
			tick := time.NewTicker(b.cfg.Rescan)
			defer tick.Stop()
			for {
				p.Once(pctx)
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	// The watches' first events, then the first publish's total.
	time.Sleep(2 * time.Second)
	after, err := b.scrape(ctx)
	if err != nil {
		return d, err
	}
	d.FirstPublish = TrafficOf(before, after, "resourceslices", "ResourceSlice")
	d.FirstPublish.Requests["LIST"] -= float64(polls)
	d.FirstPublish.ResponseBytes -= pollBytes
	b.progress("driver: %d NIC slices published in %.1fs; per node %.1f requests (%.1f writes), %.0f bytes",
		b.nodes, d.FirstPublishTime.Seconds(), d.FirstPublish.Total()/float64(b.nodes), d.FirstPublish.Writes()/float64(b.nodes),
		(d.FirstPublish.ResponseBytes+d.FirstPublish.WatchBytes)/float64(b.nodes))

	b.progress("driver: %v of steady state, no NIC changing", b.cfg.Steady)
	if before, err = b.scrape(ctx); err != nil {
		return d, err
	}
	start = time.Now()
	select {
	case <-time.After(b.cfg.Steady):
	case <-ctx.Done():
		return d, ctx.Err()
	}
	if after, err = b.scrape(ctx); err != nil {
		return d, err
	}
	d.Window = time.Since(start)
	d.Steady = TrafficOf(before, after, "resourceslices", "ResourceSlice")
	perNodeHour := func(v float64) float64 { return v / float64(b.nodes) / d.Window.Hours() }
	b.progress("driver: steady state: per node per hour %.1f requests, %.1f writes, %.0f bytes",
		perNodeHour(d.Steady.Total()), perNodeHour(d.Steady.Writes()), perNodeHour(d.Steady.ResponseBytes+d.Steady.WatchBytes))

	node := NodeName(1)
	last := len(b.first.NICs) - 1
	change := func(what string, fn func(int) error, want int) (Traffic, time.Duration, error) {
		before, err := b.scrape(ctx)
		if err != nil {
			return Traffic{}, 0, err
		}
		start := time.Now()
		if err := fn(last); err != nil {
			return Traffic{}, 0, err
		}
		polls, pollBytes, err := b.waitDevices(ctx, node, want, 2*b.cfg.Rescan+30*time.Second)
		if err != nil {
			return Traffic{}, 0, fmt.Errorf("NIC %s %s: %w", b.first.NICs[last].PCIAddress, what, err)
		}
		took := time.Since(start)
		time.Sleep(2 * time.Second)
		after, err := b.scrape(ctx)
		if err != nil {
			return Traffic{}, 0, err
		}
		t := TrafficOf(before, after, "resourceslices", "ResourceSlice")
		// The bench's own polls are not the change's cost.
		t.Requests["LIST"] -= float64(polls)
		t.ResponseBytes -= pollBytes
		b.progress("driver: one NIC %s on %s: in its slice after %.1fs; %.0f requests (%.0f writes), %.0f bytes, %.0f watch events",
			what, node, took.Seconds(), t.Total(), t.Writes(), t.ResponseBytes+t.WatchBytes, t.WatchEvents)
		return t, took, nil
	}
	if d.Unplug, d.UnplugTime, err = change("unplugged", b.first.Unplug, NICsPerNode-1); err != nil {
		return d, err
	}
	if d.Replug, d.ReplugTime, err = change("plugged back", b.first.Plug, NICsPerNode); err != nil {
		return d, err
	}
	return d, nil
}

// waitSlices waits for every node's NIC slice; polls and bytes as
// waitDevices.
func (b *bench) waitSlices(ctx context.Context, timeout time.Duration) (polls int, bytes float64, err error) {
	deadline := time.Now().Add(timeout)
	for {
		raw, err := b.cs.ResourceV1().RESTClient().Get().Resource("resourceslices").Param("fieldSelector", "spec.driver="+drarecord.DriverName).DoRaw(ctx)
		if err != nil {
			return polls, bytes, err
		}
		polls++
		bytes += float64(len(raw))
		var l resourceapi.ResourceSliceList
		if err := json.Unmarshal(raw, &l); err != nil {
			return polls, bytes, err
		}
		full := 0
		for _, s := range l.Items {
			if len(s.Spec.Devices) == NICsPerNode {
				full++
			}
		}
		if full == b.nodes {
			return polls, bytes, nil
		}
		if time.Now().After(deadline) {
			return polls, bytes, fmt.Errorf("%d of %d nodes' NIC slices with their %d NICs after %v", full, b.nodes, NICsPerNode, timeout)
		}
		time.Sleep(2 * time.Second)
	}
}

// waitDevices waits for node's NIC slice to hold want devices, and
// says how many LIST requests of how many bytes that took, for the
// caller to take out of what it measures.
func (b *bench) waitDevices(ctx context.Context, node string, want int, timeout time.Duration) (polls int, bytes float64, err error) {
	deadline := time.Now().Add(timeout)
	for {
		n, size, err := b.sliceDevices(ctx, node)
		if err != nil {
			return polls, bytes, err
		}
		polls++
		bytes += float64(size)
		if n == want {
			return polls, bytes, nil
		}
		if time.Now().After(deadline) {
			return polls, bytes, fmt.Errorf("node %s's slice has %d devices after %v, want %d", node, n, timeout, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
