package casq

import "time"

// backoffDelay is the SDK's one retry delay: the delay before retry number n
// (0-based) is drawn with equal jitter from [c/2, c], where the cap
// c = min(limit, initial * 2^n). A retry always waits at least half its cap
// (full jitter would sometimes retry at once). randN(k) must return a
// uniform value in [0, k), like math/rand/v2's N.
func backoffDelay(n int, initial, limit time.Duration, randN func(time.Duration) time.Duration) time.Duration {
	d := initial
	// Doubling stops at the cap, so d never overflows.
	for i := 0; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + randN(d/2+1)
}
