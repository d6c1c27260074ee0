package casq

import (
	"math"
	"time"
)

// creditWindow is the credit window of one Work stream: how many jobs the
// stream may have held by the worker plus granted to the broker and not yet
// used, and how that number adapts. It behaves as the TypeScript SDK's
// (sdk/ts/src/worker/credit-window.ts).
//
// The broker claims at most the stream's credit per commit, so with a fixed
// window of the concurrency a worker whose handlers are fast waits a whole
// commit (100 ms and more on S3) for every concurrency jobs. A window that
// holds what the handlers drain in one round trip (rate × round trip, the
// bandwidth-delay product) keeps them busy. Nobody knows that product in
// advance, so the window measures it, in epochs of one window's worth of
// arrivals:
//
//   - grow (doubles, up to max) when, within the epoch, the handlers sat idle
//     with nothing buffered (starved) while the broker had used most of the
//     credit (the lowest outstanding credit seen at an arrival was at most
//     half the window): the credit, not the queue, was what they waited for.
//     Up to growFreelyTo that is all, and it quadruples when the broker used
//     every credit it had (an epoch takes a commit or two, 100 ms each on a
//     slow store); past it the window also must hold fewer jobs than arrive
//     in roundTripsHeld commit intervals at the epoch's rate. Jobs come in
//     one burst per commit, so the longest pause
//     between two arrivals in an epoch is about one commit interval (the
//     shortest of the last gapEpochs epochs' is taken, so one pause of the
//     worker's own does not count). A broker that is busy, not far away,
//     sends no more jobs for more credit, while every job it has claimed and
//     not seen settled is a lease its head carries in every write: on a
//     local disk 20 × the concurrency keeps the handlers busy, at 100 ms a
//     write it takes thousands;
//   - shrink by half the smallest buffer seen when the buffer never emptied
//     within the epoch (a standing queue: the extra jobs only wait, holding
//     leases other workers could use);
//   - decay a quarter of the way back to min when the handlers were starved
//     but the broker sat on more than three quarters of the credit all epoch
//     (nothing runnable).
//
// Grants are held back while they would be smaller than the credit the
// broker still has (it can send that many jobs meanwhile): credit given back
// one job at a time would split the window into small claims that take
// turns, one per commit (TCP's silly window syndrome). A grant at least as
// large as the broker's remaining credit merges them again.
//
// min == max is a fixed window (WithPrefetch). The broker never lets
// outstanding credit pass maxOutstanding (Opened.max_credits), so a window
// above that is granted as jobs arrive.
type creditWindow struct {
	size           int // jobs this stream may have held plus outstanding now
	held           int // held jobs whose credit goes back to this stream
	outstanding    int // credit granted (or about to be) and not yet used
	min, max       int
	maxOutstanding int
	growFreelyTo   int
	now            func() time.Time // nil: untimed, never grows past growFreelyTo
	// The current epoch.
	arrivals       int
	lowOutstanding int
	lowBuffered    int
	starved        bool
	epochStart     time.Time
	lastArrival    time.Time
	longestGap     time.Duration
	recentGaps     []time.Duration // the longest pause between arrivals of the last epochs
}

// roundTripsHeld: past growFreelyTo, the window grows only while it holds
// fewer jobs than arrive in this many commit intervals.
const roundTripsHeld = 4

// gapEpochs is how many epochs' longest pauses between arrivals are remembered.
const gapEpochs = 3

// windowBounds are the initial size and bounds of each stream's window;
// growFreelyTo 0 means max.
type windowBounds struct{ initial, min, max, growFreelyTo int }

// newCreditWindow opens a window within b; now times arrivals (nil: the
// window never grows past b.growFreelyTo).
func newCreditWindow(b windowBounds, maxOutstanding int, now func() time.Time) *creditWindow {
	w := &creditWindow{min: max(1, b.min), maxOutstanding: maxOutstanding, now: now}
	w.max = max(w.min, b.max)
	w.size = min(w.max, max(w.min, b.initial))
	w.growFreelyTo = w.max
	if b.growFreelyTo > 0 {
		w.growFreelyTo = min(w.max, b.growFreelyTo)
	}
	w.resetEpoch()
	if now != nil {
		w.epochStart = now()
	}
	return w
}

