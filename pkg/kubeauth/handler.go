package kubeauth

import (
	"context"
	"crypto/sha256"
	"log"
	"net/http"
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

// maxCached bounds the verdicts kept: tokens come from the network, and a
// flood of made-up ones must not grow the cache without end.
const maxCached = 4096

// maxReviews bounds the reviews in flight at once, so a flood of made-up
// tokens on one node costs the API server a few requests at a time.
const maxReviews = 4

// Guard admits a request to its handler when the bearer token it carries
// may get Path (verb get), as the API server's RBAC says: no token or one
// the API server does not accept is 401, a user without the right 403,
// and an API server that cannot answer 503 (fail closed: nothing is
// served that no review allowed).
type Guard struct {
	Reviewer Reviewer
	// Path is the non-resource URL checked (kube-rbac-proxy's default is
	// the request's path; the exporter serves one, /metrics).
	Path string
	TTL  time.Duration
	now  func() time.Time

	mu      sync.Mutex
	cache   map[[sha256.Size]byte]verdict
	reviews chan struct{}
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
		reviews:  make(chan struct{}, maxReviews),
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
		v, err := g.verdict(r.Context(), token)
		switch {
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

// bearer is the request's bearer token.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// verdict is the cached verdict on token, or a new review's. Failed
// reviews are not kept: the next request asks again.
func (g *Guard) verdict(ctx context.Context, token string) (Verdict, error) {
	key := sha256.Sum256([]byte(token)) // the cache holds no token
	if v, ok := g.cached(key); ok {
		return v, nil
	}
	select {
	case g.reviews <- struct{}{}:
		defer func() { <-g.reviews }()
	case <-ctx.Done():
		return Unauthenticated, ctx.Err()
	}
	v, u, err := g.Reviewer.Review(ctx, token, g.Path, "get")
	if err != nil {
		log.Printf("rdma-netns-exporter: refusing a scrape of %s, the token could not be reviewed: %v (the exporter's ServiceAccount needs to reach the API server and create tokenreviews and subjectaccessreviews)", g.Path, err)
		return Unauthenticated, err
	}
	if v == Forbidden {
		log.Printf("rdma-netns-exporter: refusing %s a scrape of %s: RBAC does not let it get the non-resource URL (bind it to the chart's metrics-reader ClusterRole)", u.Username, g.Path)
	}
	g.keep(key, verdict{v: v, expires: g.now().Add(g.TTL)})
	return v, nil
}

func (g *Guard) cached(key [sha256.Size]byte) (Verdict, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.cache[key]
	if !ok || !g.now().Before(c.expires) {
		return Unauthenticated, false
	}
	return c.v, true
}

// keep caches v; when the cache is full it drops what expired, and keeps
// nothing new if that freed no room.
func (g *Guard) keep(key [sha256.Size]byte, v verdict) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
