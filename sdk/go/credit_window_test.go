package casq

import (
	"slices"
	"testing"
	"time"
)

// The credit window's rules, driven by hand (as sdk/ts/src/worker/credit-window.test.ts).

func openWindow(t *testing.T, initial, lo, hi int) *creditWindow {
	t.Helper()
	w := newCreditWindow(windowBounds{initial: initial, min: lo, max: hi}, 1000, nil)
	if g := w.takeGrant(); g != w.size {
		t.Fatalf("first grant %d, want %d", g, w.size)
	}
	return w
}

// fastRound: every outstanding credit comes back as a job that finishes at once.
func fastRound(w *creditWindow) {
	n := w.outstanding
	w.noteStarved()
	for range n {
		w.arrived()
	}
	for range n {
		w.returned()
		w.noteStarved()
	}
	w.takeGrant()
}

func TestCreditWindowGrowsWhileStarvedUpToMax(t *testing.T) {
	// The broker used all the credit: x4.
	w := openWindow(t, 4, 4, 50)
	var sizes []int
	for range 4 {
		fastRound(w)
		sizes = append(sizes, w.size)
	}
	if want := []int{16, 50, 50, 50}; !slices.Equal(sizes, want) {
		t.Fatalf("sizes %v, want %v", sizes, want)
	}
	if w.outstanding > 50 {
		t.Fatalf("outstanding %d above max", w.outstanding)
	}
	// It keeps one credit back each round (used most, not all): x2.
	most := openWindow(t, 4, 4, 50)
	var seen []int
	for range 12 {
		most.noteStarved()
		n := most.outstanding - 1
		for range n {
			most.arrived()
		}
		for range n {
			most.returned()
		}
		most.outstanding = most.size // the held-back credit is used by the next round
		if len(seen) == 0 || seen[len(seen)-1] != most.size {
			seen = append(seen, most.size)
		}
	}
	if want := []int{4, 8, 16, 32, 50}; !slices.Equal(seen, want) {
		t.Fatalf("sizes %v, want %v", seen, want)
	}
}

func TestCreditWindowPastGrowFreelyToGrowsForBigCommits(t *testing.T) {
	// A slow store: every 100 ms a commit brings all the credit the broker had, at once.
	clock := time.Unix(0, 0)
	w := newCreditWindow(windowBounds{50, 50, 5000, 1000}, 10_000, func() time.Time { return clock })
	w.takeGrant()
	var sizes []int
	for range 12 {
		clock = clock.Add(100 * time.Millisecond)
		fastRound(w)
		sizes = append(sizes, w.size)
	}
	if want := []int{200, 800, 1000, 2000, 4000}; !slices.Equal(sizes[:5], want) {
		t.Fatalf("sizes %v, want %v first", sizes, want)
	}
	if w.size != 5000 {
		t.Fatalf("size %d, want 5000", w.size)
	}
}

func TestCreditWindowPastGrowFreelyToStaysForABusyBroker(t *testing.T) {
	// A fast store, a busy broker: 100 jobs every 5 ms whatever the credit (it used all it had left).
	clock := time.Unix(0, 0)
	w := newCreditWindow(windowBounds{800, 50, 5000, 800}, 10_000, func() time.Time { return clock })
	w.takeGrant()
	for round := range 40 {
		step := 5 * time.Millisecond
		if round == 20 {
			step = 100 * time.Millisecond // one long pause (a GC, say) is not a commit interval
		}
		clock = clock.Add(step)
		w.outstanding = 100
		w.noteStarved()
		for range 100 {
			w.arrived()
			w.returned()
		}
	}
	if w.size != 800 {
		t.Fatalf("size %d, want 800", w.size)
	}
	// Without a clock it never grows past growFreelyTo either.
	untimed := newCreditWindow(windowBounds{800, 50, 5000, 800}, 10_000, nil)
	untimed.takeGrant()
	for range 10 {
		fastRound(untimed)
	}
	if untimed.size != 800 {
		t.Fatalf("untimed size %d, want 800", untimed.size)
	}
}

func TestCreditWindowShrinksOnAStandingQueue(t *testing.T) {
	w := openWindow(t, 40, 10, 100)
	for range 40 {
		w.arrived()
		w.noteStarted(30)
	}
	if w.size != 25 {
		t.Fatalf("size %d, want 25", w.size)
	}
}

func TestCreditWindowDecaysWhenTheBrokerSatOnTheCredit(t *testing.T) {
	w := openWindow(t, 100, 10, 1000)
	for range 100 {
		w.arrived()
		w.returned()
		w.noteStarved()
		w.outstanding++
	}
	if w.size >= 100 || w.size < 10 {
		t.Fatalf("size %d, want in [10, 100)", w.size)
	}
}

func TestCreditWindowFixed(t *testing.T) {
	w := openWindow(t, 6, 6, 6)
	for range 5 {
		fastRound(w)
	}
	if w.size != 6 || !w.fixed() {
		t.Fatalf("size %d fixed %v", w.size, w.fixed())
	}
}

func TestCreditWindowHoldsBackSmallGrants(t *testing.T) {
	w := openWindow(t, 10, 10, 10)
	for range 6 {
		w.arrived()
	}
	w.returned()
	if g := w.takeGrant(); g != 0 {
		t.Fatalf("grant %d, want 0 (less than the 4 outstanding)", g)
	}
	for range 3 {
		w.returned()
	}
	if g := w.takeGrant(); g != 4 || w.outstanding != 8 {
		t.Fatalf("grant %d outstanding %d, want 4 and 8", g, w.outstanding)
	}
}

func TestCreditWindowWithinMaxCredits(t *testing.T) {
	w := newCreditWindow(windowBounds{2500, 2500, 2500, 0}, 1000, nil)
	if g := w.takeGrant(); g != 1000 {
		t.Fatalf("grant %d", g)
	}
	for range 1000 {
		w.arrived()
	}
	if g := w.takeGrant(); g != 1000 || w.held+w.outstanding != 2000 {
		t.Fatalf("grant %d, held+outstanding %d", g, w.held+w.outstanding)
	}
}

func TestCreditWindowAdopted(t *testing.T) {
	w := newCreditWindow(windowBounds{10, 10, 10, 0}, 1000, nil)
	w.adopt(3)
	if g := w.takeGrant(); g != 7 {
		t.Fatalf("grant %d, want 7", g)
	}
}

func TestWindowBoundsOfOptions(t *testing.T) {
	cases := []struct {
		concurrency, prefetch, maxPrefetch int
		want                               windowBounds
	}{
		{50, 0, 0, windowBounds{50, 50, 5000, 1000}},
		{1, 0, 0, windowBounds{1, 1, 100, 20}},
		{1000, 0, 0, windowBounds{1000, 1000, 10000, 20000}},
		{10, 0, 5, windowBounds{10, 10, 10, 200}},
		{10, 30, 0, windowBounds{30, 30, 30, 30}},
		{10, 20000, 0, windowBounds{10000, 10000, 10000, 10000}},
	}
	for _, c := range cases {
		if got := creditWindowBounds(c.concurrency, c.prefetch, c.maxPrefetch); got != c.want {
			t.Errorf("creditWindowBounds(%d, %d, %d) = %v, want %v", c.concurrency, c.prefetch, c.maxPrefetch, got, c.want)
		}
	}
}
