/**
 * Connections that never get to a request are closed, as a production HTTP
 * server closes them (issue 10, item 8): an HTTP/2 client that sends only
 * the connection preface, an HTTP/1.1 client that dribbles its headers, and
 * an idle connection with no request or stream in progress. A long-lived
 * stream (a Work stream with nothing to do) is never cut by these timeouts.
 */
import http2 from "node:http2";
import net from "node:net";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { WorkRequestSchema } from "@casq/api/casq/v1/work_pb.ts";
import { AsyncQueue } from "@casq/sdk/async-queue.ts";
import { describe, expect, it } from "vitest";
import { eventually, grpcClients, useTestServers } from "./support.ts";

type WorkRequestInit = MessageInitShape<typeof WorkRequestSchema>;

const server = useTestServers();

/**
 * Short timeouts for the tests whose client is a raw socket that is meant to
 * be cut; the server defaults are tens of seconds to minutes.
 */
const timeouts = { headersMs: 300, requestMs: 600, idleMs: 300 };

/**
 * Timeouts for the tests whose client must stay connected until it has made
 * its calls: client and server share this event loop, and on a loaded
 * machine a stall of a few hundred milliseconds would cut the session early.
 */
const liveTimeouts = { headersMs: 2_000, requestMs: 4_000, idleMs: 2_000 };

/** Opens a raw TCP connection and reports when the server has closed it. */
async function rawConnection(address: string): Promise<{ socket: net.Socket; closed: () => boolean }> {
  const [host, port] = address.split(":");
  const socket = net.connect(Number(port), host);
  let closed = false;
  socket.on("close", () => {
    closed = true;
  });
  socket.on("error", () => {});
  socket.on("data", () => {});
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", () => resolve());
    socket.once("error", reject);
  });
  return { socket, closed: () => closed };
}

describe("connection timeouts", () => {
  it("closes an HTTP/2 connection that sends only the preface", async () => {
    const s = await server({ connectionTimeouts: timeouts });
    const c = await rawConnection(s.address);
    c.socket.write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    await eventually(c.closed, 15_000);
  });

  it("closes an HTTP/1.1 connection that dribbles its headers", async () => {
    const s = await server({ connectionTimeouts: timeouts });
    const c = await rawConnection(s.address);
    c.socket.write("POST /casq.v1.AdminService/ListQueues HTTP/1.1\r\nHost: x\r\n");
    // One more header byte every 50 ms: always active, never done.
    const drip = setInterval(() => c.socket.write("X"), 50);
    try {
      await eventually(c.closed, 15_000);
    } finally {
      clearInterval(drip);
    }
  });

  it("closes a connection that sends nothing at all", async () => {
    const s = await server({ connectionTimeouts: timeouts });
    const c = await rawConnection(s.address);
    await eventually(c.closed, 15_000);
  });

  it("closes an HTTP/2 connection that stays idle after its calls", async () => {
    const s = await server({ connectionTimeouts: liveTimeouts });
    const session = http2.connect(`http://${s.address}`);
    let closed = false;
    session.on("close", () => {
      closed = true;
    });
    session.on("error", () => {});
    const status = await new Promise<unknown>((resolve, reject) => {
      const req = session.request({
        ":method": "POST",
        ":path": "/casq.v1.AdminService/ListQueues",
        "content-type": "application/grpc",
        te: "trailers",
      });
      req.on("trailers", (trailers) => resolve(trailers["grpc-status"]));
      req.on("data", () => {});
      req.on("error", reject);
      req.end(Buffer.alloc(5)); // one empty message
    });
    expect(status).toBe("0");
    await eventually(() => closed, 15_000);
  });

  it("keeps a Work stream with nothing to do open past every timeout, and answers on it", async () => {
    const s = await server({ connectionTimeouts: liveTimeouts });
    const { admin, queue } = grpcClients(s.address);
    await admin.createQueue({ queue: "q" });
    const requests = new AsyncQueue<WorkRequestInit>();
    requests.push({ command: { case: "open", value: { queue: "q", workerId: "w", credits: 1 } } });
    const responses = queue.work(requests)[Symbol.asyncIterator]();
    const opened = await responses.next();
    expect(opened.value?.event.case).toBe("opened");
    // Idle past the request and idle timeouts together (polling the stream's registration, no fixed wait).
    const until = Date.now() + liveTimeouts.requestMs + liveTimeouts.idleMs;
    await eventually(() => Date.now() > until && s.work.openStreams === 1, 15_000);
    await queue.enqueue({ queue: "q", messages: [{}] });
    const job = await responses.next();
    expect(job.value?.event.case).toBe("job");
    requests.end();
  });
});
