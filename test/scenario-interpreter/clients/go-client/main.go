// Command go-client is the Go client under test of the scenario interpreter
// (protocol in ../../README.md): it reads one JSON request a line on stdin,
// makes the casq Go SDK call it names, and writes one JSON response a line
// on stdout. Its one argument is {"brokers": [...]}.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

const handlerError = "scenario handler:"

// request is one line of stdin: an op and its arguments (fields as the
// interpreter sends them; unused ones stay zero).
type request struct {
	ID           int       `json:"id"`
	Op           string    `json:"op"`
	Queue        string    `json:"queue"`
	Shards       uint32    `json:"shards"`
	LeaseTTLMs   int64     `json:"leaseTtlMs"`
	MaxAttempts  *uint32   `json:"maxAttempts"`
	BackoffMs    int64     `json:"backoffMs"`
	Subscription string    `json:"subscription"`
	Batch        bool      `json:"batch"`
	Brokers      []string  `json:"brokers"`
	Messages     []message `json:"messages"`
	Name         string    `json:"name"`
	Concurrency  int       `json:"concurrency"`
	Prefetch     int       `json:"prefetch"`
	Handler      string    `json:"handler"`
	HandlerMs    int64     `json:"handlerMs"`
	GraceMs      int64     `json:"graceMs"`
}

type message struct {
	Payload     string            `json:"payload"`
	Key         string            `json:"key"`
	Priority    int32             `json:"priority"`
	DelayMs     int64             `json:"delayMs"`
	MaxAttempts uint32            `json:"maxAttempts"`
	DedupID     string            `json:"dedupId"`
	Headers     map[string]string `json:"headers"`
}

type invocation struct {
	Payload string `json:"payload"`
	Attempt uint32 `json:"attempt"`
}

// workerRun is one startWorker: Run in a goroutine, recording its handler calls.
type workerRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, once done is closed

	mu          sync.Mutex
	invocations []invocation
	completed   int
	errors      []string
}

func (w *workerRun) state() map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]any{
		"started": len(w.invocations), "completed": w.completed,
		"invocations": append([]invocation{}, w.invocations...), "errors": append([]string{}, w.errors...),
	}
	select {
	case <-w.done:
		out["ended"] = true
		if w.err != nil {
			out["error"] = w.err.Error()
		}
	default:
		out["ended"] = false
	}
	return out
}

type session struct {
	client    *casq.Client
	producers map[string]*casq.Producer
	workers   map[string]*workerRun
}

// dial uses the SDK's defaults: their retry budget must ride out a killed leader on its own.
func dial(brokers []string) (*casq.Client, error) {
	return casq.Dial(context.Background(), casq.Options{Brokers: brokers})
}

func (s *session) producer(only []string) (*casq.Producer, error) {
	if only == nil {
		return s.client.Producer(), nil
	}
	key := strings.Join(only, ",")
	if p, ok := s.producers[key]; ok {
		return p, nil
	}
	c, err := dial(only)
	if err != nil {
		return nil, err
	}
	s.producers[key] = c.Producer()
	return s.producers[key], nil
}

func (s *session) worker(name string) (*workerRun, error) {
	w, ok := s.workers[name]
	if !ok {
		return nil, fmt.Errorf("no worker %q", name)
	}
	return w, nil
}

func (s *session) handle(ctx context.Context, r *request) (any, error) {
	switch r.Op {
	case "createQueue":
		backoff := durationpb.New(time.Duration(r.BackoffMs) * time.Millisecond)
		cfg := &casqv1.QueueConfig{
			LeaseTtl:    durationpb.New(time.Duration(r.LeaseTTLMs) * time.Millisecond),
			MaxAttempts: r.MaxAttempts,
			Backoff: &casqv1.BackoffPolicy{
				InitialDelay: backoff, MaxDelay: proto.Clone(backoff).(*durationpb.Duration),
				Multiplier: proto.Float64(1), Jitter: proto.Float64(0),
			},
		}
		_, err := s.client.Admin().CreateQueue(ctx, r.Queue, r.Shards, cfg)
		return map[string]any{}, err
	case "createSubscription":
		_, err := s.client.Admin().CreateSubscription(ctx, r.Queue, r.Subscription, casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST)
		return map[string]any{}, err
	case "enqueue":
		return s.enqueue(ctx, r)
	case "getQueue":
		q, err := s.client.Admin().GetQueue(ctx, r.Queue)
		if err != nil {
			return nil, err
		}
		b, err := protojson.Marshal(q)
		return json.RawMessage(b), err
	case "listDeadLetters":
		dls, err := s.client.Admin().ListDeadLetters(ctx, r.Queue, r.Subscription)
		payloads := []string{}
		for _, d := range dls {
			payloads = append(payloads, string(d.GetMessage().GetPayload()))
		}
		return map[string]any{"payloads": payloads}, err
	case "redrive":
		n, err := s.client.Admin().Redrive(ctx, r.Queue, r.Subscription)
		return map[string]any{"redriven": n}, err
	case "startWorker":
		return map[string]any{}, s.startWorker(r)
	case "workerState":
		w, err := s.worker(r.Name)
		if err != nil {
			return nil, err
		}
		return w.state(), nil
	case "stopWorker":
		w, err := s.worker(r.Name)
		if err != nil {
			return nil, err
		}
		w.cancel()
		// Run waits up to the grace period for handlers, then settles and
		// half-closes; allow a margin for that beyond the grace period.
		select {
		case <-w.done:
		case <-time.After(time.Duration(r.GraceMs)*time.Millisecond + 30*time.Second):
			return nil, fmt.Errorf("worker %q did not stop", r.Name)
		}
		return w.state(), nil
	}
	return nil, fmt.Errorf("unknown op %q", r.Op)
}

