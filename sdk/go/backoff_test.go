package casq

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffDelayDoublesUpToTheCapWithEqualJitter(t *testing.T) {
	lowest := func(time.Duration) time.Duration { return 0 }
	highest := func(k time.Duration) time.Duration { return k - 1 }
	initial, limit := 100*time.Millisecond, 5*time.Second
	for n, want := range []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000} {
		want *= time.Millisecond
		if got := backoffDelay(n, initial, limit, lowest); got != want/2 {
			t.Errorf("retry %d: lowest delay %v, want %v", n, got, want/2)
		}
		if got := backoffDelay(n, initial, limit, highest); got != want {
			t.Errorf("retry %d: highest delay %v, want %v", n, got, want)
		}
	}
	// A huge retry number neither overflows nor passes the cap.
	if got := backoffDelay(1_000_000, initial, limit, highest); got != limit {
		t.Errorf("retry 1e6: %v, want %v", got, limit)
	}
}

func TestBackoffDelayStaysWithinHalfAndAllOfItsCap(t *testing.T) {
	initial, limit := 3*time.Millisecond, 700*time.Millisecond
	for n := 0; n < 64; n++ {
		c := min(limit, initial<<min(n, 20))
		for range 50 {
			d := backoffDelay(n, initial, limit, rand.N[time.Duration])
			if d < c/2 || d > c {
				t.Fatalf("retry %d: %v outside [%v, %v]", n, d, c/2, c)
			}
		}
	}
}

func TestClientBackoffUsesItsOptions(t *testing.T) {
	client := &Client{opts: Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 40 * time.Millisecond}}
	for n, ms := range map[int]time.Duration{0: 10, 1: 20, 2: 40, 9: 40} {
		c := ms * time.Millisecond
		for range 20 {
			if d := client.backoff(n); d < c/2 || d > c {
				t.Fatalf("retry %d: %v outside [%v, %v]", n, d, c/2, c)
			}
		}
	}
}
