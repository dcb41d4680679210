package exporter

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/clocktest"
)

// countingInventory counts the collections: each one asks it once for the
// node's namespaces.
type countingInventory struct {
	Inventory
	calls atomic.Int32
}

func (c *countingInventory) Targets() (*Targets, error) {
	c.calls.Add(1)
	return c.Inventory.Targets()
}

func collections(c *Collector) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.collections)
}

// get GETs url and returns the body, or an error naming what failed.
func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s\n%s", url, resp.Status, body)
	}
	return string(body), nil
}

// scrapeConcurrently makes n scrapes of url, workers at a time, and
// returns the first error.
func scrapeConcurrently(url string, n, workers int) error {
	jobs := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if _, err := get(url); err != nil {
					errs <- err
				}
			}
		}()
	}
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs
}

// 200 scrapes, 8 at a time, in four bursts MaxAge apart, cost four walks
// of the node: one per burst, not one per scrape.
func TestBurstOfScrapesCostsFewCollections(t *testing.T) {
	r := &fakeReader{devices: map[string]map[string]DeviceStats{
		"/run/netns/a": {"rxe2": rxeStats("rxe2", "net1", 3, 4)},
	}}
	inv := &countingInventory{Inventory: nodeWith([]string{"/run/netns/a"})}
	c := NewCollector(inv, r)
	clock := clocktest.New()
	c.now = clock.Now
	srv := httptest.NewServer(Handler(c, nil))
	defer srv.Close()

	const bursts, perBurst = 4, 50
	for range bursts {
		if err := scrapeConcurrently(srv.URL+"/metrics", perBurst, 8); err != nil {
			t.Fatal(err)
		}
		clock.Advance(c.MaxAge)
	}
	if got := inv.calls.Load(); got != bursts {
		t.Errorf("%d scrapes in %d bursts cost %d collections, want %d", bursts*perBurst, bursts, got, bursts)
	}
	if got := r.reads["/run/netns/a"]; got != bursts {
		t.Errorf("the pod's netns entered %d times, want %d", got, bursts)
	}
	// The next scrape starts a fifth collection and says so.
	fams := scrape(t, c)
	if v := value(t, fams, "rdma_exporter_collections_total", nil); v != bursts+1 {
		t.Errorf("rdma_exporter_collections_total = %v, want %d", v, bursts+1)
	}
}

// gatedReader blocks every read of the exporter's own netns until gate is
// closed, and says on entered when one began.
type gatedReader struct {
	fakeReader
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedReader) Read(nsPath string) ([]DeviceStats, error) {
	if nsPath == "" {
		g.entered <- struct{}{}
		<-g.gate
	}
	return g.fakeReader.Read(nsPath)
}

// Scrapes that arrive while a slow collection runs all wait for that one
// collection, side by side, and get its result: none of them queues for
// a walk of its own after it.
func TestSlowCollectionDoesNotSerializeScrapes(t *testing.T) {
	r := &gatedReader{
		fakeReader: fakeReader{devices: map[string]map[string]DeviceStats{"": {"rxe0": rxeStats("rxe0", "eth0", 7, 8)}}},
		entered:    make(chan struct{}, 8),
		gate:       make(chan struct{}),
	}
	c := NewCollector(nodeWith(nil), r)
	c.MaxAge = 0 // no result outlives its collection: only sharing is left
	srv := httptest.NewServer(Handler(c, nil))
	defer srv.Close()

	const scrapes = 8 // promhttp's MaxRequestsInFlight in Handler
	bodies := make([]string, scrapes)
	errs := make([]error, scrapes)
	var wg sync.WaitGroup
	start := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i], errs[i] = get(srv.URL + "/metrics")
		}()
	}
	start(0)
	<-r.entered // the first scrape's collection is reading the node
	for i := 1; i < scrapes; i++ {
		start(i)
	}
	// Wait until the others are all waiting for that collection (no
	// deadline but the test's own).
	for joined := 0; joined < scrapes-1; {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		c.mu.Lock()
		joined = c.joined
		c.mu.Unlock()
	}
	close(r.gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("scrape %d: %v", i, err)
		}
	}
	if got, n := r.reads[""], collections(c); got != 1 || n != 1 {
		t.Errorf("%d concurrent scrapes: %d collections, %d reads of the node, want 1", scrapes, n, got)
	}
	fams, err := ParseText(strings.NewReader(bodies[scrapes-1]))
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, fams, "rdma_port_hw_stat_total", map[string]string{"device": "rxe0", "counter": "sent_pkts"}); v != 7 {
		t.Errorf("a scrape that waited got sent_pkts %v, want the collection's 7", v)
	}
	// The collection is over and MaxAge is 0: the next scrape walks again.
	scrape(t, c)
	if n := collections(c); n != 2 {
		t.Errorf("a scrape after the collection ended: %d collections, want 2", n)
	}
}
