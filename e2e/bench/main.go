// Command rdma-netns-bench measures rdma-netns in the test VM (`make bench`).
//
// The VM emulates its hardware (qemu TCG), so absolute times mean nothing;
// every figure is reported as a ratio to a floor measured in the same run:
// the kernel's own cost of moving an RDMA device between namespaces, and
// the start-up cost of the plugin binary.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
	"github.com/rdma-netns/rdma-netns/plugin"
)

var (
	rounds      = flag.Int("rounds", 30, "rounds for process-level measurements")
	floorRounds = flag.Int("floor-rounds", 100, "rounds for the in-process kernel floor")
	chainRounds = flag.Int("chain-rounds", 15, "rounds for the libcni chain measurements")
	outFile     = flag.String("out", "/tmp/bench.txt", "where to write the table")
	anchorRnds  = flag.Int("anchor-rounds", 20, "interleaved rounds of ADD+DEL against the floor and upstream rdma-cni")
	startRounds = flag.Int("startup-rounds", 40, "interleaved start-ups of each binary")
	sections    = flag.String("sections", "anchor,alone,inproc,trace,chain,devices,concurrent,exporter", "which parts to run, comma separated")
)

func want(section string) bool {
	for _, s := range strings.Split(*sections, ",") {
		if strings.TrimSpace(s) == section {
			return true
		}
	}
	return false
}

type row struct{ section, name, median, p95, ratio, note string }

type report struct {
	rows  []row
	notes []string
}

func (r *report) add(section, name string, s rig.Stats, base time.Duration, baseName, note string) {
	ratio := ""
	if base > 0 {
		ratio = fmt.Sprintf("%.2fx %s", float64(s.Median)/float64(base), baseName)
	}
	r.rows = append(r.rows, row{section, name, rig.Ms(s.Median), rig.Ms(s.P95), ratio, note})
	fmt.Fprintf(os.Stderr, "[bench] %-10s %-52s median %8s ms  p95 %8s ms  %s %s\n", section, name, rig.Ms(s.Median), rig.Ms(s.P95), ratio, note)
}

func (r *report) note(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	r.notes = append(r.notes, s)
	fmt.Fprintf(os.Stderr, "[bench] %s\n", s)
}

func (r *report) write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "section\tmeasurement\tmedian ms\tp95 ms\tratio (median)\tnote")
	fmt.Fprintln(tw, "-------\t-----------\t---------\t------\t--------------\t----")
	for _, x := range r.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", x.section, x.name, x.median, x.p95, x.ratio, x.note)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, n := range r.notes {
		fmt.Fprintln(w, n)
	}
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: FAIL: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	start := time.Now()
	nics, err := rig.Layout()
	if err != nil {
		return err
	}
	if mode, err := netlink.RdmaSystemGetNetnsMode(); err != nil || mode != "exclusive" {
		return fmt.Errorf("needs the VM in exclusive netns mode (mode %q, %v)", mode, err)
	}
	if err := rig.EnsureHostNetns(); err != nil {
		return err
	}
	rep := &report{}
	rep.note("VM: %d NICs, %d vCPUs, kernel RDMA netns mode exclusive; all times from one run, compare ratios only", len(nics), runtime.NumCPU())

	// --- start-up and ADD+DEL side by side with the floor and upstream
	if want("anchor") {
		minimal, err := startups(rep, *startRounds)
		if err != nil {
			return fmt.Errorf("start-up: %v", err)
		}
		pod, err := rig.NewPod()
		if err != nil {
			return err
		}
		err = anchors(rep, nics[0], pod, *anchorRnds, minimal)
		pod.Destroy()
		if err != nil {
			return fmt.Errorf("anchors: %v", err)
		}
		if _, err := rig.WaitHome(nics[:1], 5*time.Second); err != nil {
			return err
		}
	}
	if want("alone") || want("inproc") || want("trace") {
		if err := alone(rep, nics); err != nil {
			return err
		}
	}
	if want("chain") {
		if err := chains(rep, nics[0]); err != nil {
			return err
		}
	}
	// --- the curves of cost against the size of the node (curves.go)
	if want("devices") {
		if err := deviceCounts(rep, nics); err != nil {
			return err
		}
	}
	if want("concurrent") {
		if err := concurrentPods(rep, nics); err != nil {
			return err
		}
	}
	// --- the exporter's scrape cost (exporter.go)
	if want("exporter") {
		if err := exporterScrape(rep, nics); err != nil {
			return err
		}
	}

	if missing, err := rig.WaitHome(nics, 5*time.Second); err != nil || len(missing) > 0 {
		return fmt.Errorf("devices not home after the benchmark: %v %v", missing, err)
	}
	if recs := rig.Records(rig.StateDir); len(recs) > 0 {
		return fmt.Errorf("records left: %v", recs)
	}
	rep.note("bench ran %s; every device back in the host, no state left", time.Since(start).Round(time.Second))

	f, err := os.Create(*outFile)
	if err != nil {
		return err
	}
	rep.write(f)
	f.Close()
	fmt.Println("=== BENCH TABLE BEGIN ===")
	rep.write(os.Stdout)
	fmt.Println("=== BENCH TABLE END ===")
	return nil
}

