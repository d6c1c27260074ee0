package casq

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
)

// Worker runs a handler over the Work stream. Get one from Client.Worker.
type Worker struct{ c *Client }

// Job is one delivery handed to a handler.
type Job struct {
	ID           string
	Queue        string
	Subscription string
	Payload      []byte
	Headers      map[string]string
	Key          string
	Priority     int32
	// Attempt is 1 on the first delivery.
	Attempt     uint32
	MaxAttempts uint32
	// Receipt names this delivery; opaque.
	Receipt string
	// TraceParent and TraceState are the producer's W3C trace context.
	TraceParent string
	TraceState  string
	EnqueuedAt  time.Time
	// Shard and Offset locate the message: its shard of the queue and its
	// position there (strictly increasing per shard).
	Shard  uint32
	Offset uint64
	// DedupID is the producer's deduplication id ("" when none).
	DedupID string
	// LeaseDeadline is when the lease of this delivery runs out, as granted
	// with the claim (zero if the broker sent none); the worker's heartbeats
	// move the broker's deadline later than this.
	LeaseDeadline time.Time
}

// Handler processes one job: nil acks it, an error nacks it (retried with
// the queue's backoff), an error wrapping ErrDeadLetter dead-letters it. Its
// context is cancelled when the lease is lost or the shutdown deadline passed,
// and carries the job's "process <queue>" span (see Options.TracerProvider).
type Handler func(ctx context.Context, job *Job) error

// WorkerOption configures Run.
type WorkerOption func(*workerConfig)

type workerConfig struct {
	concurrency     int
	prefetch        int // 0: adaptive, up to maxPrefetch
	maxPrefetch     int // 0: 100 × concurrency
	subscription    string
	workerID        string
	leaseTTL        time.Duration
	shutdownTimeout time.Duration
	onError         func(error, *Job)
	logger          *slog.Logger // nil: log nothing
	loggerSet       bool
}

// WithConcurrency sets how many handlers run at once (default 1).
func WithConcurrency(n int) WorkerOption { return func(c *workerConfig) { c.concurrency = n } }

// WithPrefetch fixes how many jobs the worker holds per stream: running,
// waiting, and credit the broker has not used yet (concurrency..10 000).
// Without it the prefetch adapts, from the concurrency up to WithMaxPrefetch.
func WithPrefetch(n int) WorkerOption { return func(c *workerConfig) { c.prefetch = n } }

// WithMaxPrefetch bounds the adaptive prefetch per stream (ignored with
// WithPrefetch). The window grows while handlers wait for jobs the broker
// would have sent with more credit (fast handlers, slow store: a claim
// commit per window), and shrinks back when jobs only wait in the buffer.
// Buffered jobs are heartbeated like running ones, so their leases hold
// while they wait. Past 20 × concurrency it grows only while it holds fewer
// jobs than arrive in a few commit intervals (a slow store).
// concurrency..10 000; default 100 × concurrency (at most 10 000).
func WithMaxPrefetch(n int) WorkerOption { return func(c *workerConfig) { c.maxPrefetch = n } }

// maxPrefetch is the largest prefetch (fixed or adaptive) per stream.
const maxPrefetch = 10_000

// creditWindowBounds are the bounds of each stream's credit window for the
// options (see WithPrefetch, WithMaxPrefetch; 0 is unset).
func creditWindowBounds(concurrency, prefetch, maxPrefetchOpt int) windowBounds {
	clamp := func(n int) int { return min(maxPrefetch, max(concurrency, n)) }
	if prefetch > 0 {
		f := clamp(prefetch)
		return windowBounds{f, f, f, f}
	}
	if maxPrefetchOpt <= 0 {
		maxPrefetchOpt = 100 * concurrency
	}
	return windowBounds{initial: concurrency, min: concurrency, max: clamp(maxPrefetchOpt), growFreelyTo: 20 * concurrency}
}

// WithSubscription selects the consumer group (default "default").
func WithSubscription(s string) WorkerOption { return func(c *workerConfig) { c.subscription = s } }

// WithWorkerID sets the worker's identity (default "host/pid-N").
func WithWorkerID(id string) WorkerOption { return func(c *workerConfig) { c.workerID = id } }

// WithLeaseTTL overrides the queue's lease TTL for this worker's jobs.
func WithLeaseTTL(d time.Duration) WorkerOption { return func(c *workerConfig) { c.leaseTTL = d } }

