package exporter

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/kubeauth"
)

// reviewer allows the token "prom" and knows no other.
type reviewer struct{}

func (reviewer) Review(_ context.Context, token, path, verb string) (kubeauth.Verdict, kubeauth.User, error) {
	if token == "prom" && path == "/metrics" && verb == "get" {
		return kubeauth.Allowed, kubeauth.User{Username: "prometheus"}, nil
	}
	return kubeauth.Unauthenticated, kubeauth.User{}, nil
}

// serveTLS serves h as Main does with conf and returns its address.
func serveTLS(t *testing.T, h http.Handler, conf *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, h, conf) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

func insecureClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	return &http.Client{Transport: tr}
}

func status(t *testing.T, c *http.Client, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// With authentication, the exporter serves HTTPS with its self-signed
// certificate, /metrics only to an allowed token, /healthz to anyone (the
// kubelet's probes), and nothing in clear.
func TestServeGuardedOverTLS(t *testing.T) {
	conf, err := selfSignedTLS()
	if err != nil {
		t.Fatal(err)
	}
	c := NewCollector(nodeWith(nil), &fakeReader{})
	addr := serveTLS(t, Handler(c, kubeauth.NewGuard(reviewer{}, "/metrics")), conf)
	client := insecureClient()
	base := "https://" + addr
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "tenant", http.StatusUnauthorized},
		{"/metrics", "prom", http.StatusOK},
		{"/healthz", "", http.StatusOK},
	} {
		if got := status(t, client, base+tc.path, tc.token); got != tc.want {
			t.Errorf("GET %s with token %q: %d, want %d", tc.path, tc.token, got, tc.want)
		}
	}
	// A scraper left on http:// gets no metrics (Go's server answers a
	// plain request on a TLS port with a 400 saying to use HTTPS).
	resp, err := http.Get("http://" + addr + "/metrics")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(body, []byte("rdma_exporter_devices")) {
			t.Errorf("plain HTTP on the TLS port: %s\n%s", resp.Status, body)
		}
	}
}

// The command line is checked before anything is served; --auth
// kubernetes outside a pod says what to do instead.
func TestMainRefuses(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"--auth", "basic"}, 2, `--auth "basic"`},
		{[]string{"--cache-max-age", "-1s"}, 2, "negative"},
		{[]string{"--tls-cert-file", "/x.crt"}, 2, "go together"},
		{[]string{"--state-dir", "rel"}, 2, "absolute"},
		{[]string{"--dra-dir", "rel"}, 2, `--dra-dir "rel" must be an absolute path`},
		{[]string{"--listen", "127.0.0.1:0"}, 1, "--auth=none"},
		{[]string{"--listen", "127.0.0.1:0", "--auth", "none", "--tls-cert-file", "/nonexistent.crt", "--tls-private-key-file", "/nonexistent.key"}, 1, "/nonexistent.crt"},
	} {
		var stderr bytes.Buffer
		if code := Main(tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.inStderr) {
			t.Errorf("Main(%q) = %d, %q; want %d, with %q", tc.args, code, stderr.String(), tc.code, tc.inStderr)
		}
	}
}

// A certificate renewed in its files (a Secret cert-manager renews) is
// served from the next handshake on, without a restart.
func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(mtime time.Time) []byte {
		conf, err := selfSignedTLS()
		if err != nil {
			t.Fatal(err)
		}
		pair := conf.Certificates[0]
		key, err := x509.MarshalECPrivateKey(pair.PrivateKey.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: key}), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pair.Certificate[0]}), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(certFile, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return pair.Certificate[0]
	}
	served := func(addr string) []byte {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	first := write(time.Unix(1e9, 0))
	conf, err := reloadingTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, Handler(NewCollector(nodeWith(nil), &fakeReader{}), nil), conf)
	if !bytes.Equal(served(addr), first) {
		t.Fatal("the exporter does not serve the certificate of --tls-cert-file")
	}
	second := write(time.Unix(2e9, 0))
	if !bytes.Equal(served(addr), second) {
		t.Error("the renewed certificate is not served")
	}
	// A broken renewal keeps the last good pair served.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(certFile, time.Unix(3e9, 0), time.Unix(3e9, 0))
	if !bytes.Equal(served(addr), second) {
		t.Error("a broken key file replaced the served certificate")
	}
}
