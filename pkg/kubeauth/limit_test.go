package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/clocktest"
	"github.com/rdma-netns/rdma-netns/pkg/logtest"
)

// floodReviewer answers the tokens it knows at once and holds the review
// of any other (a made-up token) until release, telling held of each: an
// API server slow to answer a flood, so that the flood keeps its slots.
type floodReviewer struct {
	held    chan string
	release chan struct{}
	mu      sync.Mutex // guards known, reviews and byToken
	known   map[string]Verdict
	reviews int
	byToken map[string]int // reviews of the known tokens
}

func (f *floodReviewer) Review(ctx context.Context, token, _, _ string) (Verdict, User, error) {
	f.mu.Lock()
	f.reviews++
	v, ok := f.known[token]
	if ok {
		f.byToken[token]++
	}
	f.mu.Unlock()
	if ok {
		return v, User{Username: prometheusUser}, nil
	}
	f.held <- token
	select {
	case <-f.release:
		return Unauthenticated, User{}, nil
	case <-ctx.Done():
		return Unauthenticated, User{}, ctx.Err()
	}
}

func (f *floodReviewer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reviews
}

func (f *floodReviewer) countOf(token string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byToken[token]
}

// set makes the API server answer v for token from now on.
func (f *floodReviewer) set(token string, v Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.known[token] = v
}

// clientPatience is how long a request that must not wait is given before
// the test calls it queued (Prometheus's default scrape timeout). It is
// no speed bound: the Guard answers these requests without waiting on
// anything, and a queued request would otherwise hang the test.
const clientPatience = 10 * time.Second

// floodRig is a Guard over floodReviewer, served in-process so that each
// request can come from the address the test names.
type floodRig struct {
	t       *testing.T
	rev     *floodReviewer
	guard   *Guard
	clock   *clocktest.Clock
	h       http.Handler
	wg      sync.WaitGroup
	release sync.Once
	log     *logtest.Buffer
}

func newFloodRig(t *testing.T) *floodRig {
	rev := &floodReviewer{
		known: map[string]Verdict{
			"prom-token": Allowed, "prom-token-2": Allowed,
			"tenant-token": Forbidden, "expired-token": Unauthenticated,
		},
		byToken: map[string]int{},
		held:    make(chan string, 1000),
		release: make(chan struct{}),
	}
	g := NewGuard(rev, "/metrics")
	clock := clocktest.New()
	g.now = clock.Now
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("rdma_exporter_devices 1\n")) })
	r := &floodRig{t: t, rev: rev, guard: g, clock: clock, h: g.Wrap(metrics), log: captureLog(t)}
	t.Cleanup(func() {
		r.releaseAll()
		r.wg.Wait()
	})
	return r
}

// releaseAll lets the held reviews answer (401: the tokens are made up).
func (r *floodRig) releaseAll() {
	r.release.Do(func() { close(r.rev.release) })
}

// send GETs /metrics from addr with token in the background; the answer
// comes on the channel.
func (r *floodRig) send(ctx context.Context, addr, token string) <-chan *http.Response {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/metrics", nil)
	req.RemoteAddr = net.JoinHostPort(addr, "40000")
	req.Header.Set("Authorization", "Bearer "+token)
	answer := make(chan *http.Response, 1)
	r.wg.Go(func() {
		rec := httptest.NewRecorder()
		r.h.ServeHTTP(rec, req)
		answer <- rec.Result()
	})
	return answer
}

// hold sends a made-up token from addr and returns once its review is
// held, the answer to come when the reviews are released.
func (r *floodRig) hold(addr, token string) <-chan *http.Response {
	r.t.Helper()
	answer := r.send(context.Background(), addr, token)
	select {
	case <-r.rev.held:
	case resp := <-answer:
		r.t.Fatalf("a made-up token from %s: %s without its review held, want its review held", addr, resp.Status)
	}
	return answer
}

