package casq

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
)

// Options configure a Client.
type Options struct {
	// Brokers are the "host:port" addresses of the brokers, tried in order.
	// At least one is required; any broker may be listed first.
	Brokers []string
	// Token, when set, is sent as "authorization: Bearer <token>".
	Token string
	// TLS, when set, is used for every connection; nil means plaintext h2c.
	TLS *tls.Config
	// Timeout bounds each attempt of a unary call (default 10 s). The
	// caller's context bounds the whole call, retries included.
	Timeout time.Duration
	// RetryTimeout bounds how long one unary call keeps retrying across
	// brokers and redirects (default 30 s): long enough to ride out a killed
	// broker's leader lease (10 s by default). The caller's ctx may end it
	// sooner.
	RetryTimeout time.Duration
	// MaxAttempts, when > 0, also bounds the attempts of one call (default:
	// no count limit, only RetryTimeout).
	MaxAttempts int
	// BackoffInitial and BackoffMax shape the exponential backoff with jitter
	// between failed attempts (defaults 100 ms and 5 s). Redirects are
	// followed at once.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	// TracerProvider makes the worker's "process <queue>" spans; nil means
	// otel.GetTracerProvider() (a no-op unless the application installs
	// one). Calls carry the trace context of the span in their ctx either
	// way.
	TracerProvider trace.TracerProvider
	// DialOptions are added to the SDK's own (transport credentials) when a
	// connection to a broker is made: interceptors for metrics or auth
	// (grpc.WithChainUnaryInterceptor, grpc.WithChainStreamInterceptor), a
	// proxy dialer (grpc.WithContextDialer), keepalive, and so on. Every
	// call of the client, the Work streams included, goes through them.
	//
	// They come after the SDK's own, so they win where both set the same
	// thing: grpc.WithKeepaliveParams here replaces the keepalive below.
	DialOptions []grpc.DialOption
	// KeepaliveTime is how long a connection to a broker may go without
	// data before the client sends an HTTP/2 PING (default 10 s; grpc-go
	// raises anything shorter to 10 s). Idle connections are pinged too. A
	// PING unanswered within KeepaliveTimeout (default 10 s) closes the
	// connection and fails its calls and streams: that is how a worker with
	// no job, whose Work stream sends nothing, leaves a broker that hangs
	// with the connection up (a process frozen by SIGSTOP) and reconnects to
	// the next broker. A negative KeepaliveTime turns PINGs off (such a
	// worker then waits until TCP itself fails, which may be never).
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// NoDefaultDedupIDs turns off the random dedup id the producer gives
	// every message that has none. That id is made once per Enqueue or
	// EnqueueBatch call, so the SDK's retries of the call reuse it: an
	// attempt that timed out (a hung broker) may still have been stored,
	// and its retry at another broker then returns the stored message
	// instead of storing it twice. Each id costs about 100 bytes of the
	// shard document for the queue's dedup window (5 minutes by default);
	// set this to save that at the price of possible duplicates after an
	// ambiguous failure.
	NoDefaultDedupIDs bool
	// NoEnqueueBatching sends every Producer.Enqueue as its own request. By
	// default concurrent Enqueue calls for one queue are merged: a call goes
	// out at once when fewer than two requests of its queue are in flight,
	// otherwise it waits for one of them to end and goes out with every call
	// that came meanwhile, in one request (group commit, no timer: a lone
	// call is not delayed). Each caller still gets its own result or error:
	// a request that fails with an error that may be about one message
	// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION,
	// ALREADY_EXISTS, OUT_OF_RANGE) is resent message by message, so one bad
	// message fails only its own caller; other failures (after the usual
	// retries) reach every caller of the request. Calls with a dedup id (the
	// default, see NoDefaultDedupIDs) are merged with each other, and calls
	// with neither dedup id nor key with each other (the broker stores such a
	// request on one shard, all or none, so it is resent message by message
	// only after a refusal that stored nothing); calls with a key and no
	// dedup id are sent alone. EnqueueBatch is always sent as it is. A merged request runs within RetryTimeout, not within
	// its callers' contexts: a caller whose ctx ends first returns at once
	// (its message may still be stored). Each message keeps its caller's
	// trace context.
	NoEnqueueBatching bool
	// EnqueueBatchMaxMessages (1..1000, default 1000) and
	// EnqueueBatchMaxBytes (default 4 MiB; payloads, keys, headers, dedup
	// ids) bound one merged request; a call that would pass them goes in the
	// next. Lower the first for a queue whose max_batch is lower.
	EnqueueBatchMaxMessages int
	EnqueueBatchMaxBytes    int
}

// Client is a connection pool to a casq cluster. It is safe for concurrent
// use; create one per process and Close it when done.
type Client struct {
	opts Options

	mu        sync.Mutex
	conns     map[string]*grpc.ClientConn
	preferred string
	closed    bool

	batcherOnce sync.Once
	batcher     *enqueueBatcher // nil with NoEnqueueBatching
}

// enqueueBatcher returns the client's merger of Enqueue calls, nil when off.
func (c *Client) enqueueBatcher() *enqueueBatcher {
	c.batcherOnce.Do(func() {
		if !c.opts.NoEnqueueBatching {
			c.batcher = newEnqueueBatcher(c)
		}
	})
	return c.batcher
}