// alone times rdma-netns ADD and DEL on their own against the kernel's move
// and process start-up, then in-process step by step, and counts syscalls.
func alone(rep *report, nics []rig.NIC) error {
	var startup, trueStart []time.Duration
	var versionRSS int64
	for i := 0; i < *rounds; i++ {
		r := rig.Exec(rig.Call{Verb: "VERSION"})
		if r.Failed() {
			return fmt.Errorf("VERSION: %v %s", r.Err, r.Msg())
		}
		startup = append(startup, r.Wall)
		versionRSS = max(versionRSS, r.MaxRSSKiB)
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return err
		}
		trueStart = append(trueStart, time.Since(t0))
	}
	stStart := rig.Summarize(startup)
	stTrue := rig.Summarize(trueStart)
	rep.add("process", "exec /bin/true (busybox, reference)", stTrue, 0, "", "")
	rep.add("process", "rdma-netns VERSION (start-up)", stStart, stTrue.Median, "/bin/true", fmt.Sprintf("max RSS %d KiB", versionRSS))

	// --- the kernel floor
	dev, netdev := nics[0].RDMA, nics[0].Netdev
	pod, err := rig.NewPod()
	if err != nil {
		return err
	}
	defer pod.Destroy()
	floorIn, floorOut, err := kernelFloor(dev, pod.Path(), *floorRounds)
	if err != nil {
		return fmt.Errorf("kernel floor: %v", err)
	}
	stIn, stOut := rig.Summarize(floorIn), rig.Summarize(floorOut)
	rep.add("floor", "kernel move in (1 RDMA netlink request)", stIn, 0, "", "in-process, thread in host")
	rep.add("floor", "kernel move out (setns+request+setns)", stOut, 0, "", "in-process")
	ipIn, ipOut, ipExec, err := iprouteFloor(dev, pod.Name(), *rounds)
	if err != nil {
		return fmt.Errorf("iproute2 floor: %v", err)
	}
	rep.add("floor", "rdma dev set DEV netns POD (iproute2)", rig.Summarize(ipIn), stIn.Median, "kernel in", "process incl.")
	rep.add("floor", "nsenter --net=POD rdma dev set DEV netns host", rig.Summarize(ipOut), stOut.Median, "kernel out", "process incl.")
	rep.add("floor", "ip netns exec POD rdma dev set DEV netns host", rig.Summarize(ipExec), stOut.Median, "kernel out", "process incl.")

	// --- rdma-netns ADD and DEL alone, binary executed as a runtime does
	if err := rig.MoveNetdevIn(netdev, pod.Path()); err != nil {
		return err
	}
	addCall := rig.Call{Verb: "ADD", ContainerID: "bench-alone", Netns: pod.Path(), IfName: netdev,
		Stdin: rig.PluginConf("bench", netdev, pod.Path(), nil)}
	delCall := addCall
	delCall.Verb = "DEL"
	var adds, dels []time.Duration
	var addRSS, delRSS []int64
	for i := 0; i < *rounds; i++ {
		r := rig.Exec(addCall)
		if r.Failed() {
			return fmt.Errorf("ADD round %d: %v: %s", i, r.Err, r.Msg())
		}
		adds, addRSS = append(adds, r.Wall), append(addRSS, r.MaxRSSKiB)
		r = rig.Exec(delCall)
		if r.Failed() {
			return fmt.Errorf("DEL round %d: %v: %s", i, r.Err, r.Msg())
		}
		dels, delRSS = append(dels, r.Wall), append(delRSS, r.MaxRSSKiB)
	}
	stAdd, stDel := rig.Summarize(adds), rig.Summarize(dels)
	addBase := stIn.Median + stStart.Median
	delBase := stOut.Median + stStart.Median
	rep.add("alone", "rdma-netns ADD (exec)", stAdd, addBase, "(kernel in + start-up)", fmt.Sprintf("peak RSS %d KiB", maxI(addRSS)))
	rep.add("alone", "rdma-netns DEL (exec)", stDel, delBase, "(kernel out + start-up)", fmt.Sprintf("peak RSS %d KiB", maxI(delRSS)))
	rep.add("alone", "rdma-netns ADD - start-up", rig.Stats{Median: stAdd.Median - stStart.Median, P95: stAdd.P95 - stStart.Median}, stIn.Median, "kernel in", "plugin work")
	rep.add("alone", "rdma-netns DEL - start-up", rig.Stats{Median: stDel.Median - stStart.Median, P95: stDel.P95 - stStart.Median}, stOut.Median, "kernel out", "plugin work")
	// --- the same verbs in-process: no start-up, and each step on its own
	if want("inproc") {
		if err := inProcess(rep, pod, netdev, dev, stIn.Median, stOut.Median); err != nil {
			return err
		}
	}

	// --- syscall counts of one ADD and one DEL
	if want("trace") {
		upAdd := rig.Call{Bin: upstreamBin, Verb: "ADD", ContainerID: "bench-upstream", Netns: pod.Path(), IfName: netdev,
			Stdin: rig.PluginConf("bench", netdev, pod.Path(), map[string]any{"type": "rdma", "deviceID": nics[0].PCI})}
		upDel := upAdd
		upDel.Verb = "DEL"
		if err := traced(rep, addCall, delCall, upAdd, upDel); err != nil {
			return err
		}
	}
	if err := rig.MoveNetdevOut(netdev, pod.Path()); err != nil {
		return err
	}
	pod.Destroy()

	return nil
}

