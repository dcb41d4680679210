package benchcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/gpudriver"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// Config is one run of the bench.
type Config struct {
	BinDir  string // scripts/k8s/build.sh's binaries
	Dir     string // state: the control plane's, the sysfs trees, the publishers' directories
	ConfDir string // conf/, whose templates and class are used as shipped
	// Ports of the bench's own control plane: not the e2e suite's, which
	// may be running on the same machine.
	APIServerPort, EtcdPort, KubeletPort int
	Sizes                                []int
	Templates                            []Template
	// InFlight bounds the pods created and not yet scheduled: enough to
	// keep the scheduler busy, few enough that a pod's latency is its
	// own and not a queue's.
	InFlight int
	// Steady is how long the N publishers run with no NIC change; Rescan
	// their interval (the driver's --rescan).
	Steady, Rescan time.Duration
	// Stall fails a phase in which no pod was scheduled for that long.
	Stall time.Duration
	Out   io.Writer // progress lines
}

// Result is one template's job at one size.
type Result struct {
	Nodes    int
	Template Template
	// Fill is every pod from the empty cluster to the full one; Empty,
	// Half and Full the pods created while it was 0-10 %, 45-55 % and
	// 90-100 % full.
	Fill, Empty, Half, Full Summary
	// Refused is how long the scheduler took to mark the pod that fits
	// nowhere unschedulable; PlainAfter the latency of a pod without
	// claims created right after it (a queue the refused pod stalled
	// would show here).
	Refused, PlainAfter time.Duration
	// SchedulerCPU is the scheduler's CPU time during the fill.
	SchedulerCPU time.Duration
}

// DriverResult is the N publishers' cost to the API server at one size.
type DriverResult struct {
	Nodes int
	// FirstPublish is every publisher's start (list, watch, the Node's
	// get, the slice's create), FirstPublishTime until all N slices were
	// there.
	FirstPublish     Traffic
	FirstPublishTime time.Duration
	// Steady is Window of nothing changing.
	Steady Traffic
	Window time.Duration
	// Unplug and Replug are one NIC of one node leaving and coming back:
	// the traffic from the change until the slice showed it (one rescan
	// at most), and how long that took.
	Unplug, Replug         Traffic
	UnplugTime, ReplugTime time.Duration
}

const namespace = "bench"

// Run runs the bench at each size, a control plane of its own each time.
func Run(ctx context.Context, cfg Config) ([]Result, []DriverResult, error) {
	var results []Result
	var drivers []DriverResult
	for _, n := range cfg.Sizes {
		r, d, err := runSize(ctx, cfg, n)
		results = append(results, r...)
		if d != nil {
			drivers = append(drivers, *d)
		}
		if err != nil {
			return results, drivers, fmt.Errorf("%d nodes: %w", n, err)
		}
	}
	return results, drivers, nil
}

type bench struct {
	cfg   Config
	nodes int
	cp    *cluster.ControlPlane
	cs    kubernetes.Interface
	rc    *rest.Config
	base  *Server // the sysfs of every node but the first
	first *Server // the first node's, which changes
	pods  *podWatch
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.cfg.Out, "[bench-cluster] %s N=%d: %s\n", time.Now().Format("15:04:05"), b.nodes, fmt.Sprintf(format, args...))
}