// Dial validates opts and returns a Client. Connections are made lazily, on
// the first call to each broker, so Dial does not fail when a broker is down.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(opts.Brokers) == 0 {
		return nil, &Error{Code: codes.InvalidArgument, Message: "casq: Options.Brokers is empty"}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.RetryTimeout <= 0 {
		opts.RetryTimeout = 30 * time.Second
	}
	if opts.BackoffInitial <= 0 {
		opts.BackoffInitial = 100 * time.Millisecond
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 5 * time.Second
	}
	if opts.KeepaliveTime == 0 {
		opts.KeepaliveTime = 10 * time.Second
	}
	if opts.KeepaliveTimeout <= 0 {
		opts.KeepaliveTimeout = 10 * time.Second
	}
	opts.Brokers = append([]string(nil), opts.Brokers...)
	opts.DialOptions = append([]grpc.DialOption(nil), opts.DialOptions...)
	return &Client{opts: opts, conns: map[string]*grpc.ClientConn{}, preferred: opts.Brokers[0]}, nil
}

// Close closes every connection of the client.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for addr, conn := range c.conns {
		errs = append(errs, conn.Close())
		delete(c.conns, addr)
	}
	return errors.Join(errs...)
}

// Producer returns a Producer that enqueues through this client.
func (c *Client) Producer() *Producer { return &Producer{c: c} }

// Worker returns a Worker that consumes through this client.
func (c *Client) Worker() *Worker { return &Worker{c: c} }

// Admin returns the administrative API of this client.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, &Error{Code: codes.Canceled, Message: "casq: client is closed"}
	}
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.opts.KeepaliveTime > 0 {
		dialOpts = append(dialOpts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: c.opts.KeepaliveTime, Timeout: c.opts.KeepaliveTimeout, PermitWithoutStream: true,
		}))
	}
	// The user's options last: where they set the same thing, they win.
	conn, err := grpc.NewClient(addr, append(dialOpts, c.opts.DialOptions...)...)
	if err != nil {
		return nil, toError(err, nil)
	}
	c.conns[addr] = conn
	return conn, nil
}

func (c *Client) current() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.preferred
}

func (c *Client) prefer(addr string) {
	c.mu.Lock()
	c.preferred = addr
	c.mu.Unlock()
}

// next returns the broker after addr in Options.Brokers (the first one when
// addr is a redirect target not in the list), and prefers it from now on.
func (c *Client) next(addr string) string {
	b := c.opts.Brokers
	n := b[0]
	for i, a := range b {
		if a == addr {
			n = b[(i+1)%len(b)]
			break
		}
	}
	c.prefer(n)
	return n
}

// backoff returns the jittered delay before retry number n (0-based); see backoffDelay.
func (c *Client) backoff(n int) time.Duration {
	return backoffDelay(n, c.opts.BackoffInitial, c.opts.BackoffMax, rand.N[time.Duration])
}

// outgoing adds the token and trace context to ctx's outgoing metadata.
func (c *Client) outgoing(ctx context.Context) context.Context {
	var kv []string
	if c.opts.Token != "" {
		kv = append(kv, "authorization", "Bearer "+c.opts.Token)
	}
	if parent, state := traceHeaders(ctx); parent != "" {
		kv = append(kv, "traceparent", parent)
		if state != "" {
			kv = append(kv, "tracestate", state)
		}
	}
	if len(kv) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// rpcFunc is one attempt of a unary RPC on the given broker's clients.
type rpcFunc func(ctx context.Context, qs casqv1.QueueServiceClient, as casqv1.AdminServiceClient, opts ...grpc.CallOption) error

// call runs one unary RPC with redirect following and failover.
func (c *Client) call(ctx context.Context, fn rpcFunc) error {
	return c.callAt(ctx, c.current(), time.Now().Add(c.opts.RetryTimeout), fn)
}

// callAt is call starting at addr, retrying until giveUpAt: the parts of a
// split batch start at the broker the BatchRedirect named and share the
// retry budget of the whole EnqueueBatch.
func (c *Client) callAt(ctx context.Context, addr string, giveUpAt time.Time, fn rpcFunc) error {
	failures := 0
	var last error
	var failed map[string]bool // brokers that failed without a redirect in this call
	// wait sleeps before the next attempt; false when the retry budget or ctx is spent.
	wait := func() bool {
		d := c.backoff(failures)
		failures++
		return time.Now().Add(d).Before(giveUpAt) && sleep(ctx, d) == nil
	}
	for attempt := 0; c.opts.MaxAttempts <= 0 || attempt < c.opts.MaxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return last
			}
			return toError(err, nil)
		}
		conn, err := c.conn(addr)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(c.outgoing(ctx), c.opts.Timeout)
		var trailer metadata.MD
		err = fn(actx, casqv1.NewQueueServiceClient(conn), casqv1.NewAdminServiceClient(conn), grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			c.prefer(addr)
			return nil
		}
		e := toError(err, trailer)
		last = e
		switch {
		case e.BatchRedirect != nil:
			// Nothing was stored and no single broker can store the batch:
			// retrying it anywhere is pointless, the caller splits it.
			c.prefer(addr)
			return e
		case e.LeaderAddress != "" && !failed[e.LeaderAddress]:
			addr = e.LeaderAddress
			c.prefer(addr)
		case e.LeaderAddress != "":
			// A redirect to a broker that already failed in this call: the
			// leader died and this broker takes its shards over once the
			// leader's lease runs out. Bouncing between the two would burn
			// the attempts within a fraction of that lease, so wait here.
			c.prefer(addr)
			if !wait() {
				return e
			}
		case e.Code == codes.Unavailable || (e.Code == codes.DeadlineExceeded && ctx.Err() == nil):
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[addr] = true
			addr = c.next(addr)
			if !wait() {
				return e
			}
		default:
			return e
		}
	}
	return last
}
