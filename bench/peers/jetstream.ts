/**
 * NATS JetStream: a work-queue stream with file storage and explicit acks.
 * An acknowledged publish is in the server's file but not yet fsync'd (the
 * server syncs every 2 minutes by default), so a machine failure can lose it.
 * A batch is 100 publishes in flight at once (JetStream has no batch publish).
 */
import { AckPolicy, jetstream, jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import type { BenchQueue, QueueSystem } from "../lib/queue-system.ts";
import { type PeerServer, startNats } from "./servers.ts";

/** NATS JetStream under test. */
export class JetStreamSystem implements QueueSystem {
  readonly name = "jetstream";
  readonly durability = "file storage, fsync every 2 min (default)";
  private server: PeerServer | undefined;
  private nc: NatsConnection | undefined;
  private queues = 0;

  async start(): Promise<void> {
    this.server = await startNats();
    this.nc = await connect({ servers: `127.0.0.1:${this.server.port}` });
  }

  async stop(): Promise<void> {
    await this.nc?.close();
    await this.server?.stop();
  }

  serverPids(): number[] {
    return this.server ? [this.server.pid] : [];
  }

  async newQueue(): Promise<BenchQueue> {
    const nc = this.nc as NatsConnection;
    const name = `bench-${++this.queues}`;
    const jsm = await jetstreamManager(nc);
    await jsm.streams.add({
      name,
      subjects: [name],
      retention: RetentionPolicy.Workqueue,
      storage: StorageType.File,
    });
    await jsm.consumers.add(name, { durable_name: "workers", ack_policy: AckPolicy.Explicit });
    const js = jetstream(nc);
    return {
      enqueue: async (payload) => {
        await js.publish(name, payload);
      },
      enqueueBatch: async (payloads) => {
        await Promise.all(payloads.map((payload) => js.publish(name, payload)));
      },
      work: async (concurrency, onJob) => {
        const consumer = await js.consumers.get(name, "workers");
        const messages = await consumer.consume({ max_messages: concurrency });
        const done = (async () => {
          for await (const m of messages) {
            onJob(Buffer.from(m.data));
            m.ack();
          }
        })();
        return {
          stop: async () => {
            await messages.close();
            await done;
          },
        };
      },
      close: async () => {
        await jsm.streams.delete(name);
      },
    };
  }
}
