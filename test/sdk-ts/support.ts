/** Helpers of the SDK tests: in-process casq servers and a way to wait for conditions. */
import { createServer } from "node:net";
import { pino } from "pino";
import {
  type CasqServerOptions,
  type RunningCasqServer,
  startCasqServer,
} from "../../server/src/service/casq-server.ts";

const servers: RunningCasqServer[] = [];

/** Starts a server on 127.0.0.1:0 (memory store unless told otherwise); closed by {@link closeServers}. */
export async function startServer(options: Partial<CasqServerOptions> = {}): Promise<RunningCasqServer> {
  const server = await startCasqServer({
    store: "memory:",
    listen: "127.0.0.1:0",
    logger: pino({ level: process.env.CASQ_TEST_LOG ?? "silent" }),
    ...options,
  });
  servers.push(server);
  return server;
}

/** Closes every server started by {@link startServer}. */
export async function closeServers(): Promise<void> {
  await Promise.all(servers.splice(0).map((s) => s.close({ graceful: false })));
}

/** A loopback address where nothing listens (a port bound, then released). */
export async function deadAddress(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no port");
  return `127.0.0.1:${address.port}`;
}

/** Waits until `check` is true (polling), or fails after `timeoutMs`. */
export async function eventually(check: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error("condition not met in time");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
