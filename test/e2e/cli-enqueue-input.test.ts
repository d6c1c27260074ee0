/**
 * `casq enqueue` reads the PAYLOAD argument and a stdin line by one rule
 * (server/src/cli/message-input.ts, docs/cli.md): the same text stores the
 * same message either way, and what does not fit is refused with exit 2
 * before anything is sent. Checked with real processes: the payloads are
 * claimed back over gRPC from a real `casq serve`. An enqueue that
 * auto-created its queue says so on stderr, and the broker logs it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClients, text } from "../service/support.ts";
import { type CasqServerProcess, casq, startServer, tempDir } from "./support/processes.ts";

let server: CasqServerProcess;
let store: { path: string; remove: () => void };

beforeAll(async () => {
  store = tempDir("cli-enqueue-input");
  server = await startServer({ store: `file:${store.path}`, args: ["--log-level", "info"] });
});

afterAll(async () => {
  await server?.stop();
  store?.remove();
});

/** Enqueues `input` into a fresh queue once as the argument and once on stdin; returns both stored payloads. */
async function bothWays(queue: string, input: string): Promise<{ argument: string; stdin: string }> {
  const argument = await casq(["enqueue", `${queue}-arg`, input, "--server", server.address]);
  expect(argument.code, argument.stderr).toBe(0);
  const stdin = await casq(["enqueue", `${queue}-stdin`, "--server", server.address], {
    input: `${input}\n`,
  });
  expect(stdin.code, stdin.stderr).toBe(0);
  const { queue: client } = grpcClients(server.address);
  const payloadOf = async (name: string) => {
    const claimed = await client.claim({ queue: name, workerId: "t", maxMessages: 10 });
    expect(claimed.messages).toHaveLength(1);
    return text(claimed.messages[0]?.message?.payload);
  };
  return { argument: await payloadOf(`${queue}-arg`), stdin: await payloadOf(`${queue}-stdin`) };
}

describe("casq enqueue: one input rule for PAYLOAD and stdin", () => {
  it("a JSON string keeps its quotes both ways", async () => {
    expect(await bothWays("quoted", '"x"')).toEqual({ argument: '"x"', stdin: '"x"' });
  });

  it("an object without a payload field is the payload both ways", async () => {
    const input = '{"to":"ada@example.com"}';
    expect(await bothWays("object", input)).toEqual({ argument: input, stdin: input });
  });

  it("an envelope with an object payload stores its compact JSON both ways", async () => {
    expect(await bothWays("nested", '{"payload": {"nested": 1}}')).toEqual({
      argument: '{"nested":1}',
      stdin: '{"nested":1}',
    });
  });

  it("refuses malformed JSON and unknown envelope fields with exit 2 both ways, and --raw stores them", async () => {
    for (const input of ['{"payload": "x"', '{"payload":"x","to":"y"}']) {
      const argument = await casq(["enqueue", "refused", input, "--server", server.address]);
      expect(argument.code, input).toBe(2);
      expect(argument.stderr).toContain("PAYLOAD: ");
      expect(argument.stderr).toContain("--raw");
      const stdin = await casq(["enqueue", "refused", "--server", server.address], { input: `${input}\n` });
      expect(stdin.code, input).toBe(2);
      expect(stdin.stderr).toContain("stdin line 1: ");
    }
    const stats = await casq(["queue", "list", "--json", "--server", server.address]);
    expect(stats.stdout).not.toContain('"refused"'); // nothing was sent, so nothing was auto-created
    const raw = await casq(["enqueue", "raw-q", '{"payload": "x"', "--raw", "--server", server.address]);
    expect(raw.code, raw.stderr).toBe(0);
    const claimed = await grpcClients(server.address).queue.claim({
      queue: "raw-q",
      workerId: "t",
      maxMessages: 1,
    });
    expect(text(claimed.messages[0]?.message?.payload)).toBe('{"payload": "x"');
  });

  it("the README tour's envelope lines still work on stdin", async () => {
    const lines = Array.from({ length: 5 }, (_, i) => `{"payload":"job ${i + 1}","priority":${i + 1}}`);
    const result = await casq(["enqueue", "tour", "--server", server.address], {
      input: `${lines.join("\n")}\n`,
    });
    expect(result.code, result.stderr).toBe(0);
    const claimed = await grpcClients(server.address).queue.claim({
      queue: "tour",
      workerId: "t",
      maxMessages: 5,
    });
    expect(claimed.messages.map((m) => text(m.message?.payload))).toEqual([
      "job 5",
      "job 4",
      "job 3",
      "job 2",
      "job 1",
    ]);
  });
});

describe("casq enqueue to a queue that does not exist (auto-create on)", () => {
  it("says it created the queue, once, and the broker logs the documented queue created line", async () => {
    const first = await casq(["enqueue", "typo-queue", "x", "--server", server.address]);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stderr).toContain("created queue typo-queue (auto-create");
    const again = await casq(["enqueue", "typo-queue", "y", "--server", server.address]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stderr).not.toContain("created queue");

    const piped = await casq(["enqueue", "typo-piped", "--json", "--server", server.address], {
      input: "a\nb\n",
    });
    expect(piped.code, piped.stderr).toBe(0);
    expect(piped.stderr.match(/created queue typo-piped \(auto-create/g)).toHaveLength(1);

    const { queue } = grpcClients(server.address);
    const response = await queue.enqueue({ queue: "typo-grpc", messages: [{ payload: new Uint8Array() }] });
    expect(response.queueCreated).toBe(true);
    expect((await queue.enqueue({ queue: "typo-grpc", messages: [{}] })).queueCreated).toBe(false);

    const created = server
      .output()
      .split("\n")
      .filter((line) => line.includes('"msg":"queue created"') && line.includes('"queue":"typo-queue"'));
    expect(created).toHaveLength(1);
    expect(JSON.parse(created[0] ?? "{}")).toMatchObject({ level: 30, shards: 1, autoCreated: true });
  });
});