// holdAll sends made-up tokens from addr until it holds every review slot
// one source may.
func (r *floodRig) holdAll(addr string) {
	r.t.Helper()
	for i := range maxReviewsPerSource {
		r.hold(addr, madeUp(i))
	}
}

// answer is the answer to a request from addr that must not wait for the
// held reviews: the test fails if the request's review is held instead
// (it got a slot it should not have) or if it answered only once its
// client gave up (it queued behind the held ones).
func (r *floodRig) answer(addr, token string) *http.Response {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientPatience)
	defer cancel()
	answer := r.send(ctx, addr, token)
	select {
	case <-r.rev.held:
		r.t.Fatalf("a request from %s got a review slot and waits with the flood, want an answer without a review", addr)
	case resp := <-answer:
		if ctx.Err() != nil {
			r.t.Fatalf("a request from %s answered %s only when its client gave up: it queued behind the held reviews", addr, resp.Status)
		}
		return resp
	}
	return nil
}

func madeUp(i int) string { return fmt.Sprintf("forged-%d-%s", i, strings.Repeat("x", 4000)) }

// wantRefused checks resp is code with a Retry-After, and not the metrics.
func wantRefused(t *testing.T, what string, resp *http.Response, code int) {
	t.Helper()
	if resp.StatusCode != code || resp.Header.Get("Retry-After") == "" {
		t.Errorf("%s: %s (Retry-After %q), want %d with a Retry-After", what, resp.Status, resp.Header.Get("Retry-After"), code)
	}
}

// One address flooding made-up tokens holds its own few review slots;
// its further requests are refused at once with 429, cost the API server
// nothing, and leave the others' slots free: a new scraper token from
// elsewhere is reviewed and served.
func TestGuardFloodFromOneSource(t *testing.T) {
	r := newFloodRig(t)
	const flooder = "10.0.0.66"
	r.holdAll(flooder)
	for i := range 20 {
		wantRefused(t, "a flooding address past its bound", r.answer(flooder, madeUp(100+i)), http.StatusTooManyRequests)
	}
	if n := r.rev.count(); n != maxReviewsPerSource {
		t.Errorf("%d reviews for the flood, want %d (those it held)", n, maxReviewsPerSource)
	}
	if resp := r.answer("10.0.0.9", "prom-token"); resp.StatusCode != http.StatusOK {
		t.Errorf("Prometheus's new token from another address, during the flood: %s, want 200", resp.Status)
	}
}

// With every review slot held, a new token is refused at once with 503
// rather than queued; a token whose verdict is cached needs no slot and is
// still served. Once the held reviews end, their slots serve again.
func TestGuardBusyFailsFast(t *testing.T) {
	r := newFloodRig(t)
	if resp := r.answer("10.0.0.9", "prom-token"); resp.StatusCode != http.StatusOK {
		t.Fatalf("Prometheus's token before the flood: %s, want 200", resp.Status)
	}
	var held []<-chan *http.Response
	for i := range maxReviews {
		addr := fmt.Sprintf("10.0.1.%d", i/maxReviewsPerSource)
		held = append(held, r.hold(addr, madeUp(i)))
	}
	reviews := r.rev.count()
	wantRefused(t, "a made-up token from a new address, all slots held", r.answer("10.0.2.1", madeUp(100)), http.StatusServiceUnavailable)
	wantRefused(t, "an unreviewed valid token, all slots held", r.answer("10.0.0.9", "prom-token-2"), http.StatusServiceUnavailable)
	if resp := r.answer("10.0.0.9", "prom-token"); resp.StatusCode != http.StatusOK {
		t.Errorf("Prometheus's cached token, all slots held: %s, want 200", resp.Status)
	}
	if n := r.rev.count(); n != reviews {
		t.Errorf("%d reviews while all slots were held, want none", n-reviews)
	}
	r.releaseAll()
	for _, answer := range held {
		if resp := <-answer; resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a held made-up token once reviewed: %s, want 401", resp.Status)
		}
	}
	if resp := <-r.send(context.Background(), "10.0.2.1", "prom-token-2"); resp.StatusCode != http.StatusOK {
		t.Errorf("a valid token once the slots are free: %s, want 200", resp.Status)
	}
}

