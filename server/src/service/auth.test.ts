import { describe, expect, it } from "vitest";
import { parseTokenFile, requiredPermissions } from "./auth.ts";

describe("token files", () => {
  it("parses tokens, permissions, names and comments", () => {
    const table = parseTokenFile(
      ["# comment", "", "aaaaaaaa-token  produce,consume  team-a  # trailing", "bbbbbbbb-token admin"].join(
        "\n",
      ),
    );
    expect(table.size).toBe(2);
    const entries = [...table.values()];
    expect(entries[0]).toMatchObject({ name: "team-a" });
    expect([...(entries[0]?.permissions ?? [])]).toEqual(["produce", "consume"]);
    expect(entries[1]?.name).toMatch(/^token-[0-9a-f]{8}$/);
    // Secrets are not kept, only digests.
    expect(JSON.stringify([...table.keys()])).not.toContain("aaaaaaaa-token");
  });

  it("refuses malformed files with the line number", () => {
    expect(() => parseTokenFile("only-one-field-here")).toThrow(/line 1/);
    expect(() => parseTokenFile("\nabcdefgh produce name extra")).toThrow(/line 2: too many fields/);
    expect(() => parseTokenFile("abcdefgh read")).toThrow(/unknown permission "read"/);
    expect(() => parseTokenFile("abcdefgh produce\nabcdefgh consume")).toThrow(/same token appears twice/);
    expect(() => parseTokenFile("# nothing\n")).toThrow(/has no tokens/);
  });

  it("knows what each RPC needs", () => {
    expect(requiredPermissions("casq.v1.QueueService", "Enqueue")).toEqual(["produce", "admin"]);
    expect(requiredPermissions("casq.v1.QueueService", "EnqueueStream")).toEqual(["produce", "admin"]);
    expect(requiredPermissions("casq.v1.QueueService", "Work")).toEqual(["consume", "admin"]);
    expect(requiredPermissions("casq.v1.QueueService", "LookupShards")).toContain("produce");
    expect(requiredPermissions("casq.v1.AdminService", "GetQueue")).toEqual(["admin"]);
    expect(requiredPermissions("grpc.health.v1.Health", "Check")).toBeUndefined();
    expect(
      requiredPermissions("grpc.reflection.v1.ServerReflection", "ServerReflectionInfo"),
    ).toBeUndefined();
  });
});
