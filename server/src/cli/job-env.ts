/**
 * The environment variables `casq work` gives each job's command: the job's
 * metadata as CASQ_* variables, and the producer's trace context as
 * TRACEPARENT / TRACESTATE so that a traced command continues the trace.
 */
import type { Job } from "@casq/sdk";

/** The variables for one job; `workerId` is the worker's identity in leases. */
export function jobEnvironment(job: Job, workerId: string): Record<string, string> {
  const env: Record<string, string> = {
    CASQ_QUEUE: job.queue,
    CASQ_SUBSCRIPTION: job.subscription,
    CASQ_MESSAGE_ID: job.id,
    CASQ_RECEIPT: job.receipt,
    CASQ_ATTEMPT: String(job.attempt),
    CASQ_MAX_ATTEMPTS: String(job.maxAttempts),
    CASQ_SHARD: String(job.shard),
    CASQ_OFFSET: String(job.offset),
    CASQ_KEY: job.key,
    CASQ_PRIORITY: String(job.priority),
    CASQ_DEDUP_ID: job.dedupId,
    CASQ_HEADERS: JSON.stringify(job.headers),
    CASQ_ENQUEUED_AT: job.enqueuedAt?.toISOString() ?? "",
    CASQ_LEASE_DEADLINE: job.leaseDeadline?.toISOString() ?? "",
    CASQ_WORKER_ID: workerId,
  };
  if (job.traceContext !== undefined) {
    env.TRACEPARENT = job.traceContext.traceparent;
    if (job.traceContext.tracestate !== "") env.TRACESTATE = job.traceContext.tracestate;
  }
  return env;
}