// wantNoSlot checks resp is a refusal for want of a review slot: 429 or
// 503, with a Retry-After.
func wantNoSlot(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	if (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) || resp.Header.Get("Retry-After") == "" {
		t.Errorf("%s: %s (Retry-After %q), want 429 or 503 with a Retry-After", what, resp.Status, resp.Header.Get("Retry-After"))
	}
}

// floodAddrs make up tokens: four pods, and four addresses of one IPv6
// host.
var floodAddrs = []string{"10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.2", "2001:db8::1", "2001:db8::2", "2001:db8::3", "2001:db8::4"}

// A flood of made-up tokens from 8 addresses keeps every slot for the
// reviews of new tokens busy for three verdict lifetimes. Prometheus,
// whose token was allowed before the flood, scrapes every 30 s and is
// answered 200 every time: once its verdict expired, its re-review takes a
// slot that new tokens cannot. It is re-reviewed once a lifetime all the
// same (no verdict outlives its TTL: a binding removed mid-flood is 403
// within one), and tokens that were denied get no such slot: re-presented
// once their verdicts expired, they are refused as new tokens are.
func TestGuardFloodKeepsAllowedScraper(t *testing.T) {
	r := newFloodRig(t)
	const prom = "10.0.0.9"
	for token, want := range map[string]int{"prom-token": http.StatusOK, "tenant-token": http.StatusForbidden, "expired-token": http.StatusUnauthorized} {
		if resp := r.answer(prom, token); resp.StatusCode != want {
			t.Fatalf("%s before the flood: %s, want %d", token, resp.Status, want)
		}
	}
	for i, addr := range floodAddrs {
		if i < maxReviews {
			r.hold(addr, madeUp(i))
			continue
		}
		wantNoSlot(t, "a made-up token from "+addr+", the flood holding every slot", r.answer(addr, madeUp(i)))
	}
	const scrapeInterval = 30 * time.Second
	lifetime := r.guard.TTL
	for elapsed := scrapeInterval; elapsed <= 3*lifetime; elapsed += scrapeInterval {
		r.clock.Advance(scrapeInterval)
		for i, addr := range floodAddrs {
			wantNoSlot(t, fmt.Sprintf("%v into the flood, a made-up token from %s", elapsed, addr), r.answer(addr, madeUp(int(elapsed/time.Second)*100+i)))
		}
		if elapsed >= lifetime {
			for i, token := range []string{"tenant-token", "expired-token"} {
				wantNoSlot(t, fmt.Sprintf("%v into the flood, %s re-presented", elapsed, token), r.answer(floodAddrs[i], token))
			}
		}
		if resp := r.answer(prom, "prom-token"); resp.StatusCode != http.StatusOK {
			t.Errorf("%v into the flood (verdicts last %v), Prometheus's scrape: %s, want 200", elapsed, lifetime, resp.Status)
		}
	}
	if n := r.rev.countOf("prom-token"); n != 4 {
		t.Errorf("Prometheus's token reviewed %d times over three lifetimes of flood, want 4 (before it, then once a lifetime)", n)
	}
	wantRefused(t, "a new valid token during the flood", r.answer(prom, "prom-token-2"), http.StatusServiceUnavailable)
	r.rev.set("prom-token", Forbidden)
	r.clock.Advance(lifetime)
	if resp := r.answer(prom, "prom-token"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("Prometheus's binding removed, a lifetime later during the flood: %s, want 403", resp.Status)
	}
	r.clock.Advance(lifetime)
	wantRefused(t, "Prometheus's token, denied at its last review, a lifetime later", r.answer(prom, "prom-token"), http.StatusServiceUnavailable)
}

