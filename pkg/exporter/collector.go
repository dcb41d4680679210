// Package exporter serves the RDMA counters of every device on the node in
// the Prometheus exposition format, labelled with the pod that holds the
// device. A device moved into a pod vanishes from the host's sysfs, so
// node-level monitoring loses it; only the node, through rdma-netns's
// records, knows which pod has which device.
//
// The collector reads at scrape time: it asks the inventory which network
// namespaces the node has (found through records, /run/netns and /proc,
// without entering any), enters each of them once on a locked OS thread,
// lists and reads all of that namespace's devices there (port state,
// netdev, hardware counters and resource counts over RDMA netlink, the
// standard port counters from the netns's own sysfs), pairs the devices
// found with the records that hold them by pkg/inventory's rule, and turns
// it all into metrics. Nothing polls between scrapes; only each netns's
// sysfs is kept from one scrape to the next (nssysfs.Views), without
// keeping the netns alive, and the metrics of the last collection, which
// scrapes within MaxAge of it are served (a burst of scrapes costs one
// walk of the node's namespaces, not one each).
//
// A device a pod holds through a ResourceClaim of rdma-netns-dra is named
// with its claim by rdma_device_claim_info, one series per such device,
// rather than by more labels on every counter: the device's series stay
// what they are without DRA, and a query joins the claim in when it wants
// it.
//
// This package links client_golang; the CNI binary must never import it
// (every pod start would pay for its package init).
package exporter

