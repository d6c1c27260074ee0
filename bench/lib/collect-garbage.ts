/**
 * Forces full garbage collections in another Node process (a server under
 * test started with `--inspect=127.0.0.1:PORT`) through the inspector
 * protocol (`HeapProfiler.collectGarbage`), so that its memory can be read at
 * a GC-settled point rather than whenever V8 got round to collecting.
 *
 * Node 20 has a WebSocket client only behind `--experimental-websocket`, so
 * the protocol is spoken by a short child process with that flag.
 */
import { execFile } from "node:child_process";
import { createServer } from "node:net";
import { promisify } from "node:util";

/** A free loopback TCP port (for `--inspect=127.0.0.1:PORT`). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  if (address === null || typeof address === "string") throw new Error("no port");
  return address.port;
}

const CLIENT = `
const port = process.argv[1];
const [target] = await (await fetch("http://127.0.0.1:" + port + "/json/list")).json();
const ws = new WebSocket(target.webSocketDebuggerUrl);
await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
let id = 0;
const waiting = new Map();
ws.onmessage = (event) => {
  const message = JSON.parse(event.data);
  waiting.get(message.id)?.(message);
};
const call = (method) => new Promise((resolve) => {
  id += 1;
  waiting.set(id, resolve);
  ws.send(JSON.stringify({ id, method }));
});
await call("HeapProfiler.enable");
await call("HeapProfiler.collectGarbage");
await call("HeapProfiler.collectGarbage");
await call("HeapProfiler.disable");
ws.close();
`;

/** Runs two full collections in the process whose inspector listens on `port`. */
export async function collectGarbage(port: number): Promise<void> {
  await promisify(execFile)(
    process.execPath,
    ["--experimental-websocket", "--no-warnings", "--input-type=module", "-e", CLIENT, String(port)],
    { timeout: 60_000 },
  );
}
