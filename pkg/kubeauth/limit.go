package kubeauth

import (
	"errors"
	"fmt"
	"log"
	"net/netip"
	"sync"
	"time"
)

// Why a request got no review slot.
var (
	errSourceBusy = errors.New("the reviews of this address are at their bound")
	errAllBusy    = errors.New("the reviews of all addresses are at their bound")
)

// reviewSlots counts the reviews in flight: of new tokens, in all and per
// source, and re-reviews of tokens allowed before. A request that finds no
// slot is refused, never queued: a queue behind a flood is where a real
// scrape would wait until its client gave up.
type reviewSlots struct {
	mu       sync.Mutex
	inFlight int
	// bySource holds only the sources with a review in flight, so it is
	// no larger than maxReviews however many addresses call.
	bySource  map[netip.Addr]int
	reReviews int
}

// take gives src a slot, a re-review slot first if wasAllowed, or says
// why not; release gives the slot back. The source's own bound is checked
// first: a source over it is told so (429) even when all slots are busy
// too. A re-review slot ignores the source's bound: only a token allowed
// before takes one, whichever address sends it (Prometheus's may share
// its address with a flooding pod).
func (s *reviewSlots) take(src netip.Addr, wasAllowed bool) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wasAllowed && s.reReviews < maxReReviews {
		s.reReviews++
		return s.giveReReview, nil
	}
	switch {
	case s.bySource[src] >= maxReviewsPerSource:
		return nil, errSourceBusy
	case s.inFlight >= maxReviews:
		return nil, errAllBusy
	}
	s.inFlight++
	s.bySource[src]++
	return func() { s.give(src) }, nil
}

func (s *reviewSlots) giveReReview() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reReviews--
}

// give returns src's slot.
func (s *reviewSlots) give(src netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if s.bySource[src]--; s.bySource[src] <= 0 {
		delete(s.bySource, src)
	}
}

// The kinds of refusal logged, each at most once per logEvery.
type refusalKind int

const (
	sourceBusy refusalKind = iota
	allBusy
	reviewFailed
	forbidden
	refusalKinds
)

// logEvery bounds how often one kind of refusal is logged: a flood of
// requests (made-up tokens, tokens of a user without the right, scrapes
// while the API server is down) must not flood the log too. The first
// refusal is logged at once, for the operator to see what happens; the
// next line of its kind, a minute later at the earliest, counts those left
// out in between.
const logEvery = time.Minute

type logLimit struct {
	next    time.Time // no line of this kind before it
	skipped int       // refusals of this kind not logged since the last line
}

// logRefusal logs a refusal of kind k unless one was logged less than
// logEvery ago; then it only counts it.
func (g *Guard) logRefusal(k refusalKind, format string, args ...any) {
	g.mu.Lock()
	l, now := &g.logged[k], g.now()
	if now.Before(l.next) {
		l.skipped++
		g.mu.Unlock()
		return
	}
	skipped := l.skipped
	l.next, l.skipped = now.Add(logEvery), 0
	g.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if skipped > 0 {
		msg += fmt.Sprintf("; %d more like it since the last such line, not logged", skipped)
	}
	log.Printf("%s (logged at most once per %s)", msg, logEvery)
}
