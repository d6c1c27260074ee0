package casq_test

// The worker logs each handler failure through a slog.Logger: the default
// logger unless the user sets one, nothing with WithLogger(nil).

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	casq "github.com/casq/casq/sdk/go"
)

// logRecord is one record a captureHandler received.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// captureHandler is a slog.Handler that keeps every record.
type captureHandler struct {
	mu      *sync.Mutex
	records *[]logRecord
}

func newCapture() captureHandler { return captureHandler{mu: &sync.Mutex{}, records: &[]logRecord{}} }

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h captureHandler) WithGroup(string) slog.Handler            { return h }
func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.records = append(*h.records, rec)
	h.mu.Unlock()
	return nil
}

// of returns the records about queue.
func (h captureHandler) of(queue string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.records {
		if r.attrs["queue"] == queue {
			out = append(out, r)
		}
	}
	return out
}

func TestWorkerLogsHandlerFailures(t *testing.T) {
	c := dial(t)
	queue := queueName(t)
	fastRetries(t, c, queue)
	res, err := c.Producer().Enqueue(context.Background(), queue, []byte("x"), casq.WithMaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	logs := newCapture()
	runWorker(t, c, queue, func(_ context.Context, job *casq.Job) error {
		switch job.Attempt {
		case 1:
			return errors.New("boom")
		case 2:
			panic("kaboom")
		}
		return errors.New("still broken")
	}, casq.WithLogger(slog.New(logs)))
	eventually(t, "three failures logged", func() bool { return len(logs.of(queue)) >= 3 })
	got := logs.of(queue)
	want := []struct {
		level slog.Level
		text  string
	}{
		{slog.LevelWarn, "failed (attempt 1 of 3), it will be retried: boom"},
		{slog.LevelWarn, "failed (attempt 2 of 3), it will be retried: casq: handler panicked: kaboom"},
		{slog.LevelError, "failed (attempt 3 of 3), it is dead-lettered: still broken"},
	}
	for i, w := range want {
		r := got[i]
		if r.level != w.level || !strings.Contains(r.msg, w.text) || r.attrs["job_id"] != res.ID {
			t.Errorf("record %d: %v %q %v; want %v, %q, job_id %s", i, r.level, r.msg, r.attrs, w.level, w.text, res.ID)
		}
	}
}

func TestWorkerLogsToDefaultUnlessSilenced(t *testing.T) {
	logs := newCapture()
	prev := slog.Default()
	slog.SetDefault(slog.New(logs))
	defer slog.SetDefault(prev)
	c := dial(t)
	failOnce := func(done chan<- struct{}) casq.Handler {
		return func(_ context.Context, job *casq.Job) error {
			if job.Attempt == 1 {
				return errors.New("boom")
			}
			close(done)
			return nil
		}
	}
	loud, quiet := queueName(t)+"-loud", queueName(t)+"-quiet"
	doneLoud, doneQuiet := make(chan struct{}), make(chan struct{})
	for _, q := range []string{loud, quiet} {
		fastRetries(t, c, q)
		if _, err := c.Producer().Enqueue(context.Background(), q, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	stopLoud := runWorker(t, c, loud, failOnce(doneLoud))
	stopQuiet := runWorker(t, c, quiet, failOnce(doneQuiet), casq.WithLogger(nil))
	wait(t, doneLoud)
	wait(t, doneQuiet)
	if err := stopLoud(); err != nil {
		t.Fatal(err)
	}
	if err := stopQuiet(); err != nil {
		t.Fatal(err)
	}
	if n := len(logs.of(loud)); n != 1 {
		t.Errorf("default logger got %d records of the worker without WithLogger, want 1: %v", n, logs.of(loud))
	}
	if r := logs.of(quiet); len(r) != 0 {
		t.Errorf("WithLogger(nil) logged %v", r)
	}
}
