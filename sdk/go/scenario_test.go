package casq_test

// The language-neutral SDK scenarios of test/scenarios (see its README for
// the spec this runner follows): each scenario gets its own brokers on a
// fresh file store, one client over all of them, a fresh queue, and steps.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	casq "github.com/casq/casq/sdk/go"
	casqv1 "github.com/casq/casq/sdk/go/gen/casq/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
)

// crashWorkerEnv makes TestMain run crashWorkerMain instead of the tests: the
// child process of the crashWorker step. Its value is a JSON crashWorkerArgs.
const crashWorkerEnv = "CASQ_SCENARIO_CRASH_WORKER"

type crashWorkerArgs struct {
	Brokers      []string `json:"brokers"`
	Queue        string   `json:"queue"`
	Subscription string   `json:"subscription"`
	Jobs         int      `json:"jobs"`
}

// crashWorkerMain runs a worker whose handlers print "STARTED <payload>" and
// never return; the parent SIGKILLs the process.
func crashWorkerMain(spec string) int {
	var args crashWorkerArgs
	if err := json.Unmarshal([]byte(spec), &args); err != nil {
		fmt.Fprintln(os.Stderr, "crash worker:", err)
		return 2
	}
	ctx := context.Background()
	client, err := casq.Dial(ctx, scenarioClientOptions(args.Brokers))
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash worker:", err)
		return 1
	}
	var out sync.Mutex
	err = client.Worker().Run(ctx, args.Queue, func(ctx context.Context, job *casq.Job) error {
		out.Lock()
		fmt.Fprintf(os.Stdout, "STARTED %s\n", job.Payload)
		out.Unlock()
		select {} // until SIGKILL
	}, casq.WithSubscription(args.Subscription), casq.WithConcurrency(args.Jobs), casq.WithPrefetch(args.Jobs),
		casq.WithErrorHandler(func(err error, _ *casq.Job) { fmt.Fprintln(os.Stderr, "crash worker:", err) }))
	fmt.Fprintln(os.Stderr, "crash worker: Run returned:", err)
	return 1
}

// scenarioClientOptions are the SDK's defaults: their retry budget (a unary
// call keeps retrying for 30 s) must ride out a killed leader on its own.
func scenarioClientOptions(brokers []string) casq.Options {
	return casq.Options{Brokers: brokers}
}

// --- the runner ---

func TestScenarios(t *testing.T) {
	for _, f := range scenarioFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) { runScenarioFile(t, repoRoot(), f) })
	}
}

func runScenarioFile(t *testing.T, root, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc, steps, err := parseScenario(data, filepath.Base(path))
	if err != nil {
		t.Fatal(err)
	}

	r := &scenarioRun{t: t, sc: sc, root: root, dedup: map[string]string{}, workers: map[string]*scenarioWorker{}, graces: map[string]time.Duration{}}
	for _, s := range steps {
		if stop, ok := s.value.(*stopWorkerStep); ok {
			r.graces[stop.Name] = millis(stop.TimeoutMs)
		}
	}
	r.startBrokers()
	r.setup()
	for i, s := range steps {
		if err := s.run(context.Background(), r); err != nil {
			t.Fatalf("scenario %s: step %d (%s): %v", sc.Name, i, s.do, err)
		}
	}
}

type broker struct {
	addr   string
	cmd    *exec.Cmd
	log    *lockedLines
	killed bool
	frozen bool // SIGSTOPped and not thawed yet
}

type scenarioRun struct {
	t       *testing.T
	sc      *scenarioFile
	root    string
	dir     string
	brokers []*broker
	client  *casq.Client
	queue   string
	dedup   map[string]string // dedupId -> message id
	workers map[string]*scenarioWorker
	graces  map[string]time.Duration // worker name -> shutdown grace of its stopWorker
}

// lockedLines keeps the last lines a broker printed, for failure messages.
type lockedLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *lockedLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	if len(l.lines) > 50 {
		l.lines = l.lines[1:]
	}
}

