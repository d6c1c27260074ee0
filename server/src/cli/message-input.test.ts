import { timestampDate } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { MessageInputError, MessageLineError, parseMessageLine, parseMessageText } from "./message-input.ts";

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

  it("takes plain text, a JSON string with its quotes, and objects without a payload field verbatim", () => {
    const quoted = parseMessageLine('"a \\"quoted\\" line"', 1, { key: "dflt", priority: 2 });
    expect(text(quoted?.payload ?? new Uint8Array())).toBe('"a \\"quoted\\" line"');
    expect(quoted?.key).toBe("dflt");
    expect(quoted?.priority).toBe(2);
    expect(text(parseMessageLine("42", 1, {})?.payload ?? new Uint8Array())).toBe("42");
    expect(text(parseMessageLine("plain text\r", 1, {})?.payload ?? new Uint8Array())).toBe("plain text");
    const object = '{"to":"ada@example.com"}';
    expect(text(parseMessageLine(object, 1, {})?.payload ?? new Uint8Array())).toBe(object);
    expect(text(parseMessageLine("[1, 2]", 1, {})?.payload ?? new Uint8Array())).toBe("[1, 2]");
  });

  it("stores a non-string payload of an envelope as its compact JSON", () => {
    const nested = parseMessageLine('{"payload": {"nested": 1}, "priority": 4}', 1, {});
    expect(text(nested?.payload ?? new Uint8Array())).toBe('{"nested":1}');
    expect(nested?.priority).toBe(4);
    expect(text(parseMessageLine('{"payload": 12}', 1, {})?.payload ?? new Uint8Array())).toBe("12");
  });

  it("reads the PAYLOAD argument and a stdin line by the same rule", () => {
    const inputs = [
      '"x"',
      '{"to":"ada@example.com"}',
      '{"payload":{"nested":1}}',
      '{"payload":"job 3","priority":3}',
      "plain",
      '  {"payload": "spaced"}',
    ];
    for (const input of inputs) {
      const fromLine = parseMessageLine(input, 1, {});
      const fromArgument = parseMessageText(input, {});
      expect(fromArgument, input).toEqual(fromLine);
    }
    for (const bad of ['{"payload":"x","to":"y"}', '{"payload": "x"', "[1, 2"]) {
      expect(() => parseMessageText(bad, {}), bad).toThrow(MessageInputError);
      expect(() => parseMessageLine(bad, 3, {}), bad).toThrow(/^stdin line 3: /);
    }
  });

  it("--raw stores every input as it is", () => {
    for (const input of ['{"payload": "x"', '{"payload":"x","to":"y"}', '"x"']) {
      expect(text(parseMessageText(input, {}, { raw: true }).payload)).toBe(input);
      expect(text(parseMessageLine(input, 1, {}, { raw: true })?.payload ?? new Uint8Array())).toBe(input);
    }
  });

  it("skips empty lines", () => {
    expect(parseMessageLine("", 1, {})).toBeUndefined();
    expect(parseMessageLine("   ", 1, {})).toBeUndefined();
  });

  it("names the line and the problem", () => {
    const bad = (line: string) => () => parseMessageLine(line, 7, {});
    expect(bad('{"payload": "x"')).toThrow(MessageLineError);
    expect(bad('{"payload": "x"')).toThrow(/line 7: starts with "\{" but is not valid JSON.*--raw/);
    expect(bad('{"payload": "x", "paylod": "y"}')).toThrow(/"paylod" is not an envelope field.*--raw/);
    expect(bad('{"payload": "x", "payload_base64": "eA=="}')).toThrow(/not both/);
    expect(bad('{"payload": "x", "priority": 5000}')).toThrow(/-1000\.\.1000/);
    expect(bad('{"payload": "", "delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}')).toThrow(/not both/);
    expect(bad('{"payload": "", "headers": {"a": 1}}')).toThrow(/header "a" must be a string/);
    expect(bad('{"payload_base64": 5}')).toThrow(/"payload_base64" must be a string/);
  });
});