// WithShutdownTimeout bounds how long Run waits for running handlers once
// its context is cancelled (default 30 s).
func WithShutdownTimeout(d time.Duration) WorkerOption {
	return func(c *workerConfig) { c.shutdownTimeout = d }
}

// WithErrorHandler receives failures that do not end Run (a handler error,
// a failed ack, a lost lease, a broken stream); job may be nil.
func WithErrorHandler(f func(err error, job *Job)) WorkerOption {
	return func(c *workerConfig) { c.onError = f }
}

// WithLogger sets where the worker logs failures (default slog.Default()):
// each handler that returns an error or panics (Warn, or Error when the job
// is dead-lettered: ErrDeadLetter or its last attempt), and every other
// failure WithErrorHandler hears of (Warn). WithLogger(nil) logs nothing;
// the error handler is called either way.
func WithLogger(l *slog.Logger) WorkerOption {
	return func(c *workerConfig) { c.logger, c.loggerSet = l, true }
}

// Run consumes queue until ctx is cancelled, then shuts down gracefully: it
// stops taking jobs, hands back jobs that had not started, waits up to the
// shutdown timeout for running handlers and settles them, and returns nil.
// Handlers still running then are cancelled and never acked. Run returns an
// *Error early only for failures retrying cannot fix (NOT_FOUND,
// INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION);
// handlers still running then have their context cancelled, and Run waits
// up to the shutdown timeout for them to return before it does (their jobs
// are not settled: their leases run out).
//
// A Work stream delivers jobs only from the shards its broker leads, so Run
// keeps one stream per shard leader: the primary stream, to the preferred
// broker, reconnects with backoff (at once after a redirect or a drain); the
// routing each stream reports names the leaders of the other shards, and Run
// opens a stream to each of them (again, with backoff, while routing still
// names one whose stream failed; LookupShards refreshes the leaders when a
// stream is lost without a redirect). Every stream has its own credit
// window (see WithPrefetch, WithMaxPrefetch), so the worker may hold up to
// the prefetch per stream; WithConcurrency bounds the handlers running at
// once over all of them.
func (w *Worker) Run(ctx context.Context, queue string, handler Handler, opts ...WorkerOption) error {
	cfg := workerConfig{concurrency: 1, shutdownTimeout: 30 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if !cfg.loggerSet {
		cfg.logger = slog.Default()
	}
	cfg.concurrency = max(cfg.concurrency, 1)
	if cfg.workerID == "" {
		host, _ := os.Hostname()
		cfg.workerID = fmt.Sprintf("%s/pid-%d", host, os.Getpid())
	}
	r := &run{
		c: w.c, ctx: ctx, queue: queue, cfg: cfg, handler: handler,
		window: creditWindowBounds(cfg.concurrency, cfg.prefetch, cfg.maxPrefetch),
		jobs:   map[string]*held{},
		// At most concurrency handlers report at once, so they never block
		// on a loop that has returned.
		done:     make(chan result, cfg.concurrency),
		sessions: map[string]*session{},
		inbox:    make(chan inboxMsg),
		opens:    make(chan openResult),
		beats:    make(chan beatResult),
		quit:     make(chan struct{}),
		leaders:  map[uint32]string{},
		failures: map[string]int{},
		retryAt:  map[string]time.Time{},
		looked:   make(chan lookupResult),
		tracer:   w.c.tracer(),
	}
	return r.loop()
}

func toJob(c *casqv1.ClaimedMessage) *Job {
	m := c.GetMessage()
	j := &Job{
		ID: m.GetId(), Queue: m.GetQueue(), Subscription: c.GetSubscription(), Payload: m.GetPayload(),
		Headers: m.GetHeaders(), Key: m.GetKey(), Priority: m.GetPriority(),
		Attempt: c.GetAttempt(), MaxAttempts: c.GetMaxAttempts(), Receipt: c.GetReceipt(),
		TraceParent: m.GetTraceContext().GetTraceparent(), TraceState: m.GetTraceContext().GetTracestate(),
		Shard: m.GetShard(), Offset: m.GetOffset(), DedupID: m.GetDedupId(),
	}
	if m.GetEnqueuedAt() != nil {
		j.EnqueuedAt = m.GetEnqueuedAt().AsTime()
	}
	if c.GetLeaseDeadline() != nil {
		j.LeaseDeadline = c.GetLeaseDeadline().AsTime()
	}
	return j
}