import (
	"log"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Targets are what one scrape reads: every network namespace of the node
// and the records that may name the pods holding their devices.
type Targets struct {
	// Self is the exporter's own netns, read as "".
	Self inventory.NetnsID
	// Namespaces are the others (Path and ID; the scrape lists their
	// devices when it reads them).
	Namespaces []*inventory.Namespace
	Records    []*state.Record
	// Claims are rdma-netns-dra's records: the ResourceClaims prepared on
	// the node and the NICs of each.
	Claims []*drarecord.Claim
	// Identify resolves the netns path of a record; nil means
	// inventory.Identify.
	Identify func(path string) (inventory.NetnsID, error)
}

// Inventory finds the network namespaces to read, without entering any.
type Inventory interface {
	// Targets may come with an error and still be usable (records that
	// could not be read cost only the pod labels); nil targets mean only
	// the exporter's own netns can be read.
	Targets() (*Targets, error)
}

// Reader reads devices inside one network namespace.
type Reader interface {
	// Read lists and reads every RDMA device of the netns at nsPath ("" =
	// the exporter's own) in one visit. An error means the netns as a
	// whole could not be read.
	Read(nsPath string) ([]DeviceStats, error)
}

// DeviceStats is what one read found for one device.
type DeviceStats struct {
	Name  string
	Ports []PortStats
	// Resources counts the device's objects by kind as RDMA netlink names
	// them (qp, cq, mr, pd, cm_id, ctx, srq).
	Resources map[string]uint64
}

// PortStats is one port of a device.
type PortStats struct {
	Port int
	// Netdev is the netdev the port's GIDs belong to, "" if none.
	Netdev string
	// State and PhysState are the kernel's numeric port states
	// (ib_port_state: 1 DOWN .. 4 ACTIVE; phys: 5 LinkUp), 0 if unknown.
	State, PhysState int
	// HWCounters are the driver's hardware counters (hw_counters).
	HWCounters map[string]uint64
	// Counters are the standard IB port counters (ports/N/counters), on
	// drivers that have them.
	Counters map[string]uint64
}

var (
	portLabels   = []string{"device", "port", "netdev", "namespace", "pod", "host_device"}
	deviceLabels = []string{"device", "namespace", "pod", "host_device"}
)

// Collector is a prometheus.Collector over the node's RDMA devices.
type Collector struct {
	inv    Inventory
	reader Reader
	// parallel bounds the namespaces read at once.
	parallel int
	// netnsExists tells a netns that vanished mid-scrape (a pod deleted:
	// normal, skipped quietly) from one that could not be read.
	netnsExists func(path string) bool
	// MaxAge is how long the metrics of a collection are served to later
	// scrapes (0: only to the scrapes that arrive while it runs).
	MaxAge time.Duration
	// now is the clock MaxAge is measured with.
	now func() time.Time
	// mu guards last, the latest collection, running or done. It is never
	// held while the node is read: a scrape either takes last's metrics or
	// starts the next collection, and scrapes arriving meanwhile wait for
	// that one instead of queueing for a walk of their own.
	mu   sync.Mutex
	last *collection
	// collections counts the walks of the node (rdma_exporter_collections_total).
	collections uint64
	// joined counts the scrapes that waited for a collection another
	// scrape started (tests look at it).
	joined int

	hwCounter, portCounter, portState, physState *prometheus.Desc
	resources, readErrors, duration, devices     *prometheus.Desc
	collectionsTotal, claimInfo                  *prometheus.Desc
}

// DefaultMaxAge is how long a collection is served by default. Two
// Prometheus servers (an HA pair) scraping every node at the same interval
// arrive within a second or so of each other: they share one walk of the
// namespaces. Counters then lag by at most that much, well under any
// scrape interval, so rate() is unaffected; a longer age would only hide
// the walk's cost from rdma_exporter_scrape_duration_seconds' readers.
const DefaultMaxAge = 2 * time.Second

// collection is one walk of the node and the metrics it made; done is
// closed when metrics are set.
type collection struct {
	done     chan struct{}
	metrics  []prometheus.Metric
	finished time.Time // zero while it runs (guarded by Collector.mu)
}

// NewCollector builds a collector reading with reader the devices inv lists.
func NewCollector(inv Inventory, reader Reader) *Collector {
	return &Collector{
		inv:      inv,
		reader:   reader,
		parallel: 4,
		MaxAge:   DefaultMaxAge,
		now:      time.Now,
		netnsExists: func(path string) bool {
			_, err := inventory.Identify(path)
			return err == nil
		},
		hwCounter: prometheus.NewDesc("rdma_port_hw_stat_total",
			"Hardware counter of an RDMA port as its driver names it (hw_counters: iwInRdmaWrites for irdma, rx_write_requests for mlx5, sent_pkts for rxe).",
			append(portLabels[:len(portLabels):len(portLabels)], "counter"), nil),
		portCounter: prometheus.NewDesc("rdma_port_stat_total",
			"Standard port counter of an RDMA port (ports/N/counters; port_xmit_data and port_rcv_data count 4-byte words).",
			append(portLabels[:len(portLabels):len(portLabels)], "counter"), nil),
		portState: prometheus.NewDesc("rdma_port_state",
			"Logical state of an RDMA port: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
			portLabels, nil),
		physState: prometheus.NewDesc("rdma_port_phys_state",
			"Physical state of an RDMA port: 2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery.",
			portLabels, nil),
		resources: prometheus.NewDesc("rdma_device_resources",
			"RDMA objects in use on a device, by kind (qp, cq, mr, pd, cm_id, ctx, srq).",
			append(deviceLabels[:len(deviceLabels):len(deviceLabels)], "resource"), nil),
		claimInfo: prometheus.NewDesc("rdma_device_claim_info",
			"1 for a device in a pod that holds it through a ResourceClaim of rdma-netns-dra: the claim and its request; join on the device's labels to group any metric by claim.",
			append(deviceLabels[:len(deviceLabels):len(deviceLabels)], "claim_namespace", "claim_name", "request"), nil),
		devices: prometheus.NewDesc("rdma_exporter_devices",
			"RDMA devices read in this scrape.", nil, nil),
		readErrors: prometheus.NewDesc("rdma_exporter_read_errors",
			"Network namespaces that exist but could not be read in this scrape, plus 1 when the inventory or the records could not be read; their devices are missing from it (a pod that went away mid-scrape is not an error).", nil, nil),
		duration: prometheus.NewDesc("rdma_exporter_scrape_duration_seconds",
			"Time the collection this scrape was served from took to find and read every RDMA device.", nil, nil),
		collectionsTotal: prometheus.NewDesc("rdma_exporter_collections_total",
			"Walks of the node's network namespaces since the exporter started; scrapes within --cache-max-age of one are served its result.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hwCounter, c.portCounter, c.portState, c.physState, c.resources, c.devices, c.readErrors, c.duration, c.collectionsTotal, c.claimInfo} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Whatever cannot be read is left
// out and counted in rdma_exporter_read_errors; a scrape never fails.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.latest() {
		ch <- m // const metrics: safe to hand to every scrape sharing them
	}
}

// latest returns the metrics of the last collection if it finished less
// than MaxAge ago, else waits for the one running, starting it if none
// is. Scrapes are never serialized behind each other: however many
// arrive during a collection, they all get its result when it ends.
func (c *Collector) latest() []prometheus.Metric {
	c.mu.Lock()
	cur := c.last
	fresh := cur != nil && (cur.finished.IsZero() || c.now().Sub(cur.finished) < c.MaxAge)
	if fresh {
		if cur.finished.IsZero() {
			c.joined++
		}
		c.mu.Unlock()
		<-cur.done
		return cur.metrics
	}
	cur = &collection{done: make(chan struct{})}
	c.last = cur
	c.collections++
	n := c.collections
	c.mu.Unlock()
	c.run(cur, n)
	return cur.metrics
}

// run makes cur's metrics and marks it done.
func (c *Collector) run(cur *collection, n uint64) {
	ch := make(chan prometheus.Metric, 256)
	go func() {
		defer close(ch)
		c.collect(ch)
		ch <- prometheus.MustNewConstMetric(c.collectionsTotal, prometheus.CounterValue, float64(n))
	}()
	var metrics []prometheus.Metric
	for m := range ch {
		metrics = append(metrics, m)
	}
	c.mu.Lock()
	cur.metrics, cur.finished = metrics, c.now()
	c.mu.Unlock()
	close(cur.done)
}

// collect walks the node once and sends what it found.
func (c *Collector) collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	errs, n := 0, 0
	t, err := c.inv.Targets()
	if err != nil {
		log.Printf("rdma-netns-exporter: finding network namespaces and records: %v", err)
		errs++
	}
	if t == nil {
		t = &Targets{}
	}
	paths := []string{""}
	nsOf := map[string]*inventory.Namespace{}
	for _, ns := range t.Namespaces {
		paths = append(paths, ns.Path)
		nsOf[ns.Path] = ns
	}
	// What was read becomes a snapshot of the node, so devices are paired
	// with records by the rule the plugin and the doctor apply.
	snap := &inventory.Snapshot{Self: t.Self, Host: []string{}, Namespaces: []*inventory.Namespace{}}
	stats := map[string]map[string]DeviceStats{} // netns path -> device -> stats
	results := c.readAll(paths)
	if s, ok := c.reader.(interface{ Sweep() }); ok {
		s.Sweep() // every netns of the node was just read
	}
	for _, res := range results {
		if res.err != nil && res.netns != "" && !c.netnsExists(res.netns) {
			continue // the pod went away since the inventory found it
		}
		if res.err != nil {
			log.Printf("rdma-netns-exporter: reading netns %s: %v", res.netns, res.err)
			errs++
			continue
		}
		names := make([]string, 0, len(res.stats))
		stats[res.netns] = map[string]DeviceStats{}
		for _, d := range res.stats {
			names = append(names, d.Name)
			stats[res.netns][d.Name] = d
		}
		if res.netns == "" {
			snap.Host = names
		} else if ns := nsOf[res.netns]; len(names) > 0 {
			ns.Devices = names
			snap.Namespaces = append(snap.Namespaces, ns)
		}
	}
	claimOf := claimsByPod(t.Claims)
	for _, p := range snap.Placements(t.Records, t.Identify) {
		nsPath := ""
		if p.Netns != nil {
			nsPath = p.Netns.Path
		}
		n++
		l := labelsOf(p)
		c.emit(ch, l, stats[nsPath][p.Device])
		if cl, ok := claimOf.find(p.Record); ok {
			ch <- prometheus.MustNewConstMetric(c.claimInfo, prometheus.GaugeValue, 1,
				l.device, l.namespace, l.pod, l.hostDevice, cl.namespace, cl.name, cl.request)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.GaugeValue, float64(errs))
	ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, time.Since(start).Seconds())
}

type nsResult struct {
	netns string
	stats []DeviceStats
	err   error
}

// readAll reads every netns once, at most c.parallel at a time, and
// returns the results in the order of paths.
func (c *Collector) readAll(paths []string) []*nsResult {
	results := make([]*nsResult, len(paths))
	sem := make(chan struct{}, max(c.parallel, 1))
	var wg sync.WaitGroup
	for i, nsPath := range paths {
		res := &nsResult{netns: nsPath}
		results[i] = res
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			res.stats, res.err = c.reader.Read(nsPath)
		}()
	}
	wg.Wait()
	return results
}