func maxI(xs []int64) int64 {
	var m int64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// kernelFloor times the bare RDMA netlink move, in and out, from a locked
// thread: what any implementation has to pay.
func kernelFloor(dev, podPath string, n int) (in, out []time.Duration, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		return nil, nil, err
	}
	defer host.Close()
	pod, err := netns.GetFromPath(podPath)
	if err != nil {
		return nil, nil, err
	}
	defer pod.Close()
	link, err := netlink.RdmaLinkByName(dev)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := netlink.RdmaLinkSetNsFd(link, uint32(pod)); err != nil {
			return nil, nil, fmt.Errorf("move in: %v", err)
		}
		in = append(in, time.Since(t0))
		t0 = time.Now()
		if err := netns.Set(pod); err != nil {
			return nil, nil, err
		}
		err := netlink.RdmaLinkSetNsFd(link, uint32(host))
		if err2 := netns.Set(host); err2 != nil {
			panic(err2) // the thread is stuck in the pod
		}
		if err != nil {
			return nil, nil, fmt.Errorf("move out: %v", err)
		}
		out = append(out, time.Since(t0))
	}
	return in, out, nil
}

func iprouteFloor(dev, podName string, n int) (in, out, viaIPExec []time.Duration, err error) {
	runT := func(argv ...string) (time.Duration, error) {
		t0 := time.Now()
		b, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, b)
		}
		return time.Since(t0), nil
	}
	for i := 0; i < n; i++ {
		d, err := runT(rig.RdmaTool, "dev", "set", dev, "netns", podName)
		if err != nil {
			return nil, nil, nil, err
		}
		in = append(in, d)
		if i%2 == 0 {
			d, err = runT("nsenter", "--net=/run/netns/"+podName, rig.RdmaTool, "dev", "set", dev, "netns", "host")
			out = append(out, d)
		} else {
			d, err = runT(rig.IPTool, "netns", "exec", podName, rig.RdmaTool, "dev", "set", dev, "netns", "host")
			viaIPExec = append(viaIPExec, d)
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	return in, out, viaIPExec, nil
}

// inProcess runs the verbs through the plugin package in this process, so
// no process start-up is included, then each step ADD takes on its own.
func inProcess(rep *report, pod *rig.Pod, netdev, dev string, floorIn, floorOut time.Duration) error {
	p := plugin.New()
	p.Out = io.Discard
	conf := rig.PluginConf("bench", netdev, pod.Path(), nil)
	args := &skel.CmdArgs{ContainerID: "bench-inproc", Netns: pod.Path(), IfName: netdev, StdinData: conf}
	var adds, dels []time.Duration
	for i := 0; i < *rounds; i++ {
		t0 := time.Now()
		if err := p.Add(args); err != nil {
			return fmt.Errorf("in-process ADD: %v", err)
		}
		adds = append(adds, time.Since(t0))
		t0 = time.Now()
		if err := p.Del(args); err != nil {
			return fmt.Errorf("in-process DEL: %v", err)
		}
		dels = append(dels, time.Since(t0))
	}
	stAdd := rig.Summarize(adds)
	rep.add("in-proc", "ADD via plugin package", stAdd, floorIn, "kernel in", "no process start-up")
	rep.add("in-proc", "DEL via plugin package", rig.Summarize(dels), floorOut, "kernel out", "no process start-up")

	// The steps of ADD, each timed alone (device in the host).
	k := rdmans.Netlink{}
	sys := rdmadev.Sysfs{Root: "/sys"}
	dir, err := os.MkdirTemp("", "bench-state")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := state.New(dir)
	if err != nil {
		return err
	}
	rec := &state.Record{Key: state.Key{Network: "bench", ContainerID: "steps", IfName: netdev}, Netns: pod.Path(), Device: dev, State: state.StateMoving}
	// a realistic store: a few other attachments recorded
	for i := 0; i < 4; i++ {
		other := *rec
		other.ContainerID = fmt.Sprintf("other%d", i)
		other.Device = fmt.Sprintf("other%d", i)
		st.Put(&other)
	}
	var parentPath string
	devs, err := sys.Devices()
	if err != nil {
		return err
	}
	steps := []struct {
		name string
		f    func() error
	}{
		{"config.Parse", func() error { _, err := config.Parse(conf, ""); return err }},
		{"ns.GetNS (open+close pod netns)", func() error {
			n, err := ns.GetNS(pod.Path())
			if err == nil {
				n.Close()
			}
			return err
		}},
		{"NetnsMode (netns_mode parameter)", func() error { _, err := k.NetnsMode(); return err }},
		{"state.New + Lock + unlock", func() error {
			s, err := state.New(dir)
			if err != nil {
				return err
			}
			un, err := s.Lock(context.Background())
			if err != nil {
				return err
			}
			return un()
		}},
		{"store.Get (absent)", func() error {
			_, err := st.Get(state.Key{Network: "bench", ContainerID: "none", IfName: "x"})
			if err != nil && !strings.Contains(err.Error(), "no rdma-netns state record") {
				return err
			}
			return nil
		}},
		{"Netdev (setns + netlink)", func() error {
			nd, err := k.Netdev(pod.Path(), netdev)
			if err == nil {
				parentPath, err = sys.BusDevicePath(nd.ParentBus, nd.Parent)
			}
			return err
		}},
		{"Sysfs.Devices (all RDMA devices)", func() error { _, err := sys.Devices(); return err }},
		{"Sysfs.Candidates + Complete (what ADD reads)", func() error {
			cands, _, err := sys.Candidates()
			if err != nil {
				return err
			}
			m := rdmadev.Closest(parentPath, sys.FallbackFunction(parentPath), cands)
			if len(m) != 1 {
				return fmt.Errorf("%d matches", len(m))
			}
			if _, ok := sys.Complete(m[0].Device); !ok {
				return fmt.Errorf("%s gone", m[0].Device.Name)
			}
			return nil
		}},
		{"Closest + FallbackFunction", func() error {
			if m := rdmadev.Closest(parentPath, sys.FallbackFunction(parentPath), devs); len(m) != 1 {
				return fmt.Errorf("%d matches", len(m))
			}
			return nil
		}},
		{"store.List (4 records)", func() error {
			_, err := st.List()
			return err
		}},
		{"store.Put (tmp+rename)", func() error { return st.Put(rec) }},
		{"store.Delete", func() error { return st.Delete(rec.Key) }},
		{"InNetns (setns + dump)", func() error { _, err := k.InNetns(pod.Path(), dev); return err }},
		{"InHost (dump)", func() error { _, err := k.InHost(dev); return err }},
	}
	var sum time.Duration
	for _, s := range steps {
		var ds []time.Duration
		for i := 0; i < *rounds; i++ {
			t0 := time.Now()
			if err := s.f(); err != nil {
				return fmt.Errorf("step %s: %v", s.name, err)
			}
			ds = append(ds, time.Since(t0))
		}
		stS := rig.Summarize(ds)
		rep.add("ADD step", s.name, stS, floorIn, "kernel in", "")
		switch s.name {
		case "InNetns (setns + dump)", "InHost (dump)", "Sysfs.Devices (all RDMA devices)", "Closest + FallbackFunction":
			// not on the path of a first ADD (it takes Candidates)
		default:
			sum += stS.Median
		}
	}
	var moves []time.Duration
	for i := 0; i < *rounds; i++ {
		t0 := time.Now()
		if _, err := k.MoveToNetns(dev, pod.Path(), rdmans.NoIndex); err != nil {
			return err
		}
		moves = append(moves, time.Since(t0))
		if err := k.MoveToHost(dev, pod.Path()); err != nil {
			return err
		}
	}
	stM := rig.Summarize(moves)
	rep.add("ADD step", "rdmans MoveToNetns (dump + move)", stM, floorIn, "kernel in", "")
	// The same two requests without rdmans: a dump, then the move.
	podNS, err := netns.GetFromPath(pod.Path())
	if err != nil {
		return err
	}
	defer podNS.Close()
	var bare, bareDump []time.Duration
	for i := 0; i < *rounds; i++ {
		t0 := time.Now()
		links, err := netlink.RdmaLinkList()
		if err != nil {
			return err
		}
		t1 := time.Now()
		var link *netlink.RdmaLink
		for _, l := range links {
			if l.Attrs.Name == dev {
				link = l
			}
		}
		if link == nil {
			return fmt.Errorf("%s not in the host", dev)
		}
		if err := netlink.RdmaLinkSetNsFd(link, uint32(podNS)); err != nil {
			return err
		}
		bare, bareDump = append(bare, time.Since(t0)), append(bareDump, t1.Sub(t0))
		if err := k.MoveToHost(dev, pod.Path()); err != nil {
			return err
		}
	}
	rep.add("ADD step", "netlink package RdmaLinkList dump (in the loop above)", rig.Summarize(bareDump), floorIn, "kernel in", "")
	rep.add("ADD step", "netlink package dump + move, no rdmans", rig.Summarize(bare), floorIn, "kernel in", "")
	sum += stM.Median
	rep.note("sum of the medians of ADD's steps: %s ms = %.2fx kernel in; whole in-process ADD %s ms",
		rig.Ms(sum), float64(sum)/float64(floorIn), rig.Ms(stAdd.Median))
	return nil
}

func traced(rep *report, addCall, delCall, upAdd, upDel rig.Call) error {
	type tc struct {
		name string
		c    rig.Call
	}
	calls := []tc{{"VERSION", rig.Call{Verb: "VERSION"}}, {"ADD", addCall}, {"DEL", delCall}}
	if haveUpstream() {
		calls = append(calls, tc{"upstream ADD", upAdd}, tc{"upstream DEL", upDel})
	}
	for _, x := range calls {
		counts, r, err := trace(x.c)
		if err != nil {
			return fmt.Errorf("trace %s: %v", x.name, err)
		}
		if r.Failed() {
			return fmt.Errorf("traced %s failed: %v: %s", x.name, r.Err, r.Stdout)
		}
		rep.note("syscalls of one %s: %s", x.name, strings.Join(counts.lines(), ", "))
		rep.note("  most frequent: %s", counts.top(12))
		if x.name == "ADD" || x.name == "DEL" {
			var paths []string
			for p, n := range counts.Paths {
				paths = append(paths, fmt.Sprintf("%dx %s", n, p))
			}
			sort.Strings(paths)
			fmt.Fprintf(os.Stderr, "[bench] %s paths:\n  %s\n", x.name, strings.Join(paths, "\n  "))
		}
	}
	return nil
}

func chains(rep *report, n rig.NIC) error {
	cache, err := os.MkdirTemp("", "bench-cni")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cache)
	c := rig.CNI(cache)
	pod, err := rig.NewPod()
	if err != nil {
		return err
	}
	defer pod.Destroy()
	hdOnly, err := rig.Chain("bench-hd", n.Netdev, 1, nil)
	if err != nil {
		return err
	}
	full, err := rig.Chain("bench-chain", n.Netdev, 1, map[string]any{})
	if err != nil {
		return err
	}
	var hdAdd, hdDel, chAdd, chDel []time.Duration
	rt := rig.RT("bench-chain", pod.Path(), "net1")
	// host-device alone and the whole chain take turns within each round, so
	// that both meet the same conditions and the chain reads against it.
	steps := []struct {
		what string
		call func(*libcni.CNIConfig, *libcni.NetworkConfigList, *libcni.RuntimeConf) error
		l    *libcni.NetworkConfigList
		took *[]time.Duration
	}{
		{"host-device ADD", rig.AddChain, hdOnly, &hdAdd},
		{"host-device DEL", rig.DelChain, hdOnly, &hdDel},
		{"chain ADD", rig.AddChain, full, &chAdd},
		{"chain DEL", rig.DelChain, full, &chDel},
	}
	for i := 0; i < *chainRounds; i++ {
		for _, s := range steps {
			t0 := time.Now()
			if err := s.call(c, s.l, rt); err != nil {
				return fmt.Errorf("%s: %v", s.what, err)
			}
			*s.took = append(*s.took, time.Since(t0))
		}
	}
	sHdA, sHdD := rig.Summarize(hdAdd), rig.Summarize(hdDel)
	rep.add("chain", "host-device(+static) ADD alone", sHdA, 0, "", "libcni")
	rep.add("chain", "host-device + rdma-netns ADD", rig.Summarize(chAdd), sHdA.Median, "host-device alone", "libcni")
	rep.add("chain", "host-device(+static) DEL alone", sHdD, 0, "", "libcni")
	rep.add("chain", "host-device + rdma-netns DEL", rig.Summarize(chDel), sHdD.Median, "host-device alone", "libcni")
	return nil
}
