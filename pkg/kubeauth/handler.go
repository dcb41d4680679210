package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Reviewer is what the Guard asks (Client.Review; tests fake it).
type Reviewer interface {
	Review(ctx context.Context, token, path, verb string) (Verdict, User, error)
}

// DefaultCacheTTL is how long a verdict on a token is kept. It bounds how
// long a revoked token, or a user whose binding was removed, still gets
// in. A minute costs the API server at most one TokenReview and one
// SubjectAccessReview per scraper, node and minute (Prometheus scrapes
// every 30 s by default), and lets an operator's revocation take effect
// within a minute.
const DefaultCacheTTL = time.Minute

// maxCached bounds the verdicts kept on tokens not allowed: tokens come
// from the network, and a flood of made-up ones must not grow the cache
// without end.
const maxCached = 4096

// maxAllowed bounds the tokens remembered as allowed, kept apart from the
// others so that a flood of made-up tokens filling the cache cannot make
// a scraper's token new again. Only a token RBAC lets get the path gets
// in, and a scraper brings a new one when the kubelet renews its projected
// token (within the hour by default), so the bound is far; when it is
// reached, the token whose verdict expired first goes.
const maxAllowed = 1024

// maxReviews bounds the reviews in flight at once, so a flood of made-up
// tokens on one node costs the API server a few requests at a time.
// Reviews past it are refused at once (503) rather than queued: a queue
// would hold a real scrape behind the flood until its client gave up.
const maxReviews = 4

// maxReviewsPerSource bounds the reviews in flight for one client address,
// so that one caller making up tokens holds at most half of maxReviews and
// the other half stays free for everyone else. A scraper needs one review
// per token and TTL (Prometheus sends one token, one scrape per target at
// a time); 2 leaves room for a second client on the same address (an
// operator's curl on Prometheus's node, a second scrape job's first
// scrape). Reviews past it are refused at once (429).
const maxReviewsPerSource = 2

// maxReReviews bounds the re-reviews in flight: reviews of a token whose
// last review allowed it, once that verdict expired. New tokens cannot
// take these slots, so however many addresses flood the exporter with
// made-up tokens, a scraper let in before is reviewed again and answered
// (a flood that holds maxReviews would otherwise refuse it from its
// verdict's expiry on). A scraper needs one per token and TTL, for a
// review's 0.1 s; 2 leaves room for a second one expiring at the same
// moment (Prometheus's HA pair). A re-review finding both busy takes a
// slot as a new token would.
const maxReReviews = 2

// retryAfter is the Retry-After, in seconds, of a refusal for want of a
// review slot: a review takes about 0.1 s (docs/benchmarks.md), so slots
// free up within a second unless a flood keeps them busy.
const retryAfter = "1"

// Guard admits a request to its handler when the bearer token it carries
// may get Path (verb get), as the API server's RBAC says: no token or one
// the API server does not accept is 401, a user without the right 403,
// and an API server that cannot answer 503 (fail closed: nothing is
// served that no review allowed). A token without a cached verdict that
// finds no review slot is refused at once, with Retry-After: 429 when
// its address has maxReviewsPerSource reviews in flight, 503 when all
// maxReviews are. A token allowed at its last review is re-reviewed, once
// its verdict expired, in maxReReviews slots of its own first.
type Guard struct {
	Reviewer Reviewer
	// Path is the non-resource URL checked (kube-rbac-proxy's default is
	// the request's path; the exporter serves one, /metrics).
	Path string
	TTL  time.Duration
	now  func() time.Time

	mu sync.Mutex // guards cache, allowed and logged
	// cache holds the verdicts on tokens not allowed.
	cache map[[sha256.Size]byte]verdict
	// allowed holds the expiry of the verdict on each token whose last
	// review allowed it, past that expiry too: then the token may take a
	// re-review slot. A review that does not allow it takes it out.
	allowed map[[sha256.Size]byte]time.Time
	logged  [refusalKinds]logLimit
	slots   reviewSlots
}

type verdict struct {
	v       Verdict
	expires time.Time
}

// NewGuard guards the non-resource URL path with reviews by r.
func NewGuard(r Reviewer, path string) *Guard {
	return &Guard{
		Reviewer: r,
		Path:     path,
		TTL:      DefaultCacheTTL,
		now:      time.Now,
		cache:    map[[sha256.Size]byte]verdict{},
		allowed:  map[[sha256.Size]byte]time.Time{},
		slots:    reviewSlots{bySource: map[netip.Addr]int{}},
	}
}