func (l *lockedLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (r *scenarioRun) startBrokers() {
	t := r.t
	n := r.sc.Brokers
	r.dir = t.TempDir() // removed after the brokers are killed (cleanups run last-in first-out)
	t.Cleanup(func() {
		for _, b := range r.brokers {
			if b.frozen {
				_ = b.cmd.Process.Signal(syscall.SIGCONT)
			}
			_ = b.cmd.Process.Signal(syscall.SIGKILL)
			_ = b.cmd.Wait()
			if t.Failed() {
				t.Logf("broker %s output:\n%s", b.addr, b.log)
			}
		}
	})
	for i := range n {
		b, err := startBroker(r.root, "file:"+r.dir, "127.0.0.1:0", &lockedLines{}, scenarioBrokerArgs...)
		if b != nil {
			r.brokers = append(r.brokers, b)
		}
		if err != nil {
			t.Fatalf("scenario %s: broker %d: %v", r.sc.Name, i, err)
		}
	}
}

// scenarioBrokerArgs are the spec's flags for every scenario broker.
var scenarioBrokerArgs = []string{"--leader-lease", "2s"}

// startBroker starts `casq serve --store store --listen listen` (plus args)
// and waits for its address; its output goes to log.
func startBroker(root, store, listen string, log *lockedLines, args ...string) (*broker, error) {
	cmd := exec.Command("node", append([]string{filepath.Join(root, "server", "bin", "casq.js"), "serve",
		"--store", store, "--listen", listen, "--log-level", "warn"}, args...)...)
	cmd.Dir = root
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &broker{cmd: cmd, log: log}
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (\S+)`)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			b.log.add(line)
			if m := re.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		close(found)
	}()
	select {
	case addr, ok := <-found:
		if !ok {
			return b, fmt.Errorf("exited before printing its address:\n%s", b.log)
		}
		b.addr = addr
		return b, nil
	case <-time.After(30 * time.Second):
		return b, fmt.Errorf("did not print its address within 30 s:\n%s", b.log)
	}
}

func (r *scenarioRun) setup() {
	t := r.t
	var addrs []string
	for _, b := range r.brokers {
		addrs = append(addrs, b.addr)
	}
	c, err := casq.Dial(context.Background(), scenarioClientOptions(addrs))
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	t.Cleanup(func() {
		// Workers left running by a failed scenario: stop them quickly.
		for _, w := range r.workers {
			w.cancel()
		}
		for _, w := range r.workers {
			select {
			case <-w.done:
			case <-time.After(15 * time.Second):
			}
		}
		_ = c.Close()
	})

	name := strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(r.sc.Name), "-"), "-")
	suffix := strconv.FormatUint(rand.Uint64(), 36)
	r.queue = fmt.Sprintf("go-%.*s-%s", 100-len("go--")-len(suffix), name, suffix)

	q := r.sc.Queue
	backoff := durationpb.New(millis(q.BackoffMs))
	cfg := &casqv1.QueueConfig{
		LeaseTtl:    durationpb.New(millis(q.LeaseTTLMs)),
		MaxAttempts: q.MaxAttempts,
		Backoff: &casqv1.BackoffPolicy{
			InitialDelay: backoff, MaxDelay: proto.Clone(backoff).(*durationpb.Duration),
			Multiplier: proto.Float64(1), Jitter: proto.Float64(0),
		},
	}
	ctx := context.Background()
	if _, err := c.Admin().CreateQueue(ctx, r.queue, q.Shards, cfg); err != nil {
		t.Fatalf("scenario %s: create queue %s: %v", r.sc.Name, r.queue, err)
	}
	for _, s := range r.sc.Subscriptions {
		if s == "default" {
			continue
		}
		if _, err := c.Admin().CreateSubscription(ctx, r.queue, s, casqv1.SubscriptionStart_SUBSCRIPTION_START_EARLIEST); err != nil {
			t.Fatalf("scenario %s: create subscription %s: %v", r.sc.Name, s, err)
		}
	}
}

func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// poll calls cond every interval until it returns true or d passes.
func poll(d, interval time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(interval)
	}
}

func (r *scenarioRun) deadLetters(ctx context.Context, s *deadLettersStep) error {
	dls, err := r.client.Admin().ListDeadLetters(ctx, r.queue, s.Subscription)
	if err != nil {
		return err
	}
	var got []string
	for _, d := range dls {
		got = append(got, string(d.GetMessage().GetPayload()))
	}
	if !sameMultiset(got, s.Expect) {
		return fmt.Errorf("dead letters %q, want %q (any order)", got, s.Expect)
	}
	return nil
}

func (r *scenarioRun) redrive(ctx context.Context, s *redriveStep) error {
	n, err := r.client.Admin().Redrive(ctx, r.queue, s.Subscription)
	if err != nil {
		return err
	}
	if n != s.Expect {
		return fmt.Errorf("redriven %d, want %d", n, s.Expect)
	}
	return nil
}

func (r *scenarioRun) enqueue(ctx context.Context, s *enqueueStep) error {
	msgs := make([]casq.Message, len(s.Messages))
	for i, m := range s.Messages {
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
	producer := r.client.Producer()
	if s.Via != nil {
		b, err := r.liveBroker(*s.Via)
		if err != nil {
			return fmt.Errorf("via: %w", err)
		}
		// A client that knows only this broker, so that it (not whichever
		// broker the scenario's client prefers) takes over free shards.
		c, err := casq.Dial(ctx, scenarioClientOptions([]string{b.addr}))
		if err != nil {
			return err
		}
		defer c.Close()
		producer = c.Producer()
	}
	var results []casq.EnqueueResult
	if s.Batch {
		res, err := producer.EnqueueBatch(ctx, r.queue, msgs)
		if err != nil {
			return fmt.Errorf("batch enqueue: %w", err)
		}
		results = res
	} else {
		for i, m := range msgs {
			res, err := producer.Enqueue(ctx, r.queue, m.Payload, m.Options...)
			if err != nil {
				return fmt.Errorf("enqueue of message %d: %w", i, err)
			}
			results = append(results, res)
		}
	}
	if len(results) != len(s.Messages) {
		return fmt.Errorf("%d results for %d messages", len(results), len(s.Messages))
	}
	for i, res := range results {
		if res.ID == "" {
			return fmt.Errorf("result %d has no id", i)
		}
		if s.ExpectDuplicate != nil && res.Duplicate != s.ExpectDuplicate[i] {
			return fmt.Errorf("result %d: duplicate %v, want %v", i, res.Duplicate, s.ExpectDuplicate[i])
		}
		dedupID := s.Messages[i].DedupID
		switch {
		case res.Duplicate && dedupID == "":
			return fmt.Errorf("result %d: duplicate without a dedup id", i)
		case res.Duplicate:
			if want, ok := r.dedup[dedupID]; !ok || want != res.ID {
				return fmt.Errorf("result %d: duplicate of %q has id %q, want %q", i, dedupID, res.ID, want)
			}
		case dedupID != "":
			r.dedup[dedupID] = res.ID
		}
	}
	return nil
}

func (r *scenarioRun) produce(ctx context.Context, s *produceStep) error {
	for i := range s.Count {
		payload := fmt.Sprintf("%s%d", s.Prefix, i)
		res, err := r.client.Producer().Enqueue(ctx, r.queue, []byte(payload), casq.WithDedupID(payload))
		if err != nil {
			return fmt.Errorf("enqueue of %s: %w", payload, err)
		}
		if res.ID == "" {
			return fmt.Errorf("enqueue of %s: no id", payload)
		}
		if s.KillLeaderAfter > 0 && i+1 == s.KillLeaderAfter {
			if err := r.killLeader(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// liveBroker returns broker i (in start order), which must not have been
// killed.
func (r *scenarioRun) liveBroker(i int) (*broker, error) {
	if i < 0 || i >= len(r.brokers) {
		return nil, fmt.Errorf("no broker %d (the scenario has %d)", i, len(r.brokers))
	}
	b := r.brokers[i]
	if b.killed {
		return nil, fmt.Errorf("broker %d (%s) was killed", i, b.addr)
	}
	return b, nil
}

// restartBroker stops broker i gracefully and starts it again on the same
// address and store, so that clients configured with that address reach it.
func (r *scenarioRun) restartBroker(_ context.Context, s *brokerStep) error {
	b, err := r.liveBroker(s.Broker)
	if err != nil {
		return err
	}
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			// Not restarted: later steps must not count on it.
			b.killed = true
			return fmt.Errorf("broker %d (%s) did not exit with status 0 on SIGTERM: %v\n%s", s.Broker, b.addr, err, b.log)
		}
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		b.killed = true
		return fmt.Errorf("broker %d (%s) did not exit within 30 s of SIGTERM:\n%s", s.Broker, b.addr, b.log)
	}
	b.log.add("--- restarted ---")
	nb, err := startBroker(r.root, "file:"+r.dir, b.addr, b.log, scenarioBrokerArgs...)
	if nb != nil {
		b.cmd = nb.cmd
	}
	if err != nil {
		b.killed = true // later steps must not count on it
		return fmt.Errorf("restart of broker %d on %s: %w", s.Broker, b.addr, err)
	}
	if nb.addr != b.addr {
		return fmt.Errorf("broker %d restarted on %s, not on its old address %s", s.Broker, nb.addr, b.addr)
	}
	return nil
}

// freezeBroker sends broker i SIGSTOP (freezeBroker) or SIGCONT
// (thawBroker): a frozen process keeps its connections open and answers
// nothing.
func (r *scenarioRun) freezeBroker(_ context.Context, s *brokerStep) error {
	b, err := r.liveBroker(s.Broker)
	if err != nil {
		return err
	}
	freeze := s.Do == "freezeBroker"
	if b.frozen == freeze {
		return fmt.Errorf("broker %d is already %s", s.Broker, map[bool]string{true: "frozen", false: "thawed"}[freeze])
	}
	sig := syscall.SIGCONT
	if freeze {
		sig = syscall.SIGSTOP
	}
	if err := b.cmd.Process.Signal(sig); err != nil {
		return err
	}
	b.frozen = freeze
	return nil
}

// awaitLeaseLapse waits until no shard names broker i as its live leader,
// asking only brokers that are not frozen.
func (r *scenarioRun) awaitLeaseLapse(ctx context.Context, s *awaitLeaseLapseStep) error {
	addr := r.brokers[s.Broker].addr
	var others []string
	for _, b := range r.brokers {
		if !b.frozen && !b.killed {
			others = append(others, b.addr)
		}
	}
	if len(others) == 0 {
		return errors.New("every broker is frozen or killed: none to ask")
	}
	c, err := casq.Dial(ctx, casq.Options{Brokers: others, Timeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	last := "no answer yet"
	d := millis(s.TimeoutMs)
	if !poll(d, 100*time.Millisecond, func() bool {
		q, err := c.Admin().GetQueue(ctx, r.queue)
		if err != nil {
			last = err.Error()
			return false
		}
		now := time.Now()
		var held []uint32
		for _, sh := range q.GetShards() {
			l := sh.GetLeader()
			if l.GetAddress() == addr && l.GetLeaseUntil() != nil && l.GetLeaseUntil().AsTime().After(now) {
				held = append(held, sh.GetShard())
			}
		}
		last = fmt.Sprintf("shards still led by %s: %v", addr, held)
		return len(held) == 0
	}) {
		return fmt.Errorf("the leases of broker %d did not lapse within %v: %s", s.Broker, d, last)
	}
	return nil
}

// expectLeaders checks how many different brokers lead the queue's shards
// (shards without a live leader ignored).
func (r *scenarioRun) expectLeaders(ctx context.Context, s *expectLeadersStep) error {
	q, err := r.client.Admin().GetQueue(ctx, r.queue)
	if err != nil {
		return fmt.Errorf("get queue: %w", err)
	}
	now := time.Now()
	leaders := map[string]bool{}
	var shards []string
	for _, sh := range q.GetShards() {
		l := sh.GetLeader()
		live := l.GetAddress() != "" && l.GetLeaseUntil() != nil && l.GetLeaseUntil().AsTime().After(now)
		if live {
			leaders[l.GetAddress()] = true
		}
		shards = append(shards, fmt.Sprintf("shard %d: %q (live %v)", sh.GetShard(), l.GetAddress(), live))
	}
	if len(leaders) != s.Distinct {
		return fmt.Errorf("%d distinct live leaders, want %d (%s)", len(leaders), s.Distinct, strings.Join(shards, "; "))
	}
	return nil
}

func (r *scenarioRun) killLeader(ctx context.Context) error {
	q, err := r.client.Admin().GetQueue(ctx, r.queue)
	if err != nil {
		return fmt.Errorf("get queue for the leader: %w", err)
	}
	addr := q.GetShards()[0].GetLeader().GetAddress()
	for _, b := range r.brokers {
		if b.addr == addr && !b.killed {
			b.killed = true
			if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				return err
			}
			_ = b.cmd.Wait()
			return nil
		}
	}
	return fmt.Errorf("leader of shard 0 is %q, not a live broker of this scenario", addr)
}

// --- workers ---

type invocation struct {
	payload string
	attempt uint32
}

type scenarioWorker struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, once done is closed

	mu          sync.Mutex
	invocations []invocation
	completed   int
}

func (w *scenarioWorker) counts() (started, completed int, inv []invocation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.invocations), w.completed, slices.Clone(w.invocations)
}

var errScenarioNack = errors.New("scenario handler: nack")

func (r *scenarioRun) startWorker(_ context.Context, s *startWorkerStep) error {
	if _, ok := r.workers[s.Name]; ok {
		return fmt.Errorf("worker %q already started", s.Name)
	}
	var fail error
	switch s.Handler {
	case "ack":
	case "nack":
		fail = errScenarioNack
	case "deadLetter":
		fail = casq.DeadLetter(errors.New("scenario handler: dead letter"))
	default:
		return fmt.Errorf("unknown handler %q", s.Handler)
	}
	concurrency := s.Concurrency
	prefetch := s.Prefetch
	if prefetch == 0 {
		prefetch = concurrency
	}
	opts := []casq.WorkerOption{
		casq.WithSubscription(s.Subscription), casq.WithConcurrency(concurrency), casq.WithPrefetch(prefetch),
	}
	if s.LeaseTTLMs > 0 {
		opts = append(opts, casq.WithLeaseTTL(time.Duration(s.LeaseTTLMs)*time.Millisecond))
	}
	w := &scenarioWorker{done: make(chan struct{})}
	var ctx context.Context
	ctx, w.cancel = context.WithCancel(context.Background())
	handlerDur := time.Duration(s.HandlerMs) * time.Millisecond
	handler := func(hctx context.Context, job *casq.Job) error {
		w.mu.Lock()
		w.invocations = append(w.invocations, invocation{string(job.Payload), job.Attempt})
		w.mu.Unlock()
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
	r.workers[s.Name] = w
	// The grace period is the one of this worker's stopWorker step (known
	// up front, since Run takes it as an option).
	opts = append(opts, casq.WithShutdownTimeout(r.graces[s.Name]))
	go func() {
		defer close(w.done)
		w.err = r.client.Worker().Run(ctx, r.queue, handler, opts...)
	}()
	return nil
}

func (r *scenarioRun) worker(name string) (*scenarioWorker, error) {
	w, ok := r.workers[name]
	if !ok {
		return nil, fmt.Errorf("no worker %q", name)
	}
	return w, nil
}

func (r *scenarioRun) awaitWorker(_ context.Context, s *awaitWorkerStep) error {
	w, err := r.worker(s.Name)
	if err != nil {
		return err
	}
	// The schema lets exactly one condition through.
	var cond func(started, completed, distinct int) bool
	var what string
	switch {
	case s.Started != nil:
		what = fmt.Sprintf("started >= %d", *s.Started)
		cond = func(st, _, _ int) bool { return st >= *s.Started }
	case s.Completed != nil:
		what = fmt.Sprintf("completed >= %d", *s.Completed)
		cond = func(_, c, _ int) bool { return c >= *s.Completed }
	default:
		what = fmt.Sprintf("distinct payloads >= %d", *s.DistinctPayloads)
		cond = func(_, _, d int) bool { return d >= *s.DistinctPayloads }
	}
	var started, completed int
	var inv []invocation
	var distinct map[string]bool
	var ended bool
	ok := poll(millis(s.TimeoutMs), 20*time.Millisecond, func() bool {
		select {
		case <-w.done:
			ended = true
		default:
		}
		started, completed, inv = w.counts()
		distinct = map[string]bool{}
		for _, i := range inv {
			distinct[i.payload] = true
		}
		return cond(started, completed, len(distinct)) || ended
	})
	payloads := make([]string, len(inv))
	attempts := make([]uint32, len(inv))
	for i, v := range inv {
		payloads[i], attempts[i] = v.payload, v.attempt
	}
	if !ok || (ended && !cond(started, completed, len(distinct))) {
		if ended {
			return fmt.Errorf("worker %q stopped (Run returned %v) before %s: started %d, completed %d", s.Name, w.err, what, started, completed)
		}
		return fmt.Errorf("timed out waiting for %s: started %d, completed %d, distinct payloads %d; invocations %q attempts %v",
			what, started, completed, len(distinct), payloads, attempts)
	}
	if s.Expect != nil {
		if len(payloads) < len(s.Expect) {
			return fmt.Errorf("only %d invocations %q, want %q first", len(payloads), payloads, s.Expect)
		}
		first := payloads[:len(s.Expect)]
		if s.Ordered && !slices.Equal(first, s.Expect) {
			return fmt.Errorf("first invocations %q, want %q in order (all: %q)", first, s.Expect, payloads)
		}
		if !s.Ordered && !sameMultiset(first, s.Expect) {
			return fmt.Errorf("first invocations %q, want %q in any order (all: %q)", first, s.Expect, payloads)
		}
	}
	if s.ExpectAttempts != nil {
		if len(attempts) < len(s.ExpectAttempts) || !slices.Equal(attempts[:len(s.ExpectAttempts)], s.ExpectAttempts) {
			return fmt.Errorf("attempts %v (payloads %q), want %v first", attempts, payloads, s.ExpectAttempts)
		}
	}
	if a := s.ExpectAllOf; a != nil {
		var missing []string
		for i := range a.Count {
			if p := fmt.Sprintf("%s%d", a.Prefix, i); !distinct[p] {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("payloads never seen: %q", missing)
		}
	}
	return nil
}

func (r *scenarioRun) stopWorker(_ context.Context, s *stopWorkerStep) error {
	w, err := r.worker(s.Name)
	if err != nil {
		return err
	}
	w.cancel()
	// Run waits up to the grace period for handlers, then settles and
	// half-closes; allow a margin for that beyond the grace period.
	limit := millis(s.TimeoutMs) + 30*time.Second
	select {
	case <-w.done:
	case <-time.After(limit):
		return fmt.Errorf("worker %q did not stop within %v", s.Name, limit)
	}
	if w.err != nil {
		return fmt.Errorf("worker %q run ended with %v", s.Name, w.err)
	}
	started, completed, _ := w.counts()
	if s.ExpectStarted != nil && started != *s.ExpectStarted {
		return fmt.Errorf("worker %q started %d handlers, want %d", s.Name, started, *s.ExpectStarted)
	}
	if s.ExpectCompleted != nil && completed != *s.ExpectCompleted {
		return fmt.Errorf("worker %q completed %d handlers, want %d", s.Name, completed, *s.ExpectCompleted)
	}
	return nil
}

// crashWorker re-executes this test binary as a worker process (see
// crashWorkerMain) and SIGKILLs it once its handlers have started.
func (r *scenarioRun) crashWorker(_ context.Context, s *crashWorkerStep) error {
	var addrs []string
	for _, b := range r.brokers {
		if !b.killed {
			addrs = append(addrs, b.addr)
		}
	}
	spec, err := json.Marshal(crashWorkerArgs{Brokers: addrs, Queue: r.queue, Subscription: s.Subscription, Jobs: s.Jobs})
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"="+string(spec))
	var stderr lockedLines
	cmd.Stderr = lineWriter(&stderr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	kill := func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	defer kill()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var seen []string
	deadline := time.After(millis(s.TimeoutMs))
	for len(seen) < s.Jobs {
		select {
		case line, ok := <-lines:
			if !ok {
				return fmt.Errorf("child exited after %d STARTED lines %q; its stderr:\n%s", len(seen), seen, &stderr)
			}
			payload, found := strings.CutPrefix(line, "STARTED ")
			if !found {
				return fmt.Errorf("unexpected child output %q", line)
			}
			seen = append(seen, payload)
		case <-deadline:
			return fmt.Errorf("timed out with %d STARTED lines %q; child stderr:\n%s", len(seen), seen, &stderr)
		}
	}
	kill()
	if !sameMultiset(seen, s.Expect) {
		return fmt.Errorf("crashed worker started %q, want %q (any order)", seen, s.Expect)
	}
	return nil
}

// lineWriter adapts lockedLines to an io.Writer.
func lineWriter(l *lockedLines) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			l.add(sc.Text())
		}
	}()
	return pw
}

func (r *scenarioRun) stats(ctx context.Context, s *statsStep) error {
	sub := s.Subscription
	var last string
	var lastErr error
	ok := poll(millis(s.TimeoutMs), 100*time.Millisecond, func() bool {
		q, err := r.client.Admin().GetQueue(ctx, r.queue)
		if err != nil {
			lastErr = err
			return false
		}
		lastErr = nil
		var st *casqv1.SubscriptionStats
		for _, x := range q.GetSubscriptions() {
			if x.GetSubscription() == sub {
				st = x
			}
		}
		if st == nil {
			last = fmt.Sprintf("no subscription %q", sub)
			return false
		}
		var diffs []string
		check := func(m protoreflect.Message, want map[string]uint64) {
			for _, name := range slices.Sorted(maps.Keys(want)) {
				got := m.Get(m.Descriptor().Fields().ByJSONName(name)).Uint()
				if got != want[name] {
					diffs = append(diffs, fmt.Sprintf("%s=%d (want %d)", name, got, want[name]))
				}
			}
		}
		check(st.ProtoReflect(), s.Expect)
		check(st.GetCounters().ProtoReflect(), s.Counters)
		last = strings.Join(diffs, ", ")
		return len(diffs) == 0
	})
	if !ok {
		if lastErr != nil {
			return fmt.Errorf("GetQueue: %w", lastErr)
		}
		return fmt.Errorf("subscription %s: %s", sub, last)
	}
	return nil
}

func sameMultiset(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
