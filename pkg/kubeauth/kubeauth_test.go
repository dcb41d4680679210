package kubeauth

import (
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/clocktest"
)

// fakeAPIServer answers TokenReviews from tokens and SubjectAccessReviews
// from allowed, as the API server would with RBAC granting allowed users
// get on the non-resource URL /metrics.
type fakeAPIServer struct {
	mu      sync.Mutex
	tokens  map[string]User // token -> its user
	allowed map[string]bool // user -> may get /metrics
	// status, when set, answers every review with it (the API server
	// refusing the exporter's own ServiceAccount, or failing).
	status int
	// selfToken is the exporter's own token, which every review must carry.
	selfToken string
	reviews   int
	lastSAR   subjectAccessReview
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reviews++
	if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer "+f.selfToken {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if f.status != 0 {
		http.Error(w, http.StatusText(f.status), f.status)
		return
	}
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		var tr tokenReview
		if json.Unmarshal(body, &tr) != nil || tr.Kind != "TokenReview" || tr.APIVersion != "authentication.k8s.io/v1" {
			http.Error(w, "bad TokenReview", http.StatusBadRequest)
			return
		}
		u, ok := f.tokens[tr.Spec.Token]
		tr.Status.Authenticated, tr.Status.User = ok, u
		answer(w, tr)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		var sar subjectAccessReview
		if json.Unmarshal(body, &sar) != nil || sar.Kind != "SubjectAccessReview" || sar.APIVersion != "authorization.k8s.io/v1" {
			http.Error(w, "bad SubjectAccessReview", http.StatusBadRequest)
			return
		}
		f.lastSAR = sar
		a := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = f.allowed[sar.Spec.User] && a != nil && a.Path == "/metrics" && a.Verb == "get"
		answer(w, sar)
	default:
		http.NotFound(w, r)
	}
}

func answer(w http.ResponseWriter, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(obj)
}

func (f *fakeAPIServer) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeAPIServer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reviews
}

// rig is an exporter's /metrics behind a Guard talking to a fake API
// server over TLS, as the exporter's ServiceAccount.
type rig struct {
	api    *fakeAPIServer
	apiSrv *httptest.Server
	guard  *Guard
	clock  *clocktest.Clock
	srv    *httptest.Server
}

const prometheusUser = "system:serviceaccount:monitoring:prometheus"

func newRig(t *testing.T) *rig {
	t.Helper()
	api := &fakeAPIServer{
		tokens: map[string]User{
			"prom-token":   {Username: prometheusUser, UID: "1", Groups: []string{"system:serviceaccounts", "system:authenticated"}},
			"tenant-token": {Username: "system:serviceaccount:team-a:default", UID: "2"},
		},
		allowed:   map[string]bool{prometheusUser: true},
		selfToken: "exporter-token",
	}
	apiSrv := httptest.NewTLSServer(api)
	t.Cleanup(apiSrv.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(api.selfToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := &Client{URL: apiSrv.URL, TokenFile: tokenFile, HTTP: apiSrv.Client()}
	g := NewGuard(client, "/metrics")
	clock := clocktest.New()
	g.now = clock.Now
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "rdma_exporter_devices 1\n") })
	srv := httptest.NewServer(g.Wrap(metrics))
	t.Cleanup(srv.Close)
	return &rig{api: api, apiSrv: apiSrv, guard: g, clock: clock, srv: srv}
}

// get scrapes /metrics with token ("" for none) and returns the status.
func (r *rig) get(t *testing.T, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.srv.URL+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && string(body) != "rdma_exporter_devices 1\n" {
		t.Errorf("200 with %q, not the exporter's metrics", body)
	}
	if resp.StatusCode != http.StatusOK && string(body) == "rdma_exporter_devices 1\n" {
		t.Errorf("%s with the exporter's metrics", resp.Status)
	}
	return resp.StatusCode
}

func TestGuardVerdicts(t *testing.T) {
	r := newRig(t)
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token the API server does not know", "forged", http.StatusUnauthorized},
		{"a tenant's ServiceAccount", "tenant-token", http.StatusForbidden},
		{"Prometheus's ServiceAccount, bound to the metrics reader", "prom-token", http.StatusOK},
	} {
		if got := r.get(t, tc.token); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The review asked what kube-rbac-proxy asks, for the token's user.
	sar := r.api.lastSAR.Spec
	if sar.User != prometheusUser || !slices.Equal(sar.Groups, []string{"system:serviceaccounts", "system:authenticated"}) ||
		sar.NonResourceAttributes == nil || *sar.NonResourceAttributes != (nonResourceAttributes{Path: "/metrics", Verb: "get"}) {
		t.Errorf("SubjectAccessReview spec %+v, want Prometheus's user and groups, get /metrics", sar)
	}
}

// Other schemes than Bearer are no token at all.
func TestGuardNeedsBearer(t *testing.T) {
	r := newRig(t)
	req, _ := http.NewRequest(http.MethodGet, r.srv.URL+"/metrics", nil)
	req.SetBasicAuth("admin", "prom-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("basic auth: %s (WWW-Authenticate %q), want 401 asking for a bearer token", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	if n := r.api.count(); n != 0 {
		t.Errorf("%d reviews for a request without a bearer token, want none", n)
	}
}

