package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// The binaries the anchors run, from the payload (scripts/build-payload.sh).
const (
	floorBin    = "/usr/local/bin/rdma-netns-floor"
	upstreamBin = "/usr/local/bin/rdma-cni-upstream"
	// baseBin is another rdma-netns build (make bench BENCH_BASE=...), so a
	// change is measured against what it changes in one run: the drift
	// between VM runs is wider than most single changes.
	baseBin = "/usr/local/bin/rdma-netns-base"
)

// contestant is one way of doing ADD then DEL of the same device.
type contestant struct {
	name     string
	add, del func() (time.Duration, error)
	adds     []time.Duration
	dels     []time.Duration
	sums     []time.Duration
}

func (c *contestant) round() error {
	a, err := c.add()
	if err != nil {
		return fmt.Errorf("%s ADD: %v", c.name, err)
	}
	d, err := c.del()
	if err != nil {
		return fmt.Errorf("%s DEL: %v", c.name, err)
	}
	c.adds, c.dels, c.sums = append(c.adds, a), append(c.dels, d), append(c.sums, a+d)
	return nil
}

func execCNI(c rig.Call) (time.Duration, error) {
	r := rig.Exec(c)
	if r.Failed() {
		return 0, fmt.Errorf("%v: %s", r.Err, r.Msg())
	}
	return r.Wall, nil
}

// plusMinimalStart is move's time plus one start of the minimal static
// binary: a plugin's move costs at least that much more, its own start.
func plusMinimalStart(move func() (time.Duration, error)) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		d, err := move()
		if err != nil {
			return 0, err
		}
		s, err := execT(floorBin)
		return d + s, err
	}
}

func execT(argv ...string) (time.Duration, error) {
	t0 := time.Now()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%v: %v: %s", argv, err, out)
	}
	return time.Since(t0), nil
}

// startups times the start of each binary with nothing to do, interleaved:
// a minimal static Go binary, upstream rdma-cni and rdma-netns (VERSION).
func startups(rep *report, n int) (minimal time.Duration, err error) {
	type bin struct {
		name string
		run  func() (time.Duration, error)
		ds   []time.Duration
	}
	bins := []*bin{
		{name: "static Go binary, netlink only (rdma-netns-floor, no args)", run: func() (time.Duration, error) { return execT(floorBin) }},
		{name: "rdma-netns VERSION", run: func() (time.Duration, error) { return execCNI(rig.Call{Verb: "VERSION"}) }},
	}
	if haveUpstream() {
		bins = append(bins, &bin{name: "upstream rdma-cni VERSION", run: func() (time.Duration, error) {
			return execCNI(rig.Call{Bin: upstreamBin, Verb: "VERSION"})
		}})
	}
	for i := 0; i < n; i++ {
		for j := range bins {
			b := bins[(i+j)%len(bins)]
			d, err := b.run()
			if err != nil {
				return 0, fmt.Errorf("%s: %v", b.name, err)
			}
			b.ds = append(b.ds, d)
		}
	}
	base := rig.Summarize(bins[0].ds).Median
	for _, b := range bins {
		size := ""
		if fi, err := os.Stat(binPath(b.name)); err == nil {
			size = fmt.Sprintf("binary %.1f MB", float64(fi.Size())/1e6)
		}
		rep.add("start-up", b.name, rig.Summarize(b.ds), base, "minimal", size)
	}
	return base, nil
}

func binPath(name string) string {
	switch {
	case name[0] == 's':
		return floorBin
	case name[0] == 'u':
		return upstreamBin
	}
	return rig.Plugin
}

func haveUpstream() bool {
	_, err := os.Stat(upstreamBin)
	return err == nil
}

