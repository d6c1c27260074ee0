import { readFileSync } from "node:fs";
import http2 from "node:http2";
import net from "node:net";
import tls from "node:tls";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeSelfSignedCert } from "../../testing/self-signed-cert.ts";
import { chooseAlpn, type Http2Side, type RunningListener, startListener } from "./listener.ts";

/** An HTTP/2 side that answers every stream with `HTTP/2` and counts the connections it was given. */
function plainHttp2Side(): Http2Side & { readonly injected: () => number } {
  const server = http2.createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/plain" });
    res.end("HTTP/2");
  });
  let injected = 0;
  return {
    injectConnection: (socket) => {
      injected += 1;
      server.emit("connection", socket);
    },
    drain: () => {},
    destroy: () => server.close(),
    injected: () => injected,
  };
}

function start(options: { tls?: { certFile: string; keyFile: string }; http2: Http2Side }) {
  return startListener({
    listen: "127.0.0.1:0",
    logger: pino({ level: "silent" }),
    handler: (req, res) => {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end(`HTTP/${req.httpVersion}`);
    },
    ...options,
  });
}

async function close(listener: RunningListener): Promise<void> {
  await listener.stopAccepting();
  await listener.closeConnections({ graceful: true, timeoutMs: 500 });
}

/** GET / over an HTTP/2 session; resolves with the body. */
function h2Get(session: http2.ClientHttp2Session): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const req = session.request({ ":path": "/" });
    let body = "";
    req.on("data", (d: Buffer) => {
      body += d.toString();
    });
    req.on("end", () => resolve(body));
    req.on("error", reject);
    req.end();
  });
}

describe("cleartext listener", () => {
  it("serves HTTP/1.1 and hands h2c connections over, even when the preface arrives byte by byte", async () => {
    const side = plainHttp2Side();
    const listener = await start({ http2: side });
    const base = `http://127.0.0.1:${listener.port}`;
    expect(await (await fetch(`${base}/x`)).text()).toBe("HTTP/1.1");

    const h2 = http2.connect(base);
    expect(await h2Get(h2)).toBe("HTTP/2");
    h2.close();
    expect(side.injected()).toBe(1);

    // An HTTP/1.1 request sent one byte at a time is still recognised.
    const raw = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(listener.port, "127.0.0.1");
      const request = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
      let i = 0;
      const tick = setInterval(() => {
        socket.write(request[i] ?? "");
        i += 1;
        if (i >= request.length) clearInterval(tick);
      }, 1);
      let data = "";
      socket.on("data", (d) => {
        data += d.toString();
      });
      socket.on("end", () => resolve(data));
      socket.on("error", reject);
    });
    expect(raw).toMatch(/^HTTP\/1\.1 200/);
    expect(raw).toMatch(/\r\nHTTP\/1\.1\r\n/);

    // So is the HTTP/2 preface: the HTTP/2 side answers with its SETTINGS frame.
    const frameType = await new Promise<number>((resolve, reject) => {
      const socket = net.connect(listener.port, "127.0.0.1");
      const preface = Buffer.concat([
        Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1"),
        Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]), // empty SETTINGS
      ]);
      let i = 0;
      const tick = setInterval(() => {
        socket.write(preface.subarray(i, i + 1));
        i += 1;
        if (i >= preface.length) clearInterval(tick);
      }, 1);
      socket.once("data", (d: Buffer) => {
        resolve(d[3] ?? -1);
        socket.destroy();
      });
      socket.on("error", reject);
    });
    expect(frameType).toBe(4);
    expect(side.injected()).toBe(2);
    await close(listener);
  });

  it("reports the connection of an HTTP/2 call by its peer and can end it", async () => {
    const side = plainHttp2Side();
    const listener = await start({ http2: side });
    const session = http2.connect(`http://127.0.0.1:${listener.port}`);
    expect(await h2Get(session)).toBe("HTTP/2");
    const local = session.socket;
    const closed = new Promise<void>((resolve) => session.once("close", () => resolve()));
    session.on("error", () => {});
    listener.http2CallStarted(`${local.localAddress}:${local.localPort}`)();
    await closed;
    await close(listener);
  });
});

describe("ALPN choice", () => {
  it("gives HTTP/1.1 to clients that offer it, h2 to clients that offer only h2", () => {
    expect(chooseAlpn(["h2", "http/1.1"])).toBe("http/1.1");
    expect(chooseAlpn(["http/1.1"])).toBe("http/1.1");
    expect(chooseAlpn(["h2"])).toBe("h2");
    expect(chooseAlpn(["grpc-exp", "h2"])).toBe("h2"); // grpcio
    expect(chooseAlpn(["spdy/3"])).toBeUndefined();
  });
});

describe("TLS listener", () => {
  let certFile = "";
  let keyFile = "";
  let removeCert = () => {};
  beforeAll(() => {
    ({ certFile, keyFile, remove: removeCert } = makeSelfSignedCert());
  }, 30_000);
  afterAll(() => removeCert());

  /** Connects with `offer` as ALPN and resolves with the protocol the server chose. */
  function negotiated(port: number, offer: string[]): Promise<string | false> {
    return new Promise((resolve, reject) => {
      const socket = tls.connect(
        { port, host: "127.0.0.1", ca: readFileSync(certFile), ALPNProtocols: offer },
        () => {
          resolve(socket.alpnProtocol ?? false);
          socket.destroy();
        },
      );
      socket.on("error", reject);
    });
  }

  it("routes by ALPN: h2-only clients to the HTTP/2 side, everyone else to HTTP/1.1", async () => {
    const side = plainHttp2Side();
    const listener = await start({ tls: { certFile, keyFile }, http2: side });
    expect(await negotiated(listener.port, ["h2", "http/1.1"])).toBe("http/1.1");
    expect(await negotiated(listener.port, ["h2"])).toBe("h2");

    // A gRPC-style client (Node's http2.connect offers only h2) is served by the HTTP/2 side.
    const session = http2.connect(`https://127.0.0.1:${listener.port}`, { ca: readFileSync(certFile) });
    expect(await h2Get(session)).toBe("HTTP/2");
    session.close();
    expect(side.injected()).toBeGreaterThanOrEqual(1);

    // An HTTP/1.1 client over TLS (no ALPN at all) is served by the HTTP/1.1 handler.
    const body = await new Promise<string>((resolve, reject) => {
      const socket = tls.connect({ port: listener.port, host: "127.0.0.1", ca: readFileSync(certFile) }, () =>
        socket.write("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      );
      let data = "";
      socket.on("data", (d) => {
        data += d.toString();
      });
      socket.on("end", () => resolve(data));
      socket.on("error", reject);
    });
    expect(body).toMatch(/^HTTP\/1\.1 200/);
    expect(body).toMatch(/\r\nHTTP\/1\.1\r\n/);
    await close(listener);
  });
});
