/**
 * BullMQ on Redis (AOF `everysec`: an acknowledged job can be lost if the
 * machine fails within about a second). Completed jobs are removed, as casq
 * removes settled messages.
 */
import { Queue, Worker } from "bullmq";
import { Redis } from "ioredis";
import type { BenchQueue, QueueSystem } from "../lib/queue-system.ts";
import { type PeerServer, startRedis } from "./servers.ts";

/** BullMQ under test. */
export class BullmqSystem implements QueueSystem {
  readonly name = "bullmq";
  readonly durability = "Redis AOF fsync every second";
  private server: PeerServer | undefined;
  private queues = 0;

  async start(): Promise<void> {
    this.server = await startRedis();
  }

  async stop(): Promise<void> {
    await this.server?.stop();
  }

  serverPids(): number[] {
    return this.server ? [this.server.pid] : [];
  }

  async newQueue(): Promise<BenchQueue> {
    const port = this.server?.port as number;
    // BullMQ in native ESM takes constructed clients; workers need maxRetriesPerRequest null.
    const connect = () => new Redis({ host: "127.0.0.1", port, maxRetriesPerRequest: null });
    const queueConnection = connect();
    const name = `bench-${++this.queues}`;
    const queue = new Queue(name, {
      connection: queueConnection,
      defaultJobOptions: { removeOnComplete: true, removeOnFail: 1000 },
    });
    await queue.waitUntilReady();
    const data = (payload: Buffer) => ({ p: payload.toString("base64") });
    return {
      enqueue: async (payload) => {
        await queue.add("job", data(payload));
      },
      enqueueBatch: async (payloads) => {
        await queue.addBulk(payloads.map((payload) => ({ name: "job", data: data(payload) })));
      },
      work: async (concurrency, onJob) => {
        const workerConnection = connect();
        const worker = new Worker(
          name,
          async (job) => {
            onJob(Buffer.from(job.data.p, "base64"));
          },
          { connection: workerConnection, concurrency },
        );
        await worker.waitUntilReady();
        return {
          stop: async () => {
            await worker.close();
            workerConnection.disconnect();
          },
        };
      },
      close: async () => {
        await queue.obliterate({ force: true });
        await queue.close();
        queueConnection.disconnect();
      },
    };
  }
}