func (s *session) enqueue(ctx context.Context, r *request) (any, error) {
	msgs := make([]casq.Message, len(r.Messages))
	for i, m := range r.Messages {
		var opts []casq.EnqueueOption
		if m.Key != "" {
			opts = append(opts, casq.WithKey(m.Key))
		}
		if m.Priority != 0 {
			opts = append(opts, casq.WithPriority(m.Priority))
		}
		if m.DelayMs != 0 {
			opts = append(opts, casq.WithDelay(time.Duration(m.DelayMs)*time.Millisecond))
		}
		if m.MaxAttempts != 0 {
			opts = append(opts, casq.WithMaxAttempts(m.MaxAttempts))
		}
		if m.DedupID != "" {
			opts = append(opts, casq.WithDedupID(m.DedupID))
		}
		if m.Headers != nil {
			opts = append(opts, casq.WithHeaders(m.Headers))
		}
		msgs[i] = casq.Message{Payload: []byte(m.Payload), Options: opts}
	}
	p, err := s.producer(r.Brokers)
	if err != nil {
		return nil, err
	}
	var results []casq.EnqueueResult
	if r.Batch {
		if results, err = p.EnqueueBatch(ctx, r.Queue, msgs); err != nil {
			return nil, fmt.Errorf("batch enqueue: %w", err)
		}
	} else {
		for i, m := range msgs {
			res, err := p.Enqueue(ctx, r.Queue, m.Payload, m.Options...)
			if err != nil {
				return nil, fmt.Errorf("enqueue of message %d: %w", i, err)
			}
			results = append(results, res)
		}
	}
	out := make([]map[string]any, len(results))
	for i, res := range results {
		out[i] = map[string]any{"id": res.ID, "duplicate": res.Duplicate}
	}
	return map[string]any{"results": out}, nil
}

func (s *session) startWorker(r *request) error {
	if _, ok := s.workers[r.Name]; ok {
		return fmt.Errorf("worker %q already started", r.Name)
	}
	var fail error
	switch r.Handler {
	case "ack", "hang":
	case "nack":
		fail = errors.New(handlerError + " nack")
	case "deadLetter":
		fail = casq.DeadLetter(errors.New(handlerError + " dead letter"))
	default:
		return fmt.Errorf("unknown handler %q", r.Handler)
	}
	w := &workerRun{done: make(chan struct{})}
	var ctx context.Context
	ctx, w.cancel = context.WithCancel(context.Background())
	handlerDur := time.Duration(r.HandlerMs) * time.Millisecond
	hang := r.Handler == "hang"
	handler := func(hctx context.Context, job *casq.Job) error {
		w.mu.Lock()
		w.invocations = append(w.invocations, invocation{string(job.Payload), job.Attempt})
		w.mu.Unlock()
		if hang {
			select {} // until the process is killed
		}
		defer func() {
			w.mu.Lock()
			w.completed++
			w.mu.Unlock()
		}()
		if handlerDur > 0 {
			select {
			case <-time.After(handlerDur):
			case <-hctx.Done():
				return hctx.Err()
			}
		}
		return fail
	}
	opts := []casq.WorkerOption{
		casq.WithSubscription(r.Subscription), casq.WithConcurrency(r.Concurrency), casq.WithPrefetch(r.Prefetch),
		// Run takes the grace period up front: the interpreter sends the one of this worker's stopWorker.
		casq.WithShutdownTimeout(time.Duration(r.GraceMs) * time.Millisecond),
		casq.WithErrorHandler(func(err error, _ *casq.Job) {
			if strings.Contains(err.Error(), handlerError) {
				return
			}
			w.mu.Lock()
			w.errors = append(w.errors, err.Error())
			if len(w.errors) > 5 {
				w.errors = w.errors[1:]
			}
			w.mu.Unlock()
		}),
	}
	if r.LeaseTTLMs > 0 {
		opts = append(opts, casq.WithLeaseTTL(time.Duration(r.LeaseTTLMs)*time.Millisecond))
	}
	s.workers[r.Name] = w
	go func() {
		defer close(w.done)
		w.err = s.client.Worker().Run(ctx, r.Queue, handler, opts...)
	}()
	return nil
}

func main() {
	var config struct {
		Brokers []string `json:"brokers"`
	}
	if len(os.Args) != 2 || json.Unmarshal([]byte(os.Args[1]), &config) != nil {
		fmt.Fprintln(os.Stderr, `usage: go-client '{"brokers": [...]}'`)
		os.Exit(2)
	}
	client, err := dial(config.Brokers)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-client:", err)
		os.Exit(1)
	}
	s := &session{client: client, producers: map[string]*casq.Producer{}, workers: map[string]*workerRun{}}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var r request
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "go-client: bad request:", err)
			os.Exit(2)
		}
		result, err := s.handle(context.Background(), &r)
		if err != nil {
			_ = out.Encode(map[string]any{"id": r.ID, "error": err.Error()})
		} else {
			_ = out.Encode(map[string]any{"id": r.ID, "result": result})
		}
	}
}
