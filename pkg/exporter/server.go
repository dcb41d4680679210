package exporter

import (
	"context"
	"crypto/tls"
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
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/kubeauth"
	"github.com/rdma-netns/rdma-netns/pkg/nssysfs"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// DefaultListen is where the exporter serves unless told otherwise.
const DefaultListen = ":9761"

// The values of --auth.
const (
	AuthKubernetes = "kubernetes"
	AuthNone       = "none"
)

const usage = `Usage: rdma-netns-exporter [--listen ADDR] [--state-dir DIR] [--dra-dir DIR] [--sysfs ROOT]
       [--auth kubernetes|none] [--tls-cert-file FILE --tls-private-key-file FILE]

Serves the RDMA counters of every RDMA device on the node, in the host
network namespace or in a pod's, at ADDR/metrics (Prometheus exposition
format), labelled with the pod that holds the device (and, for a NIC of a
ResourceClaim of rdma-netns-dra, rdma_device_claim_info names the claim
from the driver's records in --dra-dir); /healthz answers
"ok". Counters are read when scraped; scrapes arriving during a
collection, or within --cache-max-age after it, share it. Run as root on
the node, in the host's network and PID namespaces (it enters pod network
namespaces through /proc/PID/ns/net and /run/netns).

With --auth kubernetes (the default) /metrics answers only a bearer token
that the API server accepts (TokenReview) and whose user may get the
non-resource URL /metrics (SubjectAccessReview), as kube-rbac-proxy does;
it runs in a pod, as its ServiceAccount. It then serves HTTPS, with a
self-signed certificate unless --tls-cert-file is given, so that the
tokens never cross the network in clear. --auth none serves every client
(over HTTP unless a certificate is given): anyone who reaches the node's
port reads every pod's counters.

Flags:
`

// Options are the exporter's command line.
type Options struct {
	Listen, StateDir, DRADir, Sysfs string
	MaxAge                          time.Duration
	Auth                            string
	AuthCacheTTL                    time.Duration
	TLSCert, TLSKey                 string
}

// FlagSet binds the exporter's flags to o (the chart's tests parse the
// DaemonSet's command with it).
func FlagSet(o *Options) *flag.FlagSet {
	fl := flag.NewFlagSet("rdma-netns-exporter", flag.ContinueOnError)
	fl.StringVar(&o.Listen, "listen", DefaultListen, "`ADDR` to serve /metrics and /healthz on")
	fl.StringVar(&o.StateDir, "state-dir", state.DefaultDir, "rdma-netns state `DIR` (the plugin's stateDir), read only")
	fl.StringVar(&o.DRADir, "dra-dir", drarecord.DefaultDir, "rdma-netns-dra's record `DIR` (one file per prepared ResourceClaim), read only; absent: no claim labels")
	fl.StringVar(&o.Sysfs, "sysfs", "/sys", "sysfs `ROOT` of the host")
	fl.DurationVar(&o.MaxAge, "cache-max-age", DefaultMaxAge, "serve a collection to the scrapes arriving within `AGE` after it (0: only to those arriving while it runs); scrapes during a collection always share it")
	fl.StringVar(&o.Auth, "auth", AuthKubernetes, "`MODE` kubernetes: /metrics needs a token whose user RBAC lets get /metrics (TokenReview and SubjectAccessReview, as the pod's ServiceAccount), served over HTTPS; none: no authentication (insecure)")
	fl.DurationVar(&o.AuthCacheTTL, "auth-cache-ttl", kubeauth.DefaultCacheTTL, "keep the API server's verdict on a token for `TTL`: a revoked token or removed binding stops working within it")
	fl.StringVar(&o.TLSCert, "tls-cert-file", "", "serve HTTPS with the certificate (chain) in `FILE`, reloaded when it changes (default with --auth kubernetes: a self-signed one made at start)")
	fl.StringVar(&o.TLSKey, "tls-private-key-file", "", "the private key of --tls-cert-file, in `FILE`")
	return fl
}

// Check says what is wrong with o, as a usage error.
func (o Options) Check() error {
	switch {
	case !filepath.IsAbs(o.StateDir):
		return fmt.Errorf("--state-dir %q must be an absolute path", o.StateDir)
	case !filepath.IsAbs(o.DRADir):
		return fmt.Errorf("--dra-dir %q must be an absolute path", o.DRADir)
	case o.MaxAge < 0:
		return fmt.Errorf("--cache-max-age %v is negative (0 shares only the collection in progress)", o.MaxAge)
	case o.Auth != AuthKubernetes && o.Auth != AuthNone:
		return fmt.Errorf("--auth %q: want %s or %s", o.Auth, AuthKubernetes, AuthNone)
	case o.AuthCacheTTL < 0:
		return fmt.Errorf("--auth-cache-ttl %v is negative", o.AuthCacheTTL)
	case (o.TLSCert == "") != (o.TLSKey == ""):
		return errors.New("--tls-cert-file and --tls-private-key-file go together")
	}
	return nil
}

// Main runs the exporter with the command-line arguments and returns the
// exit status.
func Main(args []string, stderr io.Writer) int {
	var o Options
	if code, ok := cli.Parse(FlagSet(&o), usage, args, stderr); !ok {
		return code
	}
	if err := o.Check(); err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v\n", err)
		return 2
	}
	inv := RealInventory(o.StateDir)
	inv.DRADir = o.DRADir
	c := NewCollector(inv, NodeReader{SysfsRoot: o.Sysfs, Views: &nssysfs.Views{}})
	c.MaxAge = o.MaxAge
	guard, tlsConf, err := o.security()
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v (choose another address with --listen)\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "rdma-netns-exporter: serving /metrics on %s (%s)\n", ln.Addr(), o.describe())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := Serve(ctx, ln, Handler(c, guard), tlsConf); err != nil {
		fmt.Fprintf(stderr, "rdma-netns-exporter: %v\n", err)
		return 1
	}
	return 0
}