func runSize(ctx context.Context, cfg Config, n int) ([]Result, *DriverResult, error) {
	b := &bench{cfg: cfg, nodes: n}
	began := time.Now()
	dir := filepath.Join(cfg.Dir, fmt.Sprintf("n%d", n))
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, err
	}
	b.progress("control plane (etcd, kube-apiserver, kube-scheduler, the resourceclaim controller) on 127.0.0.1:%d", cfg.APIServerPort)
	qps := []string{"--kube-api-qps", "1000", "--kube-api-burst", "2000"}
	cp, err := cluster.Start(cluster.Config{
		BinDir: cfg.BinDir, Dir: filepath.Join(dir, "k8s"), GuestDir: filepath.Join(dir, "k8s", "guest"),
		APIServerPort: cfg.APIServerPort, EtcdPort: cfg.EtcdPort, KubeletPort: cfg.KubeletPort,
		Args: map[string][]string{
			"kube-controller-manager": append([]string{"--controllers", "resourceclaim-controller"}, qps...),
			"kube-scheduler":          qps,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	defer cp.Stop()
	b.cp = cp
	if b.rc, err = clientcmd.BuildConfigFromFlags("", cp.Admin); err != nil {
		return nil, nil, err
	}
	b.rc.QPS, b.rc.Burst = 1000, 2000
	if b.cs, err = kubernetes.NewForConfig(b.rc); err != nil {
		return nil, nil, err
	}
	if b.base, err = Write(filepath.Join(dir, "sys", "base")); err != nil {
		return nil, nil, err
	}
	if b.first, err = Write(filepath.Join(dir, "sys", "first")); err != nil {
		return nil, nil, err
	}
	if err := b.setup(ctx); err != nil {
		return nil, nil, err
	}
	d, err := b.driverPhase(ctx, filepath.Join(dir, "publishers"))
	if err != nil {
		return nil, d, fmt.Errorf("publishers: %w (logs: %s)", err, filepath.Join(dir, "publishers", "log"))
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	if b.pods, err = watchPods(pctx, b.cs); err != nil {
		return nil, d, err
	}
	var results []Result
	for _, t := range cfg.Templates {
		r, err := b.schedule(ctx, t)
		if err != nil {
			return results, d, fmt.Errorf("%s: %w (scheduler log: %s)", t.Name, err, cp.LogPath("kube-scheduler"))
		}
		results = append(results, r)
		if err := b.clear(ctx); err != nil {
			return results, d, fmt.Errorf("clearing %s's pods: %w", t.Name, err)
		}
	}
	cpu := b.cp.CPU()
	b.progress("done in %.0fs; CPU: kube-apiserver %.0fs, etcd %.0fs, kube-scheduler %.0fs, kube-controller-manager %.0fs",
		time.Since(began).Seconds(), cpu["kube-apiserver"].Seconds(), cpu["etcd"].Seconds(), cpu["kube-scheduler"].Seconds(), cpu["kube-controller-manager"].Seconds())
	return results, d, nil
}

// setup makes the namespace, the classes and templates, the nodes and
// their GPU slices; the NIC slices are the publishers' (driverPhase).
func (b *bench) setup(ctx context.Context) error {
	start := time.Now()
	if _, err := b.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// No serviceaccount controller runs: the pods' admission wants the
	// namespace's default account.
	if _, err := b.cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	nicClass, err := NICClass(b.cfg.ConfDir)
	if err != nil {
		return err
	}
	for _, c := range []*resourceapi.DeviceClass{nicClass, gpudriver.DeviceClass(GPUClass, GPUDriver)} {
		if _, err := b.cs.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", c.Name, err)
		}
	}
	for _, t := range b.cfg.Templates {
		tmpl, err := t.Load(b.cfg.ConfDir)
		if err != nil {
			return err
		}
		if _, err := b.cs.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("ResourceClaimTemplate %s: %w", t.Name, err)
		}
	}
	gpus, err := GPUDevices(b.base)
	if err != nil {
		return err
	}
	err = parallel(b.nodes, 16, func(i int) error {
		name := NodeName(i + 1)
		node, err := b.cs.CoreV1().Nodes().Create(ctx, NodeObject(name), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		// The API server's TaintNodesByCondition admission taints a new
		// node not-ready, for the node lifecycle controller to lift once
		// its kubelet reports; no kubelet here, no such controller.
		if len(node.Spec.Taints) > 0 {
			node.Spec.Taints = nil
			if node, err = b.cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("node %s's taints: %w", name, err)
			}
		}
		if len(node.Status.Conditions) == 0 {
			node.Status = NodeObject(name).Status
			if _, err := b.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("node %s's status: %w", name, err)
			}
		}
		_, err = b.cs.ResourceV1().ResourceSlices().Create(ctx, Slice(GPUDriver, name, gpus), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	b.progress("%d Ready nodes and their GPU slices (%d GPUs each, the stand-in driver's) in %.1fs", b.nodes, len(gpus), time.Since(start).Seconds())
	return nil
}

// scrape reads the API server's metrics.
func (b *bench) scrape(ctx context.Context) (Metrics, error) {
	raw, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scraping the API server's metrics: %w", err)
	}
	return ParseMetrics(string(raw))
}

// schedule fills the cluster with t's pods, then asks for one more.
func (b *bench) schedule(ctx context.Context, t Template) (Result, error) {
	r := Result{Nodes: b.nodes, Template: t}
	capacity := t.PerNode * b.nodes
	b.progress("%s: %d pods (%d a node) until the cluster is full, %d in flight", t.Name, capacity, t.PerNode, b.cfg.InFlight)
	cpu0 := b.cp.CPU()["kube-scheduler"]
	samples, err := b.fill(ctx, t, capacity)
	if err != nil {
		return r, err
	}
	r.SchedulerCPU = b.cp.CPU()["kube-scheduler"] - cpu0
	r.Fill = Summarize(samples)
	r.Empty, r.Half, r.Full = States(samples)
	b.progress("%s: %d pods scheduled in %.1fs: %.1f pods/s (empty %.1f, half full %.1f, nearly full %.1f), p50 %v p99 %v, scheduler CPU %.1fs",
		t.Name, r.Fill.Pods, r.Fill.Elapsed.Seconds(), r.Fill.Rate, r.Empty.Rate, r.Half.Rate, r.Full.Rate, ms(r.Fill.P50), ms(r.Fill.P99), r.SchedulerCPU.Seconds())

	extra := t.Name + "-unplaceable"
	refused, scheduled, err := b.one(ctx, Pod(extra, t.Name), 3*time.Minute)
	if err != nil {
		return r, err
	}
	if scheduled {
		return r, fmt.Errorf("pod %s was scheduled on a full cluster: the template's pods per node (%d) is wrong", extra, t.PerNode)
	}
	r.Refused = refused
	plain := t.Name + "-plain"
	lat, scheduled, err := b.one(ctx, PlainPod(plain), time.Minute)
	if err != nil {
		return r, err
	}
	if !scheduled {
		return r, fmt.Errorf("pod %s, without claims, was refused", plain)
	}
	r.PlainAfter = lat
	b.progress("%s: the pod that fits nowhere refused in %v (%s); a pod without claims after it scheduled in %v", t.Name, ms(refused), b.pods.message(extra), ms(lat))
	return r, nil
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// fill creates capacity pods of t, at most InFlight unscheduled at once,
// but for the probes (Probes): each of those is created alone, once the
// pods before it are placed, so that its latency is the pod's own and
// not the queue's.
func (b *bench) fill(ctx context.Context, t Template, capacity int) ([]Sample, error) {
	samples := make([]Sample, capacity)
	probe, drain := Probes(capacity), Drains(capacity)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	slots := make(chan struct{}, max(b.cfg.InFlight, 1))
	todo := make(chan int)
	var wg sync.WaitGroup
	name := func(i int) string { return fmt.Sprintf("%s-%05d", t.Name, i) }
	// create creates pod i; done closes at its bind.
	create := func(i int) (done <-chan struct{}, err error) {
		done = b.pods.expect(name(i), false)
		samples[i].Created = time.Now()
		if _, err := b.cs.CoreV1().Pods(namespace).Create(ctx, Pod(name(i), t.Name), metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating pod %s: %w", name(i), err)
		}
		return done, nil
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				done, err := create(i)
				if err != nil {
					cancel(err)
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-done:
					case <-ctx.Done():
						return
					}
					samples[i].Scheduled, _ = b.pods.outcome(name(i))
					<-slots
				}()
			}
		}()
	}
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	stall := b.cfg.Stall
	// acquire takes n slots: n pods may go.
	acquire := func(n, i int) error {
		for got := 0; got < n; {
			select {
			case slots <- struct{}{}:
				got++
			case <-tick.C:
				b.progress("%s: %d of %d pods created", t.Name, i, capacity)
			case <-time.After(stall):
				return fmt.Errorf("no pod scheduled for %v with %d of %d created", stall, i, capacity)
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return nil
	}
	release := func(n int) {
		for ; n > 0; n-- {
			<-slots
		}
	}
	err := func() error {
		defer close(todo)
		for i := 0; i < capacity; i++ {
			if probe[i] {
				// Every slot: the pods before placed, none beside.
				if err := acquire(cap(slots), i); err != nil {
					return err
				}
				samples[i].Probe = true
				done, err := create(i)
				if err == nil {
					select {
					case <-done:
						samples[i].Scheduled, _ = b.pods.outcome(name(i))
					case <-time.After(stall):
						err = fmt.Errorf("probe pod %s not scheduled within %v", name(i), stall)
					case <-ctx.Done():
						err = context.Cause(ctx)
					}
				}
				release(cap(slots))
				if err != nil {
					return err
				}
				continue
			}
			if drain[i] {
				if err := acquire(cap(slots), i); err != nil {
					return err
				}
				release(cap(slots))
			}
			if err := acquire(1, i); err != nil {
				return err
			}
			select {
			case todo <- i:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		// The last ones: every slot back.
		return acquire(cap(slots), capacity)
	}()
	if err != nil {
		cancel(err)
	}
	wg.Wait()
	return samples, err
}

// one creates a pod and waits for the scheduler's verdict: its latency
// either way, and whether it was placed.
func (b *bench) one(ctx context.Context, pod *corev1.Pod, timeout time.Duration) (time.Duration, bool, error) {
	done := b.pods.expect(pod.Name, true)
	start := time.Now()
	if _, err := b.cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, false, fmt.Errorf("creating pod %s: %w", pod.Name, err)
	}
	select {
	case <-done:
	case <-time.After(timeout):
		return 0, false, fmt.Errorf("pod %s: neither scheduled nor refused within %v", pod.Name, timeout)
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	at, refused := b.pods.outcome(pod.Name)
	return at.Sub(start), !refused, nil
}

// clear deletes the pods at once (no kubelet to wait for) and their
// claims, which frees the devices for the next template. The claims go
// by hand, their finalizer dropped: without the garbage collector the
// resourceclaim controller leaves a deleted pod's claim in place.
func (b *bench) clear(ctx context.Context) error {
	start := time.Now()
	if err := b.cs.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		return err
	}
	claims, err := b.cs.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	err = parallel(len(claims.Items), 16, func(i int) error {
		c := claims.Items[i]
		patch := []byte(`{"metadata":{"finalizers":null}}`)
		if _, err := b.cs.ResourceV1().ResourceClaims(namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := b.cs.ResourceV1().ResourceClaims(namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		pods, err := b.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		claims, err := b.cs.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 && len(claims.Items) == 0 {
			b.progress("cleared in %.1fs", time.Since(start).Seconds())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods and %d claims left after 2m", len(pods.Items), len(claims.Items))
		}
	}
}

// parallel runs fn(0..n-1) on workers goroutines; the first error stops it.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// podWatch is what the bench's pod informer saw: when each pod was first
// seen bound to a node, or marked unschedulable.
type podWatch struct {
	mu        sync.Mutex
	scheduled map[string]time.Time
	refused   map[string]time.Time
	why       map[string]string // the first refusal's message
	waiters   map[string]chan struct{}
	// verdict: the pods whose refusal ends the wait; the others' waits
	// end at their bind only, since a pod may be marked unschedulable
	// for a while (its claim not yet created) and placed after.
	verdict map[string]bool
}

func watchPods(ctx context.Context, cs kubernetes.Interface) (*podWatch, error) {
	w := &podWatch{scheduled: map[string]time.Time{}, refused: map[string]time.Time{}, why: map[string]string{}, waiters: map[string]chan struct{}{}, verdict: map[string]bool{}}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Pods().Informer()
	see := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			w.see(p)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    see,
		UpdateFunc: func(_, obj any) { see(obj) },
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, errors.New("the pod informer did not sync")
	}
	return w, nil
}

// expect registers a pod before its create: the returned channel closes
// at its bind, or, with refusal, at its first refusal too.
func (w *podWatch) expect(name string, refusal bool) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waiters[name] = ch
	w.verdict[name] = refusal
	return ch
}

func (w *podWatch) see(p *corev1.Pod) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	name := p.Name
	if _, ok := w.scheduled[name]; ok {
		return
	}
	switch {
	case p.Spec.NodeName != "":
		w.scheduled[name] = now
	case unschedulable(p) != "":
		if _, ok := w.refused[name]; ok {
			return
		}
		w.refused[name], w.why[name] = now, unschedulable(p)
		if !w.verdict[name] {
			return
		}
	default:
		return
	}
	if ch, ok := w.waiters[name]; ok {
		close(ch)
		delete(w.waiters, name)
	}
}

// unschedulable is the scheduler's message when it marked p
// unschedulable, "" otherwise.
func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return "refused: " + c.Message
		}
	}
	return ""
}

func (w *podWatch) message(name string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.why[name]
}

// outcome is the time of the verdict, and whether it was a refusal.
func (w *podWatch) outcome(name string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.scheduled[name]; ok {
		return t, false
	}
	return w.refused[name], true
}

// recordDir is a publisher's record directory, as drarecord lays it out.
func recordDir(dir string, i int) drarecord.Dir {
	return drarecord.Dir(filepath.Join(dir, "records", fmt.Sprint(i)))
}

// sliceDevices counts the devices in node's NIC slices; size is the
// response's, as the API server sizes it (JSON, uncompressed).
func (b *bench) sliceDevices(ctx context.Context, node string) (n, size int, err error) {
	sel := resourceapi.ResourceSliceSelectorDriver + "=" + drarecord.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node
	raw, err := b.cs.ResourceV1().RESTClient().Get().Resource("resourceslices").Param("fieldSelector", sel).DoRaw(ctx)
	if err != nil {
		return 0, 0, err
	}
	var l resourceapi.ResourceSliceList
	if err := json.Unmarshal(raw, &l); err != nil {
		return 0, 0, err
	}
	for _, s := range l.Items {
		n += len(s.Spec.Devices)
	}
	return n, len(raw), nil
}