// labels are the identity of a device in every metric.
type labels struct{ device, namespace, pod, hostDevice string }

// labelsOf names a device after the pod whose record holds it. The host
// name stays in host_device, so a device renamed in the pod (rdmaDevName)
// can be followed across its moves.
func labelsOf(p inventory.Placement) labels {
	l := labels{device: p.Device, hostDevice: p.Device}
	if r := p.Record; r != nil {
		l.namespace, l.pod = r.K8sNamespace, r.K8sPod
		l.hostDevice = r.Device
	}
	return l
}

// claimDevice is a NIC of a prepared claim.
type claimDevice struct {
	namespace, name, request string
	pci, rdmaDevice          string
}

// podClaims are the claimed NICs of each pod, by namespace/name: what
// the plugin's records know of the pod holding a device.
type podClaims map[[2]string][]claimDevice

func claimsByPod(claims []*drarecord.Claim) podClaims {
	out := podClaims{}
	for _, c := range claims {
		pod := [2]string{c.PodNamespace, c.PodName}
		for _, d := range c.Devices {
			out[pod] = append(out[pod], claimDevice{namespace: c.ClaimNamespace, name: c.ClaimName, request: d.Request, pci: d.PCIAddress, rdmaDevice: d.RdmaDevice})
		}
	}
	return out
}