// A flood fast enough to fill the verdict cache with its made-up tokens
// does not make Prometheus's token new again: once its verdict expired,
// with every slot for new tokens held, it is re-reviewed and served.
func TestGuardFullCacheKeepsAllowedScraper(t *testing.T) {
	r := newFloodRig(t)
	if resp := r.answer("10.0.0.9", "prom-token"); resp.StatusCode != http.StatusOK {
		t.Fatalf("Prometheus's token before the flood: %s, want 200", resp.Status)
	}
	r.clock.Advance(r.guard.TTL - time.Second)
	for i := range maxCached + 10 { // the verdicts of made-up tokens the API server answered at once
		r.guard.keep(sha256.Sum256([]byte(madeUp(i))), verdict{v: Unauthenticated, expires: r.clock.Now().Add(r.guard.TTL)})
	}
	r.clock.Advance(time.Second)
	for i, addr := range floodAddrs[:maxReviews] {
		r.hold(addr, madeUp(maxCached+100+i))
	}
	if resp := r.answer("10.0.0.9", "prom-token"); resp.StatusCode != http.StatusOK {
		t.Errorf("Prometheus's token, its verdict expired, the cache full of made-up tokens' and every slot held: %s, want 200", resp.Status)
	}
}

// A flood of refusals logs one line per kind and logEvery, the next one
// counting those left out, and never the token.
func TestGuardRefusalLogsAreBounded(t *testing.T) {
	r := newFloodRig(t)
	const flooder = "10.0.0.66"
	r.holdAll(flooder)
	for i := range 50 {
		r.answer(flooder, madeUp(100+i))
	}
	if lines := r.log.Lines(); len(lines) != 1 || !strings.Contains(lines[0], "429") || !strings.Contains(lines[0], flooder) {
		t.Errorf("50 refusals of one address logged %d lines, want one naming 429 and the address:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	r.clock.Advance(logEvery)
	r.answer(flooder, madeUp(200))
	lines := r.log.Lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "49 more") {
		t.Errorf("a refusal logEvery later: %d lines, want a second counting the 49 left out:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if strings.Contains(l, "forged") || len(l) > 1000 {
			t.Errorf("a log line quotes a token or is %d bytes long: %.300s", len(l), l)
		}
	}
}

// Reviews that fail (the API server down) or forbid (a tenant minting
// tokens of its own ServiceAccount) log one line per logEvery, not one a
// request.
func TestGuardReviewLogsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func() (Verdict, User, error)
		code   int
	}{
		{"the API server down", func() (Verdict, User, error) {
			return Unauthenticated, User{}, errors.New("TokenReview: connection refused")
		}, http.StatusServiceUnavailable},
		{"a tenant's new tokens", func() (Verdict, User, error) {
			return Forbidden, User{Username: "system:serviceaccount:team-a:" + strings.Repeat("a", 4000)}, nil
		}, http.StatusForbidden},
	} {
		buf := captureLog(t)
		g := NewGuard(reviewFunc(tc.answer), "/metrics")
		h := g.Wrap(http.NotFoundHandler())
		for i := range 30 {
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+madeUp(i))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("%s: %d, want %d", tc.name, rec.Code, tc.code)
			}
		}
		if lines := buf.Lines(); len(lines) != 1 || len(lines[0]) > 1000 {
			t.Errorf("%s: 30 refusals logged %d lines, want one of at most 1000 bytes:\n%.2000s", tc.name, len(lines), strings.Join(lines, "\n"))
		}
	}
}

type reviewFunc func() (Verdict, User, error)

func (f reviewFunc) Review(context.Context, string, string, string) (Verdict, User, error) {
	return f()
}

func captureLog(t *testing.T) *logtest.Buffer {
	b := &logtest.Buffer{}
	out := log.Writer()
	log.SetOutput(b)
	t.Cleanup(func() { log.SetOutput(out) })
	return b
}