// Wrap serves next the requests the Guard admits.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rdma-netns-exporter"`)
			http.Error(w, "Unauthorized: send a ServiceAccount token (Authorization: Bearer)", http.StatusUnauthorized)
			return
		}
		v, err := g.verdict(r.Context(), token, source(r))
		switch {
		case errors.Is(err, errSourceBusy):
			w.Header().Set("Retry-After", retryAfter)
			http.Error(w, fmt.Sprintf("Too Many Requests: %d token reviews from this address are in flight already; retry after %s s (a token reviewed once is not reviewed again for a while)", maxReviewsPerSource, retryAfter), http.StatusTooManyRequests)
		case errors.Is(err, errAllBusy):
			w.Header().Set("Retry-After", retryAfter)
			http.Error(w, fmt.Sprintf("Service Unavailable: %d token reviews are in flight already, the exporter's bound; retry after %s s", maxReviews, retryAfter), http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, "Service Unavailable: the API server could not review the token", http.StatusServiceUnavailable)
		case v == Unauthenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="rdma-netns-exporter", error="invalid_token"`)
			http.Error(w, "Unauthorized: the API server does not accept this token", http.StatusUnauthorized)
		case v == Forbidden:
			http.Error(w, "Forbidden: this user may not get "+g.Path, http.StatusForbidden)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// source is the address a request came from, the unit the review slots
// are shared by. It is the connection's peer, never a header: headers are
// the client's to make up. A RemoteAddr that is no IP:port (not served
// over TCP) is the zero Addr, one source for all such requests.
func source(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// bearer is the request's bearer token.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// verdict is the cached verdict on token, or a new review's if src may
// have a review slot (errSourceBusy or errAllBusy if not). Failed reviews
// are not kept: the next request asks again.
func (g *Guard) verdict(ctx context.Context, token string, src netip.Addr) (Verdict, error) {
	key := sha256.Sum256([]byte(token)) // the cache holds no token
	// Before taking a slot: a token reviewed once costs nothing while its
	// verdict lasts, however busy the slots are.
	v, ok, wasAllowed := g.cached(key)
	if ok {
		return v, nil
	}
	release, err := g.slots.take(src, wasAllowed)
	if err != nil {
		g.logBusy(err, src)
		return Unauthenticated, err
	}
	defer release()
	v, u, err := g.Reviewer.Review(ctx, token, g.Path, "get")
	if err != nil {
		g.logRefusal(reviewFailed, "rdma-netns-exporter: refusing a scrape of %s, the token could not be reviewed: %v (the exporter's ServiceAccount needs to reach the API server and create tokenreviews and subjectaccessreviews)", g.Path, err)
		return Unauthenticated, err
	}
	if v == Forbidden {
		g.logRefusal(forbidden, "rdma-netns-exporter: refusing %.100q a scrape of %s: RBAC does not let it get the non-resource URL (bind it to the chart's metrics-reader ClusterRole)", u.Username, g.Path)
	}
	g.keep(key, verdict{v: v, expires: g.now().Add(g.TTL)})
	return v, nil
}

func (g *Guard) logBusy(err error, src netip.Addr) {
	if errors.Is(err, errSourceBusy) {
		g.logRefusal(sourceBusy, "rdma-netns-exporter: refused a scrape of %s from %s with 429: %d reviews of new tokens from that address are in flight already (a client making up tokens?)", g.Path, src, maxReviewsPerSource)
		return
	}
	g.logRefusal(allBusy, "rdma-netns-exporter: refused a scrape of %s from %s with 503: all %d reviews of new tokens are in flight already (new tokens from several addresses at once; a scraper whose token was allowed is reviewed again in %d slots new tokens cannot take)", g.Path, src, maxReviews, maxReReviews)
}

// cached is the verdict kept on key, if it has not expired (ok), and
// whether the token's last review allowed it.
func (g *Guard) cached(key [sha256.Size]byte) (v Verdict, ok, wasAllowed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if expires, was := g.allowed[key]; was {
		return Allowed, now.Before(expires), true
	}
	c, ok := g.cache[key]
	if !ok || !now.Before(c.expires) {
		return Unauthenticated, false, false
	}
	return c.v, true, false
}

// keep keeps v, an allowed verdict among the allowed, any other in the
// cache (and the token no longer among the allowed).
func (g *Guard) keep(key [sha256.Size]byte, v verdict) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v.v == Allowed {
		delete(g.cache, key)
		g.keepAllowed(key, v.expires)
		return
	}
	delete(g.allowed, key)
	g.keepCached(key, v)
}

// keepAllowed remembers key as allowed until expires; when full, it
// forgets the token whose verdict expired first.
func (g *Guard) keepAllowed(key [sha256.Size]byte, expires time.Time) {
	if _, ok := g.allowed[key]; !ok && len(g.allowed) >= maxAllowed {
		var first [sha256.Size]byte
		var firstExpires time.Time
		for k, e := range g.allowed {
			if firstExpires.IsZero() || e.Before(firstExpires) {
				first, firstExpires = k, e
			}
		}
		delete(g.allowed, first)
	}
	g.allowed[key] = expires
}

// keepCached caches v; when the cache is full it drops what expired, and
// keeps nothing new if that freed no room.
func (g *Guard) keepCached(key [sha256.Size]byte, v verdict) {
	if len(g.cache) >= maxCached {
		now := g.now()
		for k, c := range g.cache {
			if !now.Before(c.expires) {
				delete(g.cache, k)
			}
		}
	}
	if len(g.cache) < maxCached {
		g.cache[key] = v
	}
}
