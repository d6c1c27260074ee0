/**
 * pg-boss 10 on PostgreSQL (fsync and synchronous commit on: an acknowledged
 * job is durable). pg-boss workers poll (every 0.5 s at the least) and fetch
 * in batches: the benchmark runs up to 10 `work()` loops whose batch sizes add
 * up to the concurrency, each handling its batch's jobs at once.
 */
import PgBoss from "pg-boss";
import type { BenchQueue, QueueSystem } from "../lib/queue-system.ts";
import { type PeerServer, startPostgres } from "./servers.ts";

/** pg-boss under test. */
export class PgBossSystem implements QueueSystem {
  readonly name = "pg-boss";
  readonly durability = "PostgreSQL fsync on every commit";
  private server: PeerServer | undefined;
  private boss: PgBoss | undefined;
  private queues = 0;

  async start(): Promise<void> {
    this.server = await startPostgres();
    this.boss = new PgBoss({
      connectionString: `postgres://bench@127.0.0.1:${this.server.port}/postgres`,
      max: 80,
    });
    this.boss.on("error", (error) => console.error("pg-boss:", error));
    await this.boss.start();
  }

  async stop(): Promise<void> {
    await this.boss?.stop({ graceful: false, wait: true });
    await this.server?.stop();
  }

  serverPids(): number[] {
    return this.server ? [this.server.pid] : [];
  }

  async newQueue(): Promise<BenchQueue> {
    const boss = this.boss as PgBoss;
    const name = `bench-${++this.queues}`;
    await boss.createQueue(name);
    const data = (payload: Buffer) => ({ p: payload.toString("base64") });
    return {
      enqueue: async (payload) => {
        await boss.send(name, data(payload));
      },
      enqueueBatch: async (payloads) => {
        await boss.insert(payloads.map((payload) => ({ name, data: data(payload) })));
      },
      work: async (concurrency, onJob) => {
        const loops = Math.min(10, concurrency);
        const ids: string[] = [];
        for (let i = 0; i < loops; i += 1) {
          const batchSize = Math.floor(concurrency / loops) + (i < concurrency % loops ? 1 : 0);
          ids.push(
            await boss.work<{ p: string }>(name, { batchSize, pollingIntervalSeconds: 0.5 }, async (jobs) => {
              for (const job of jobs) onJob(Buffer.from(job.data.p, "base64"));
            }),
          );
        }
        return {
          stop: async () => {
            for (const id of ids) await boss.offWork({ id });
          },
        };
      },
      // Queues are left in place: names are fresh per run and the whole server is thrown away after the run.
      close: async () => {},
    };
  }
}
