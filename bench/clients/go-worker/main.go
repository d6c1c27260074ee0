// Command go-worker is the Go SDK's side of `npm run bench`: it works a
// preloaded casq queue with the SDK's Worker at a given concurrency and
// prints one JSON line with the jobs/s it measured from its first job to its
// last.
//
//	go run . -brokers 127.0.0.1:50051 -queue bench-1 -jobs 20000 -concurrency 50
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	casq "github.com/casq/casq/sdk/go"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:50051", "comma-separated broker addresses")
	queue := flag.String("queue", "", "queue to work (required)")
	jobs := flag.Int64("jobs", 0, "jobs to handle before stopping (required)")
	concurrency := flag.Int("concurrency", 50, "handlers at once")
	flag.Parse()
	if *queue == "" || *jobs <= 0 {
		log.Fatal("go-worker: -queue and -jobs are required")
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	client, err := casq.Dial(ctx, casq.Options{Brokers: strings.Split(*brokers, ",")})
	if err != nil {
		log.Fatal("go-worker: ", err)
	}
	defer client.Close()

	var done atomic.Int64
	var first, last time.Time
	var once sync.Once
	var mu sync.Mutex
	err = client.Worker().Run(ctx, *queue, func(context.Context, *casq.Job) error {
		once.Do(func() { first = time.Now() })
		if done.Add(1) == *jobs {
			mu.Lock()
			last = time.Now()
			mu.Unlock()
			stop()
		}
		return nil
	}, casq.WithConcurrency(*concurrency))
	if err != nil && ctx.Err() == nil {
		log.Fatal("go-worker: ", err)
	}
	mu.Lock()
	seconds := last.Sub(first).Seconds()
	mu.Unlock()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"jobs": *jobs, "seconds": seconds, "jobs_per_s": float64(*jobs) / seconds})
}