func (w *creditWindow) fixed() bool { return w.min == w.max }

// adopt takes over the credit of n held jobs of an ended stream.
func (w *creditWindow) adopt(n int) { w.held += n }

func (w *creditWindow) grantable() int {
	n := min(w.size-w.held-w.outstanding, w.maxOutstanding-w.outstanding)
	if n > 0 && n >= w.outstanding {
		return n
	}
	return 0
}

// takeGrant returns the credit to grant now and counts it as outstanding
// (the caller sends it).
func (w *creditWindow) takeGrant() int {
	n := w.grantable()
	w.outstanding += n
	return n
}

// arrived: a job arrived on the stream; it used one credit and is held.
func (w *creditWindow) arrived() {
	if w.now != nil {
		at := w.now()
		if !w.lastArrival.IsZero() {
			w.longestGap = max(w.longestGap, at.Sub(w.lastArrival))
		}
		w.lastArrival = at
	}
	w.outstanding = max(0, w.outstanding-1)
	w.held++
	w.lowOutstanding = min(w.lowOutstanding, w.outstanding)
	w.arrivals++
	if w.arrivals >= w.size {
		w.endEpoch()
	}
}

// returned: a held job's credit came back (its handler finished, or it was dropped).
func (w *creditWindow) returned() { w.held = max(0, w.held-1) }

// noteStarved: the handlers sat idle with nothing buffered.
func (w *creditWindow) noteStarved() { w.starved = true }

// noteStarted: a handler started with buffered jobs still waiting behind it.
func (w *creditWindow) noteStarted(buffered int) { w.lowBuffered = min(w.lowBuffered, buffered) }

// jobsPerRoundTrips is the jobs that arrive in roundTripsHeld commit
// intervals at this epoch's rate (0: unknown).
func (w *creditWindow) jobsPerRoundTrips(now time.Time) float64 {
	if w.now == nil || len(w.recentGaps) < gapEpochs {
		return 0
	}
	gap := w.recentGaps[0]
	for _, g := range w.recentGaps[1:] {
		gap = min(gap, g)
	}
	elapsed := float64(now.Sub(w.epochStart)) / float64(time.Millisecond)
	if elapsed < 0 {
		return 0 // the clock went back: no rate this epoch
	}
	perMs := float64(w.arrivals) / max(1, elapsed)
	return roundTripsHeld * perMs * float64(gap) / float64(time.Millisecond)
}

func (w *creditWindow) endEpoch() {
	var now time.Time
	if w.now != nil {
		now = w.now()
	}
	w.recentGaps = append(w.recentGaps, w.longestGap)
	if len(w.recentGaps) > gapEpochs {
		w.recentGaps = w.recentGaps[1:]
	}
	if !w.fixed() {
		switch {
		case w.starved && w.lowOutstanding*2 <= w.size:
			// The broker took every credit it had: quadruple (a slow store's window is far off).
			step := 2
			if w.lowOutstanding == 0 {
				step = 4
			}
			if w.size < w.growFreelyTo {
				w.size = min(w.growFreelyTo, w.size*step)
			} else if float64(w.size) < w.jobsPerRoundTrips(now) {
				w.size = min(w.max, w.size*2)
			}
		case !w.starved && w.lowBuffered > 0 && w.lowBuffered != math.MaxInt:
			w.size = max(w.min, w.size-(w.lowBuffered+1)/2)
		case w.starved && w.lowOutstanding != math.MaxInt && w.lowOutstanding*4 > w.size*3:
			w.size = max(w.min, w.size-(w.size-w.min+3)/4)
		}
	}
	w.resetEpoch()
	w.epochStart = now
}

func (w *creditWindow) resetEpoch() {
	w.longestGap = 0
	w.arrivals = 0
	w.lowOutstanding = math.MaxInt
	w.lowBuffered = math.MaxInt
	w.starved = false
}
