package exporter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdma-netns/rdma-netns/pkg/cli"
	"github.com/rdma-netns/rdma-netns/pkg/nssysfs"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// DefaultListen is where the exporter serves unless told otherwise.
const DefaultListen = ":9761"

const usage = `Usage: rdma-netns-exporter [--listen ADDR] [--state-dir DIR] [--sysfs ROOT]

Serves the RDMA counters of every RDMA device on the node, in the host
network namespace or in a pod's, at http://ADDR/metrics (Prometheus
exposition format), labelled with the pod that holds the device;
/healthz answers "ok". Counters are read when scraped; scrapes arriving
during a collection, or within --cache-max-age after it, share it. Run as root on the
node, in the host's network and PID namespaces (it enters pod network
namespaces through /proc/PID/ns/net and /run/netns).

Flags:
`

// Main runs the exporter with the command-line arguments and returns the
// exit status.
func Main(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("rdma-netns-exporter", flag.ContinueOnError)
	fl.SetOutput(stderr)
	listen := fl.String("listen", DefaultListen, "`ADDR` to serve /metrics and /healthz on")
	stateDir := fl.String("state-dir", state.DefaultDir, "rdma-netns state `DIR` (the plugin's stateDir), read only")
	sysfs := fl.String("sysfs", "/sys", "sysfs `ROOT` of the host")
	maxAge := fl.Duration("cache-max-age", DefaultMaxAge, "serve a collection to the scrapes arriving within `AGE` after it (0: only to those arriving while it runs); scrapes during a collection always share it")
	fl.Usage = func() {
		fmt.Fprint(stderr, usage)
		fl.PrintDefaults()
	}
	if code, ok := cli.Parse(fl, args, stderr); !ok {
		return code
	}
	if !filepath.IsAbs(*stateDir) {
		fmt.Fprintf(stderr, "rdma-netns-exporter: --state-dir %q must be an absolute path\n", *stateDir)
		return 2
	}
	if *maxAge < 0 {
		fmt.Fprintf(stderr, "rdma-netns-exporter: --cache-max-age %v is negative (0 shares only the collection in progress)\n", *maxAge)
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v (choose another address with --listen)\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "rdma-netns-exporter: serving /metrics on %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c := NewCollector(RealInventory(*stateDir), NodeReader{SysfsRoot: *sysfs, Views: &nssysfs.Views{}})
	c.MaxAge = *maxAge
	if err := Serve(ctx, ln, c); err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v\n", err)
		return 1
	}
	return 0
}

// Handler serves /metrics from c (plus the exporter's own Go and process
// metrics, whose go_threads shows a thread leak if there ever is one) and
// /healthz.
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Collect never fails a scrape, but a bug in one metric must not
		// hide all the others.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 8,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	return mux
}

// Serve serves Handler(c) on ln until ctx is done.
func Serve(ctx context.Context, ln net.Listener, c *Collector) error {
	srv := &http.Server{Handler: Handler(c), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
