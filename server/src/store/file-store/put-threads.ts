/**
 * The file store's put threads: a few `worker_threads` Workers, shared by
 * every file store of the process, each running one put at a time as
 * synchronous file calls (sync-put.ts, put-thread.ts). A put then costs the
 * event loop a copy of its body into the thread's scratch buffer, one message
 * out and one back, instead of about fifteen trips through libuv's thread
 * pool.
 *
 * - Threads start on demand, up to {@link MAX_PUT_THREADS}: a put goes to an
 *   idle thread, or waits in one queue for the first that is free. Threads
 *   are unref'd while idle, so they never keep a process alive, and all but
 *   the first end after {@link SPARE_IDLE_MS} without work: each holds a V8
 *   heap and a scratch buffer as big as the largest body it wrote (a few MiB
 *   of the broker's memory), and one thread keeps up with a busy shard; the
 *   second takes a segment's put while the first writes the head.
 * - A thread is sent nothing before it says it is ready. One that fails
 *   before that makes every put answer `undefined` from then on (the store
 *   then takes its asynchronous path). A thread that dies with a put in
 *   flight makes that put's outcome unknown: it rejects with
 *   {@link PutThreadLost}, and the store removes what the put may have left
 *   (its lock marker, staging directory and temp file, all named by it).
 * - An abort removes a queued put (answered `aborted`); for a running one it
 *   writes the put's id into the thread's control word, which the put reads
 *   before taking the lock and before its commit point.
 *
 * In a checkout the module is TypeScript run through tsx, so the threads
 * load tsx too; an installed build's threads run plain JavaScript.
 */
import { rm, rmdir } from "node:fs/promises";
import path from "node:path";
import { Worker } from "node:worker_threads";
import { newOwnerName } from "./owner-liveness.ts";
import type { PutThreadAnswer, PutThreadData, PutThreadJob, PutThreadReady } from "./put-thread.ts";
import type { StageNames, SyncPutOutcome, SyncPutRequest } from "./sync-put.ts";

/** Most put threads per process. */
export const MAX_PUT_THREADS = 2;
/** A thread beyond the first ends after this long without a put. */
export const SPARE_IDLE_MS = 5_000;

/** Scratch buffers grow in steps of this many bytes. */
const SCRATCH_STEP = 256 * 1024;

/** A put thread died with a put in flight: whether that put committed is unknown. */
export class PutThreadLost extends Error {
  override readonly name = "PutThreadLost";
}

interface QueuedPut {
  readonly id: number;
  readonly request: SyncPutRequest;
  /** The request as sent to its thread (with the thread's staged-ahead lock). */
  sent?: SyncPutRequest;
  readonly body: Uint8Array;
  readonly signal: AbortSignal | undefined;
  readonly resolve: (outcome: SyncPutOutcome | undefined) => void;
  readonly reject: (error: unknown) => void;
  onAbort?: () => void;
}

class PutThread {
  readonly worker: Worker;
  readonly control: Int32Array;
  ready = false;
  current: QueuedPut | undefined;
  /**
   * The put this thread answered last: it releases that put's lock after
   * answering, so until its next answer the lock may still be held (and a
   * thread that dies meanwhile leaves it behind).
   */
  answered: SyncPutRequest | undefined;
  /** When it answered last (performance.now()). */
  answeredAt = Number.NEGATIVE_INFINITY;
  /** The lock it was asked to stage after its last put, for its next one (it may have failed to). */
  staged: StageNames | undefined;
  scratch: SharedArrayBuffer | undefined;
  /** Ends this spare thread when it has been idle long enough (see {@link SPARE_IDLE_MS}). */
  retire: NodeJS.Timeout | undefined;

  /** A thread running `script` (a module's code, for tests) or else the put-thread module. */
  constructor(script: string | undefined, recycleWithinMs: number | undefined) {
    const control = new SharedArrayBuffer(4);
    this.control = new Int32Array(control);
    const workerData: PutThreadData = { casqPutThread: true, control, recycleWithinMs };
    const { entry, evaluate } = script === undefined ? threadEntry() : { entry: script, evaluate: true };
    this.worker = new Worker(entry, {
      eval: evaluate,
      workerData,
      execArgv: [],
      // The thread holds a few small objects; its scratch buffer is shared memory.
      resourceLimits: { maxYoungGenerationSizeMb: 1, maxOldGenerationSizeMb: 16 },
      stdout: false,
      stderr: false,
    });
    this.worker.unref();
  }
}

/** What a put thread runs: the built module, or in a checkout a script that loads the TypeScript one through tsx. */
function threadEntry(): { entry: URL | string; evaluate: boolean } {
  const self = import.meta.url;
  if (!self.endsWith(".ts")) return { entry: new URL("./put-thread.js", self), evaluate: false };
  // Node 20 gives a worker neither the parent's loader hooks nor those of an `--import` in its execArgv.
  const tsx = JSON.stringify(import.meta.resolve("tsx/esm/api"));
  const module = JSON.stringify(new URL("./put-thread.ts", self).href);
  return {
    entry: `import(${tsx}).then((tsx) => { tsx.register(); return import(${module}); });`,
    evaluate: true,
  };
}