// security is the guard in front of /metrics (nil: none) and the TLS
// configuration to serve with (nil: plain HTTP).
func (o Options) security() (*kubeauth.Guard, *tls.Config, error) {
	var guard *kubeauth.Guard
	if o.Auth == AuthKubernetes {
		client, err := kubeauth.InCluster(kubeauth.ServiceAccountDir)
		if err != nil {
			return nil, nil, fmt.Errorf("--auth kubernetes: %v", err)
		}
		guard = kubeauth.NewGuard(client, "/metrics")
		guard.TTL = o.AuthCacheTTL
	}
	switch {
	case o.TLSCert != "":
		conf, err := reloadingTLS(o.TLSCert, o.TLSKey)
		return guard, conf, err
	case guard != nil:
		// Prometheus sends its token with every scrape; over plain HTTP
		// anyone on the path to the node could take it and scrape (or,
		// with the rights Prometheus has, list the cluster's pods) as
		// Prometheus. A self-signed certificate, as kube-rbac-proxy makes,
		// keeps the token from passive eyes; a certificate the scraper
		// verifies (--tls-cert-file) also from an active one.
		conf, err := selfSignedTLS()
		return guard, conf, err
	}
	return nil, nil, nil
}

func (o Options) describe() string {
	scheme := "HTTP"
	if o.TLSCert != "" {
		scheme = "HTTPS, certificate " + o.TLSCert
	} else if o.Auth == AuthKubernetes {
		scheme = "HTTPS, self-signed certificate"
	}
	if o.Auth == AuthNone {
		return scheme + ", no authentication: every client that reaches the port reads every pod's counters"
	}
	return scheme + ", tokens reviewed by the API server"
}

// Handler serves /metrics from c (plus the exporter's own Go and process
// metrics, whose go_threads shows a thread leak if there ever is one),
// behind guard unless it is nil, and /healthz, which tells nothing and so
// needs no token (the kubelet's probes have none).
func Handler(c *Collector, guard *kubeauth.Guard) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// Collect never fails a scrape, but a bug in one metric must not
		// hide all the others.
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 8,
	})
	if guard != nil {
		metrics = guard.Wrap(metrics)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	return mux
}

// Serve serves h on ln until ctx is done, over TLS when tlsConf is set.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, tlsConf *tls.Config) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
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