// anchors times ADD+DEL of one device (directly under its PCI function,
// its netdev already in the pod) by rdma-netns, by upstream rdma-cni given
// the deviceID it needs, and by the floor, in interleaved rounds so that
// the VM's drift hits all of them alike.
func anchors(rep *report, nic rig.NIC, pod *rig.Pod, rounds int, minimalStart time.Duration) error {
	if err := rig.MoveNetdevIn(nic.Netdev, pod.Path()); err != nil {
		return err
	}
	defer rig.MoveNetdevOut(nic.Netdev, pod.Path())
	dev := nic.RDMA
	call := func(bin, verb, id string, extra map[string]any) rig.Call {
		conf := rig.PluginConf("bench-anchor", nic.Netdev, pod.Path(), extra)
		return rig.Call{Bin: bin, Verb: verb, ContainerID: id, Netns: pod.Path(), IfName: nic.Netdev, Stdin: conf}
	}
	cniPair := func(name, bin, id string, extra map[string]any) *contestant {
		return &contestant{name: name,
			add: func() (time.Duration, error) { return execCNI(call(bin, "ADD", id, extra)) },
			del: func() (time.Duration, error) { return execCNI(call(bin, "DEL", id, extra)) },
		}
	}
	kernel, err := newKernelRoundTrip(dev, pod.Path())
	if err != nil {
		return err
	}
	defer kernel.close()
	// The floor as the issue defines it: the kernel's move there and back
	// in one process, plus two starts of a minimal static Go binary.
	floor := &contestant{name: "floor: kernel round trip + 2 minimal starts",
		add: plusMinimalStart(kernel.in),
		del: plusMinimalStart(kernel.out),
	}
	floorExec := &contestant{name: "floor program: lookup+move, one exec each way",
		add: func() (time.Duration, error) { return execT(floorBin, "in", dev, pod.Path()) },
		del: func() (time.Duration, error) { return execT(floorBin, "out", dev, pod.Path()) },
	}
	ours := cniPair("rdma-netns, no hint (from the pod's netdev)", rig.Plugin, "anchor-ours", nil)
	oursID := cniPair("rdma-netns, deviceID", rig.Plugin, "anchor-ours-id", map[string]any{"deviceID": nic.PCI})
	all := []*contestant{floor, floorExec, ours, oursID}
	var base *contestant
	if _, err := os.Stat(baseBin); err == nil {
		base = cniPair("rdma-netns BENCH_BASE build, no hint", baseBin, "anchor-base", nil)
		all = append(all, base)
	}
	var upstream *contestant
	if haveUpstream() {
		upstream = cniPair("upstream rdma-cni v1.6.0, deviceID", upstreamBin, "anchor-upstream", map[string]any{"type": "rdma", "deviceID": nic.PCI})
		all = append(all, upstream)
	} else {
		rep.note("upstream rdma-cni not in the payload (build it with PAYLOAD_UPSTREAM=v1.6.0, as make bench does): no upstream anchor")
	}
	// One warm-up round each, not counted: page cache, first netns entry.
	for _, c := range all {
		if err := c.round(); err != nil {
			return err
		}
		c.adds, c.dels, c.sums = nil, nil, nil
	}
	for i := 0; i < rounds; i++ {
		for j := range all {
			if err := all[(i+j)%len(all)].round(); err != nil {
				return fmt.Errorf("round %d: %v", i, err)
			}
		}
	}
	stFloor := rig.Summarize(floor.sums)
	var stUp rig.Stats
	if upstream != nil {
		stUp = rig.Summarize(upstream.sums)
	}
	for _, c := range all {
		st := rig.Summarize(c.sums)
		note := fmt.Sprintf("min %s ms; ADD %s ms, DEL %s ms", rig.Ms(st.Min), rig.Ms(rig.Summarize(c.adds).Median), rig.Ms(rig.Summarize(c.dels).Median))
		if upstream != nil && c != upstream && c != floor {
			note += fmt.Sprintf("; %.2fx upstream", float64(st.Median)/float64(stUp.Median))
		}
		rep.add("ADD+DEL", c.name, st, stFloor.Median, "floor", note)
	}
	rep.note("floor = kernel round trip %s ms (in-process: look up, move in, enter the pod, look up, move out) + 2 x minimal start %s ms",
		rig.Ms(stFloor.Median-2*minimalStart), rig.Ms(minimalStart))
	r := float64(rig.Summarize(ours.sums).Median) / float64(stFloor.Median)
	rep.note("target rdma-netns (no hint) ADD+DEL <= 1.3x floor: %s (%.2fx; per-round ratios %s)", verdict(r <= 1.3), r, spread(ours.sums, floor.sums))
	if upstream != nil {
		r := float64(rig.Summarize(ours.sums).Median) / float64(stUp.Median)
		rep.note("target rdma-netns (no hint) ADD+DEL <= 0.9x upstream: %s (%.2fx; per-round ratios %s)", verdict(r <= 0.9), r, spread(ours.sums, upstream.sums))
		rep.note("upstream ADD+DEL = %.2fx floor", float64(stUp.Median)/float64(stFloor.Median))
	}
	if base != nil {
		rep.note("rdma-netns (no hint) ADD+DEL vs the BENCH_BASE build: %.2fx (per-round ratios %s)",
			float64(rig.Summarize(ours.sums).Median)/float64(rig.Summarize(base.sums).Median), spread(ours.sums, base.sums))
	}
	return nil
}

// spread describes the noise: the quartiles of the per-round ratio a/b.
func spread(a, b []time.Duration) string {
	var rs []float64
	for i := range a {
		if i < len(b) && b[i] > 0 {
			rs = append(rs, float64(a[i])/float64(b[i]))
		}
	}
	if len(rs) == 0 {
		return "n/a"
	}
	sort.Float64s(rs)
	q := func(p float64) float64 { return rs[int(p*float64(len(rs)-1)+0.5)] }
	return fmt.Sprintf("p25 %.2fx, median %.2fx, p75 %.2fx over %d rounds", q(0.25), q(0.5), q(0.75), len(rs))
}

// kernelRoundTrip does the kernel's part of the floor from this process on
// a locked thread: each direction looks the device up (a dump: the kernel
// moves a device by index only) and moves it.
type kernelRoundTrip struct {
	dev       string
	host, pod netns.NsHandle
}

func newKernelRoundTrip(dev, podPath string) (*kernelRoundTrip, error) {
	host, err := netns.Get()
	if err != nil {
		return nil, err
	}
	pod, err := netns.GetFromPath(podPath)
	if err != nil {
		host.Close()
		return nil, err
	}
	return &kernelRoundTrip{dev: dev, host: host, pod: pod}, nil
}

func (k *kernelRoundTrip) close() { k.host.Close(); k.pod.Close() }

func (k *kernelRoundTrip) in() (time.Duration, error) {
	t0 := time.Now()
	link, err := netlink.RdmaLinkByName(k.dev)
	if err != nil {
		return 0, err
	}
	if err := netlink.RdmaLinkSetNsFd(link, uint32(k.pod)); err != nil {
		return 0, fmt.Errorf("move in: %v", err)
	}
	return time.Since(t0), nil
}

func (k *kernelRoundTrip) out() (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := time.Now()
	if err := netns.Set(k.pod); err != nil {
		return 0, err
	}
	link, err := netlink.RdmaLinkByName(k.dev)
	if err == nil {
		err = netlink.RdmaLinkSetNsFd(link, uint32(k.host))
	}
	if err2 := netns.Set(k.host); err2 != nil {
		panic(err2) // the thread is stuck in the pod
	}
	if err != nil {
		return 0, fmt.Errorf("move out: %v", err)
	}
	return time.Since(t0), nil
}