// An API server that cannot answer, or refuses the exporter's own
// requests, lets nobody in, not even a token allowed before once its
// verdict expired; verdicts are not cached from failures.
func TestGuardFailsClosed(t *testing.T) {
	r := newRig(t)
	for _, status := range []int{http.StatusInternalServerError, http.StatusForbidden, http.StatusUnauthorized} {
		r.api.set(func() { r.api.status = status })
		if got := r.get(t, "prom-token"); got != http.StatusServiceUnavailable {
			t.Errorf("API server answering %d: scrape %d, want 503", status, got)
		}
	}
	r.api.set(func() { r.api.status = 0 })
	if got := r.get(t, "prom-token"); got != http.StatusOK {
		t.Errorf("API server back: scrape %d, want 200 (a failure must not be cached)", got)
	}
	r.clock.Advance(r.guard.TTL)
	r.apiSrv.Close() // unreachable: connection refused
	if got := r.get(t, "prom-token"); got != http.StatusServiceUnavailable {
		t.Errorf("API server unreachable: scrape %d, want 503", got)
	}
	if got := r.get(t, "tenant-token"); got != http.StatusServiceUnavailable {
		t.Errorf("API server unreachable, a tenant's token: %d, want 503", got)
	}
}

// Verdicts are kept for TTL: a burst of scrapes costs one review, and a
// token revoked (or a binding removed) stops working once TTL passed.
func TestGuardCacheIsBounded(t *testing.T) {
	r := newRig(t)
	for range 10 {
		if got := r.get(t, "prom-token"); got != http.StatusOK {
			t.Fatalf("scrape %d, want 200", got)
		}
	}
	if n := r.api.count(); n != 2 {
		t.Errorf("10 scrapes with one token: %d requests to the API server, want 2 (one TokenReview, one SubjectAccessReview)", n)
	}
	// The binding is removed and the token revoked.
	r.api.set(func() { delete(r.api.allowed, prometheusUser) })
	r.clock.Advance(r.guard.TTL - time.Second)
	if got := r.get(t, "prom-token"); got != http.StatusOK {
		t.Errorf("within TTL of the review: %d, want the cached 200", got)
	}
	r.clock.Advance(time.Second)
	if got := r.get(t, "prom-token"); got != http.StatusForbidden {
		t.Errorf("TTL after the binding went: %d, want 403", got)
	}
	r.api.set(func() { delete(r.api.tokens, "prom-token") })
	r.clock.Advance(r.guard.TTL)
	if got := r.get(t, "prom-token"); got != http.StatusUnauthorized {
		t.Errorf("TTL after the token was revoked: %d, want 401", got)
	}
}

// Made-up tokens fill the cache up to its bound, not beyond; once they
// expired, a new verdict finds room.
func TestGuardCacheSize(t *testing.T) {
	g := NewGuard(nil, "/metrics")
	clock := clocktest.New()
	g.now = clock.Now
	for i := range maxCached + 10 {
		g.keep([32]byte{byte(i), byte(i >> 8), byte(i >> 16)}, verdict{v: Unauthenticated, expires: clock.Now().Add(g.TTL)})
	}
	if n := len(g.cache); n != maxCached {
		t.Errorf("cache of %d verdicts, want at most %d", n, maxCached)
	}
	clock.Advance(g.TTL)
	g.keep([32]byte{0xff}, verdict{v: Forbidden, expires: clock.Now().Add(g.TTL)})
	if n := len(g.cache); n != 1 {
		t.Errorf("cache of %d verdicts after the others expired, want the new one only", n)
	}
}

// Allowed tokens are remembered up to their own bound, past it the one
// whose verdict expired first forgotten; a review that does not allow a
// token any more takes it out (no re-review slot for it).
func TestGuardAllowedSize(t *testing.T) {
	g := NewGuard(nil, "/metrics")
	clock := clocktest.New()
	g.now = clock.Now
	key := func(i int) [32]byte { return sha256.Sum256(fmt.Appendf(nil, "token-%d", i)) }
	for i := range maxAllowed + 10 {
		g.keep(key(i), verdict{v: Allowed, expires: clock.Now().Add(g.TTL)})
		clock.Advance(time.Millisecond)
	}
	if n := len(g.allowed); n != maxAllowed {
		t.Errorf("%d tokens remembered as allowed, want at most %d", n, maxAllowed)
	}
	for i, want := range map[int]bool{0: false, 9: false, 10: true, maxAllowed + 9: true} {
		if _, _, was := g.cached(key(i)); was != want {
			t.Errorf("allowed token %d of %d remembered: %v, want %v (the earliest-expiring go)", i, maxAllowed+10, was, want)
		}
	}
	clock.Advance(g.TTL)
	g.keep(key(10), verdict{v: Forbidden, expires: clock.Now().Add(g.TTL)})
	if v, ok, was := g.cached(key(10)); v != Forbidden || !ok || was {
		t.Errorf("a token allowed, then forbidden: kept %v (fresh %v), remembered as allowed %v; want forbidden, fresh, not allowed", v, ok, was)
	}
}

// In a pod the client is the kubernetes Service's, with the pod's CA and
// token; outside one it says how to run instead.
func TestInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := InCluster(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--auth=none") {
		t.Errorf("outside a pod: %v, want an error naming --auth=none", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	dir := t.TempDir()
	if _, err := InCluster(dir); err == nil || !strings.Contains(err.Error(), "ca.crt") {
		t.Errorf("without the ServiceAccount mount: %v, want an error naming ca.crt", err)
	}
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644)
	os.WriteFile(filepath.Join(dir, "token"), []byte("t"), 0o600)
	c, err := InCluster(dir)
	if err != nil || c.URL != "https://10.96.0.1:443" || c.TokenFile != filepath.Join(dir, "token") {
		t.Errorf("InCluster = %+v, %v", c, err)
	}
}