// find is the claimed NIC that rec, the attachment holding a device,
// moved: a claim of the same pod naming the NIC by its PCI address (its
// identity), or by the host's name for it where the record has no PCI
// address. A device no pod holds has no claim.
func (pc podClaims) find(rec *state.Record) (claimDevice, bool) {
	if rec == nil || rec.K8sPod == "" {
		return claimDevice{}, false
	}
	for _, d := range pc[[2]string{rec.K8sNamespace, rec.K8sPod}] {
		if rec.PCIAddress != "" && d.pci == rec.PCIAddress || rec.PCIAddress == "" && d.rdmaDevice == rec.Device {
			return d, true
		}
	}
	return claimDevice{}, false
}

func (c *Collector) emit(ch chan<- prometheus.Metric, l labels, d DeviceStats) {
	for _, kind := range sortedKeys(d.Resources) {
		ch <- prometheus.MustNewConstMetric(c.resources, prometheus.GaugeValue, float64(d.Resources[kind]),
			l.device, l.namespace, l.pod, l.hostDevice, kind)
	}
	for _, p := range d.Ports {
		pl := []string{l.device, strconv.Itoa(p.Port), p.Netdev, l.namespace, l.pod, l.hostDevice}
		if p.State > 0 {
			ch <- prometheus.MustNewConstMetric(c.portState, prometheus.GaugeValue, float64(p.State), pl...)
		}
		if p.PhysState > 0 {
			ch <- prometheus.MustNewConstMetric(c.physState, prometheus.GaugeValue, float64(p.PhysState), pl...)
		}
		for _, name := range sortedKeys(p.HWCounters) {
			ch <- prometheus.MustNewConstMetric(c.hwCounter, prometheus.CounterValue, float64(p.HWCounters[name]), append(pl, name)...)
		}
		for _, name := range sortedKeys(p.Counters) {
			ch <- prometheus.MustNewConstMetric(c.portCounter, prometheus.CounterValue, float64(p.Counters[name]), append(pl, name)...)
		}
	}
}

func sortedKeys(m map[string]uint64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
