import http2 from "node:http2";
import net from "node:net";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { startListener } from "./listener.ts";

describe("cleartext listener", () => {
  it("serves HTTP/1.1 and h2c on one port, even when the preface arrives byte by byte", async () => {
    const listener = await startListener({
      listen: "127.0.0.1:0",
      logger: pino({ level: "silent" }),
      handler: (req, res) => {
        res.writeHead(200, { "content-type": "text/plain" });
        res.end(`HTTP/${req.httpVersion}`);
      },
    });
    const base = `http://127.0.0.1:${listener.port}`;
    expect(await (await fetch(`${base}/x`)).text()).toBe("HTTP/1.1");

    const h2 = http2.connect(base);
    const viaH2 = await new Promise<string>((resolve, reject) => {
      const req = h2.request({ ":path": "/" });
      let body = "";
      req.on("data", (d: Buffer) => {
        body += d.toString();
      });
      req.on("end", () => resolve(body));
      req.on("error", reject);
      req.end();
    });
    expect(viaH2).toBe("HTTP/2.0");
    h2.close();

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

    // So is the HTTP/2 preface: the server answers with its SETTINGS frame.
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

    await listener.stopAccepting();
    await listener.closeConnections({ graceful: true, timeoutMs: 500 });
  });
});