/** The process's put threads (see the module header). */
export class PutThreads {
  private readonly threads: PutThread[] = [];
  private readonly queue: QueuedPut[] = [];
  private nextId = 1;
  /** A thread could not start: every put takes the store's asynchronous path. */
  private broken = false;
  /** Threads started and puts answered so far (for tests and diagnostics). */
  readonly counts = { started: 0, answered: 0 };

  private readonly maxThreads: number;
  private readonly spareIdleMs: number;
  private readonly script: string | undefined;
  private readonly recycleWithinMs: number | undefined;

  /**
   * A pool of up to `maxThreads`. Tests only: `script` replaces the threads'
   * code (a thread that misbehaves), `recycleWithinMs` how long a lock may be
   * held and still be handed on whole (`RECYCLE_WITHIN_MS` in sync-put.ts).
   */
  constructor(
    options: { maxThreads?: number; spareIdleMs?: number; script?: string; recycleWithinMs?: number } = {},
  ) {
    this.maxThreads = options.maxThreads ?? MAX_PUT_THREADS;
    this.spareIdleMs = options.spareIdleMs ?? SPARE_IDLE_MS;
    this.script = options.script;
    this.recycleWithinMs = options.recycleWithinMs;
  }

  /** Threads running now. */
  get threadCount(): number {
    return this.threads.length;
  }

  /**
   * Runs one put on a thread. Resolves with its outcome, or `undefined` when
   * no thread can run it (nothing was done; use the asynchronous path).
   * Rejects with {@link PutThreadLost} when its thread died while running it.
   */
  run(request: SyncPutRequest, body: Uint8Array, signal?: AbortSignal): Promise<SyncPutOutcome | undefined> {
    if (this.broken) return Promise.resolve(undefined);
    if (signal?.aborted) return Promise.resolve({ kind: "aborted" });
    return new Promise((resolve, reject) => {
      const put: QueuedPut = { id: this.nextId++, request, body, signal, resolve, reject };
      if (signal !== undefined) {
        put.onAbort = () => this.abort(put);
        signal.addEventListener("abort", put.onAbort, { once: true });
      }
      this.queue.push(put);
      this.dispatch();
    });
  }

  private abort(put: QueuedPut): void {
    const at = this.queue.indexOf(put);
    if (at >= 0) {
      this.queue.splice(at, 1);
      settle(put, { kind: "aborted" });
      return;
    }
    for (const thread of this.threads) if (thread.current === put) Atomics.store(thread.control, 0, put.id);
  }

  /** Sends queued puts to idle threads that said they are ready; starts a thread when none is idle or starting. */
  private dispatch(): void {
    while (this.queue.length > 0) {
      const thread = this.idleThreadFor((this.queue[0] as QueuedPut).request);
      if (thread === undefined) {
        // A starting thread takes the queue's next put once it is ready.
        if (this.threads.length < this.maxThreads && !this.threads.some((t) => !t.ready)) this.start();
        return;
      }
      this.send(thread, this.queue.shift() as QueuedPut);
    }
  }

  /**
   * The idle thread to run `request`: the one that last wrote its key (it
   * releases that lock before it reads the next job, so the put never finds
   * its own process's lock), else the one idle longest (the least likely to
   * still be releasing a lock).
   */
  private idleThreadFor(request: SyncPutRequest): PutThread | undefined {
    let best: PutThread | undefined;
    for (const t of this.threads) {
      if (!t.ready || t.current !== undefined) continue;
      if (t.answered?.lockDir === request.lockDir) return t;
      if (best === undefined || t.answeredAt < best.answeredAt) best = t;
    }
    return best;
  }

  private send(thread: PutThread, put: QueuedPut): void {
    const request = withStagedLock(thread, put.request);
    put.sent = request;
    const length = put.body.byteLength;
    let fresh: SharedArrayBuffer | undefined;
    if (thread.scratch === undefined || thread.scratch.byteLength < length) {
      fresh = new SharedArrayBuffer(Math.max(SCRATCH_STEP, Math.ceil(length / SCRATCH_STEP) * SCRATCH_STEP));
      thread.scratch = fresh;
    }
    new Uint8Array(thread.scratch, 0, length).set(put.body);
    thread.current = put;
    clearTimeout(thread.retire);
    thread.retire = undefined;
    Atomics.store(thread.control, 0, 0);
    const job: PutThreadJob = fresh
      ? { id: put.id, request, length, scratch: fresh }
      : { id: put.id, request, length };
    thread.worker.ref();
    thread.worker.postMessage(job);
  }

