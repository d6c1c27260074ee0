import { timestampDate } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { MessageLineError, parseMessageLine } from "./message-input.ts";

const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

describe("parseMessageLine", () => {
  it("takes a JSON object with every field", () => {
    const message = parseMessageLine(
      JSON.stringify({
        payload: "hi",
        key: "k",
        priority: -3,
        delay_ms: 1500,
        headers: { a: "1" },
        dedup_id: "d",
        max_attempts: 3,
      }),
      1,
      { headers: { b: "2" } },
    );
    expect(message).toBeDefined();
    expect(text(message?.payload ?? new Uint8Array())).toBe("hi");
    expect(message?.key).toBe("k");
    expect(message?.priority).toBe(-3);
    expect(message?.headers).toEqual({ a: "1", b: "2" });
    expect(message?.dedupId).toBe("d");
    expect(message?.maxAttempts).toBe(3);
    expect(message?.schedule.case).toBe("delay");
    expect(message?.schedule.case === "delay" && Number(message.schedule.value.seconds)).toBe(1);
  });

  it("takes binary payloads and absolute run_at", () => {
    const message = parseMessageLine('{"payload_base64":"AAEC","run_at":"2030-01-02T03:04:05Z"}', 1, {});
    expect([...(message?.payload ?? [])]).toEqual([0, 1, 2]);
    expect(message?.schedule.case).toBe("runAt");
    if (message?.schedule.case === "runAt") {
      expect(timestampDate(message.schedule.value).toISOString()).toBe("2030-01-02T03:04:05.000Z");
    }
  });

  it("takes a JSON string or plain text as the payload, applying flag defaults", () => {
    const quoted = parseMessageLine('"a \\"quoted\\" line"', 1, { key: "dflt", priority: 2 });
    expect(text(quoted?.payload ?? new Uint8Array())).toBe('a "quoted" line');
    expect(quoted?.key).toBe("dflt");
    expect(quoted?.priority).toBe(2);
    expect(text(parseMessageLine("42", 1, {})?.payload ?? new Uint8Array())).toBe("42");
    expect(text(parseMessageLine("plain text\r", 1, {})?.payload ?? new Uint8Array())).toBe("plain text");
  });

  it("skips empty lines", () => {
    expect(parseMessageLine("", 1, {})).toBeUndefined();
    expect(parseMessageLine("   ", 1, {})).toBeUndefined();
  });

  it("names the line and the problem", () => {
    const bad = (line: string) => () => parseMessageLine(line, 7, {});
    expect(bad('{"payload": 1}')).toThrow(/line 7: "payload" must be a string/);
    expect(bad('{"payload": "x"')).toThrow(MessageLineError);
    expect(bad('{"paylod": "x"}')).toThrow(/unknown field "paylod"/);
    expect(bad('{"payload": "x", "payload_base64": "eA=="}')).toThrow(/not both/);
    expect(bad('{"priority": 5000}')).toThrow(/-1000\.\.1000/);
    expect(bad('{"delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}')).toThrow(/not both/);
    expect(bad('{"headers": {"a": 1}}')).toThrow(/header "a" must be a string/);
    expect(bad('"unterminated')).toThrow(/not valid JSON/);
  });
});
