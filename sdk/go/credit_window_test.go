package casq

import (
	"slices"
	"testing"
)

// The credit window's rules, driven by hand (as sdk/ts/src/worker/credit-window.test.ts).

func openWindow(t *testing.T, initial, lo, hi int) *creditWindow {
	t.Helper()
	w := newCreditWindow(windowBounds{initial: initial, min: lo, max: hi}, 1000)
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
	w := openWindow(t, 4, 4, 50)
	var sizes []int
	for range 8 {
		fastRound(w)
		sizes = append(sizes, w.size)
	}
	if want := []int{8, 16, 32, 50, 50, 50, 50, 50}; !slices.Equal(sizes, want) {
		t.Fatalf("sizes %v, want %v", sizes, want)
	}
	if w.outstanding > 50 {
		t.Fatalf("outstanding %d above max", w.outstanding)
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
	w := newCreditWindow(windowBounds{2500, 2500, 2500}, 1000)
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
	w := newCreditWindow(windowBounds{10, 10, 10}, 1000)
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
		{50, 0, 0, windowBounds{50, 50, 1000}},
		{1, 0, 0, windowBounds{1, 1, 20}},
		{1000, 0, 0, windowBounds{1000, 1000, 10000}},
		{10, 0, 5, windowBounds{10, 10, 10}},
		{10, 30, 0, windowBounds{30, 30, 30}},
		{10, 20000, 0, windowBounds{10000, 10000, 10000}},
	}
	for _, c := range cases {
		if got := creditWindowBounds(c.concurrency, c.prefetch, c.maxPrefetch); got != c.want {
			t.Errorf("creditWindowBounds(%d, %d, %d) = %v, want %v", c.concurrency, c.prefetch, c.maxPrefetch, got, c.want)
		}
	}
}