  private start(): void {
    let thread: PutThread;
    try {
      thread = new PutThread(this.script, this.recycleWithinMs);
    } catch {
      this.fail();
      return;
    }
    this.threads.push(thread);
    this.counts.started += 1;
    thread.worker.on("message", (message: PutThreadAnswer | PutThreadReady) => {
      if ("ready" in message) {
        thread.ready = true;
        this.dispatch();
        this.retireIfIdle(thread);
        return;
      }
      const put = thread.current;
      if (put === undefined || put.id !== message.id) return;
      thread.current = undefined;
      thread.answered = put.sent;
      thread.answeredAt = performance.now();
      this.counts.answered += 1;
      if ("error" in message) settle(put, new PutThreadLost(`a put thread failed: ${message.error}`));
      else settle(put, message.outcome);
      if (this.queue.length === 0) thread.worker.unref();
      this.dispatch();
      this.retireIfIdle(thread);
    });
    const ended = (error?: unknown) => {
      const at = this.threads.indexOf(thread);
      if (at < 0) return;
      this.threads.splice(at, 1);
      const put = thread.current;
      thread.current = undefined;
      // The lock of the put it answered last may not be released yet, and it may have staged one.
      if (thread.answered !== undefined) void removeLeftovers(thread.answered);
      removeStaged(thread);
      if (!thread.ready) {
        // It could not start (it is sent nothing before it is ready): puts take the asynchronous path.
        this.fail();
        return;
      }
      if (put) {
        // What it may have left under the names it was sent (the store removes those it chose).
        const lost = new PutThreadLost("a put thread exited while it ran a put", { cause: error });
        void removeLeftovers(put.sent ?? put.request).finally(() => settle(put, lost));
      }
      this.dispatch();
    };
    thread.worker.on("error", ended);
    thread.worker.on("exit", () => ended());
  }

  /** Arms the retirement of a spare thread (not the first) that has nothing to do. */
  private retireIfIdle(thread: PutThread): void {
    if (thread.current !== undefined || this.threads.indexOf(thread) <= 0) return;
    clearTimeout(thread.retire);
    thread.retire = setTimeout(() => this.retire(thread), this.spareIdleMs);
    thread.retire.unref();
  }

  /** Ends an idle spare thread; out of the pool first, so that no put is sent to it meanwhile. */
  private retire(thread: PutThread): void {
    const at = this.threads.indexOf(thread);
    if (at < 0 || thread.current !== undefined) return;
    this.threads.splice(at, 1);
    void thread.worker.terminate().finally(() => removeStaged(thread));
  }

  private fail(): void {
    this.broken = true;
    for (const put of this.queue.splice(0)) settle(put, undefined);
  }
}

/**
 * Removes, by their exact names, the temp file, staging directory and lock
 * marker (with the lock directory, if then empty) a put thread's `request`
 * may have left when the thread stopped mid-sequence or before it released
 * the lock of a put it answered. Never throws.
 */
export async function removeLeftovers(request: SyncPutRequest): Promise<void> {
  await rm(request.temp, { force: true }).catch(() => {});
  await rm(request.stagedDir, { recursive: true, force: true }).catch(() => {});
  await rm(path.join(request.lockDir, request.marker), { force: true }).catch(() => {});
  await rmdir(request.lockDir).catch(() => {});
}

/**
 * `request` as `thread` should run it, when it lets the thread stage ahead:
 * with the lock the thread was asked to stage after its last put, if that
 * was under the same staging directory (the same store), and the names of
 * the one to stage after this put.
 */
function withStagedLock(thread: PutThread, request: SyncPutRequest): SyncPutRequest {
  if (request.stageAhead !== true) {
    thread.staged = undefined; // the thread removes the one it has, if any
    return request;
  }
  const root = path.dirname(request.stagedDir);
  const ready = thread.staged;
  const owner = newOwnerName();
  const next: StageNames = {
    stagedDir: path.join(root, owner),
    marker: owner,
    markerText: request.markerText,
  };
  thread.staged = next;
  if (ready === undefined || path.dirname(ready.stagedDir) !== root) return { ...request, stageNext: next };
  return { ...request, ...ready, stageNext: next };
}

/** Removes what a thread that ended may have staged ahead. */
function removeStaged(thread: PutThread): void {
  const staged = thread.staged;
  thread.staged = undefined;
  if (staged !== undefined) void rm(staged.stagedDir, { recursive: true, force: true }).catch(() => {});
}

/** Answers a put: its outcome, `undefined` (take the asynchronous path) or an error; stops listening to its signal. */
function settle(put: QueuedPut, answer: SyncPutOutcome | undefined | PutThreadLost): void {
  if (put.onAbort) put.signal?.removeEventListener("abort", put.onAbort);
  if (answer instanceof PutThreadLost) put.reject(answer);
  else put.resolve(answer);
}

/** The put threads every file store of this process shares. */
export const putThreads = new PutThreads();
