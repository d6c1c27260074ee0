// Command go-client is the Go chaos client: a producer or a worker on the
// casq Go SDK, configured with every broker address, writing what it was
// told to its history (format in ../history.ts). Same behaviour as
// ../clients/ts-client.ts.
//
// SIGTERM stops either gracefully and writes a "stop" record.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	casq "github.com/casq/casq/sdk/go"
)

const (
	lostText  = "chaos: lease lost"
	nackText  = "chaos: nack"
	nackShare = 0.03 // handlers that fail on purpose, so nacks and their backoff are exercised too
)

// history appends one JSON record per line with one write call, so a kill
// cannot tear two records.
type history struct {
	mu   sync.Mutex
	f    *os.File
	proc string
}

func (h *history) record(fields map[string]any) {
	fields["t"] = time.Now().UnixMilli()
	fields["proc"] = h.proc
	line, _ := json.Marshal(fields)
	h.mu.Lock()
	defer h.mu.Unlock()
	_, _ = h.f.Write(append(line, '\n'))
}

// jobField reads an optional field of the SDK's Job by name, so this client
// records a job's lease deadline and dedup id once the SDK has them.
func jobField(job *casq.Job, name string) (reflect.Value, bool) {
	v := reflect.ValueOf(job).Elem().FieldByName(name)
	return v, v.IsValid()
}

func leaseDeadline(job *casq.Job) any {
	if v, ok := jobField(job, "LeaseDeadline"); ok {
		if t, ok := v.Interface().(time.Time); ok && !t.IsZero() {
			return t.UnixMilli()
		}
	}
	return nil
}

func jobDedup(job *casq.Job) any {
	if v, ok := jobField(job, "DedupID"); ok && v.Kind() == reflect.String {
		return v.String()
	}
	return nil
}

func main() {
	role := flag.String("role", "", "producer or worker")
	id := flag.String("id", "go-client", "process name in the history")
	brokers := flag.String("brokers", "", "comma-separated broker addresses")
	queue := flag.String("queue", "chaos", "queue")
	historyPath := flag.String("history", "", "history file")
	seed := flag.Uint64("seed", 1, "seed of the hold times")
	rate := flag.Float64("rate", 10, "producer: messages per second")
	concurrency := flag.Int("concurrency", 2, "worker: handlers at once")
	leaseTTL := flag.Int("lease-ttl-ms", 3000, "worker: lease TTL")
	holdMax := flag.Int("hold-max-ms", 4000, "worker: longest hold")
	flag.Parse()

	f, err := os.OpenFile(*historyPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h := &history{f: f, proc: *id}
	h.record(map[string]any{"kind": "start", "role": *role, "lang": "go"})

	client, err := casq.Dial(context.Background(), casq.Options{
		Brokers:      strings.Split(*brokers, ","),
		Timeout:      2 * time.Second,
		RetryTimeout: 15 * time.Second,
		BackoffMax:   time.Second,
	})
	if err != nil {
		h.record(map[string]any{"kind": "error", "error": "fatal: " + err.Error()})
		os.Exit(1)
	}
	defer client.Close()

	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	rng := rand.New(rand.NewPCG(*seed, 0x5eed))

	switch *role {
	case "producer":
		produce(stop, client.Producer(), *queue, *id, *rate, h)
	case "worker":
		err = work(stop, client.Worker(), *queue, *id, *concurrency, *leaseTTL, *holdMax, rng, h)
	default:
		err = fmt.Errorf("--role must be producer or worker, not %q", *role)
	}
	if err != nil {
		h.record(map[string]any{"kind": "error", "error": "fatal: " + err.Error()})
		os.Exit(1)
	}
	h.record(map[string]any{"kind": "stop"})
}

func produce(stop context.Context, p *casq.Producer, queue, id string, rate float64, h *history) {
	interval := time.Duration(float64(time.Second) / rate)
	for seq := 1; stop.Err() == nil; seq++ {
		dedup := fmt.Sprintf("%s.%d", id, seq)
		payload, _ := json.Marshal(map[string]string{"dedup": dedup, "producer": id})
		started := time.Now()
		for {
			// Not the stop context: an enqueue in flight finishes (and is recorded) after SIGTERM.
			res, err := p.Enqueue(context.Background(), queue, payload, casq.WithDedupID(dedup))
			if err == nil {
				h.record(map[string]any{"kind": "enqueue-ok", "dedup": dedup, "id": res.ID, "duplicate": res.Duplicate})
				break
			}
			h.record(map[string]any{"kind": "enqueue-fail", "dedup": dedup, "error": err.Error()})
			if stop.Err() != nil && time.Since(started) > time.Minute {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(max(0, interval-time.Since(started)))
	}
}

func holdFor(rng *rand.Rand, holdMax int) time.Duration {
	x := rng.Float64()
	ms := 0.0
	switch {
	case x < 0.7:
		ms = 5 + rng.Float64()*300
	case x < 0.95:
		ms = 300 + rng.Float64()*1200
	default:
		ms = 1500 + rng.Float64()*float64(max(0, holdMax-1500))
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func work(stop context.Context, w *casq.Worker, queue, id string, concurrency, leaseTTL, holdMax int, rng *rand.Rand, h *history) error {
	var rngMu sync.Mutex
	handler := func(ctx context.Context, job *casq.Job) error {
		var payload struct {
			Dedup string `json:"dedup"`
		}
		_ = json.Unmarshal(job.Payload, &payload)
		h.record(map[string]any{
			"kind": "deliver", "id": job.ID, "dedup": payload.Dedup, "jobDedup": jobDedup(job),
			"receipt": job.Receipt, "attempt": job.Attempt, "leaseDeadline": leaseDeadline(job),
			"leaseTtlMs": leaseTTL,
		})
		rngMu.Lock()
		hold := holdFor(rng, holdMax)
		nack := rng.Float64() < nackShare
		rngMu.Unlock()
		select {
		case <-time.After(hold):
		case <-ctx.Done():
			h.record(map[string]any{"kind": "lease-lost", "id": job.ID, "receipt": job.Receipt})
			return errors.New(lostText)
		}
		if nack {
			h.record(map[string]any{"kind": "nack-sent", "id": job.ID, "receipt": job.Receipt})
			return errors.New(nackText)
		}
		h.record(map[string]any{"kind": "ack-sent", "id": job.ID, "receipt": job.Receipt})
		return nil
	}
	onError := func(err error, job *casq.Job) {
		if job != nil && (err.Error() == lostText || err.Error() == nackText) {
			return // our own failures, recorded by the handler
		}
		fields := map[string]any{"kind": "error", "error": err.Error()}
		if job != nil {
			fields["id"], fields["receipt"] = job.ID, job.Receipt
		}
		h.record(fields)
	}
	return w.Run(stop, queue, handler,
		casq.WithConcurrency(concurrency), casq.WithPrefetch(concurrency), casq.WithWorkerID(id),
		casq.WithLeaseTTL(time.Duration(leaseTTL)*time.Millisecond),
		casq.WithShutdownTimeout(10*time.Second), casq.WithErrorHandler(onError))
}
