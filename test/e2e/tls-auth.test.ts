/**
 * `casq serve` with TLS and bearer tokens, and the CLI's flags for them:
 * `--ca` (a private CA) and `--token`. Without a token the call is refused
 * with a message that says which flag to pass; a token without the
 * permission is refused as well; a plaintext client gets a hint to use
 * `--tls`. The certificate and token file are fixtures (test/e2e/fixtures).
 */
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CasqServerProcess, casq, ROOT, startServer } from "./support/processes.ts";

const FIXTURES = join(ROOT, "test", "e2e", "fixtures");
const CA = join(FIXTURES, "server-cert.pem");
let server: CasqServerProcess;

beforeAll(async () => {
  server = await startServer({
    store: "memory:",
    args: [
      "--tls-cert",
      CA,
      "--tls-key",
      join(FIXTURES, "server-key.pem"),
      "--auth-tokens",
      join(FIXTURES, "tokens.txt"),
    ],
  });
});

afterAll(async () => {
  await server?.stop();
});

describe("casq serve with TLS and bearer tokens", () => {
  it("announces TLS and tokens", () => {
    expect(server.output()).toContain("(gRPC, TLS, bearer tokens required;");
  });

  it("serves a client that trusts the CA and sends a token", async () => {
    const admin = ["--server", server.address, "--ca", CA, "--token", "casq-test-admin-token"];
    const created = await casq(["queue", "create", "secure", ...admin]);
    expect(created.code, created.stderr).toBe(0);
    const enqueued = await casq(["enqueue", "secure", "hi", "--server", server.address, "--ca", CA], {
      env: { CASQ_TOKEN: "casq-test-producer-token" },
    });
    expect(enqueued.code, enqueued.stderr).toBe(0);
  });

  it("explains a missing token, a missing permission, and a missing --tls", async () => {
    const noToken = await casq(["stats", "--server", server.address, "--ca", CA]);
    expect(noToken.code).toBe(1);
    expect(noToken.stderr).toContain("UNAUTHENTICATED");
    expect(noToken.stderr).toContain("Pass --token or set CASQ_TOKEN");

    const producer = ["--server", server.address, "--ca", CA, "--token", "casq-test-producer-token"];
    const denied = await casq(["queue", "create", "not-allowed", ...producer]);
    expect(denied.code).toBe(1);
    expect(denied.stderr).toContain("PERMISSION_DENIED");

    const untrusted = await casq(["stats", "--server", server.address, "--tls"]);
    expect(untrusted.code).toBe(4);
    expect(untrusted.stderr).toContain("TLS handshake");

    const plaintext = await casq(["stats", "--server", server.address]);
    expect(plaintext.code, plaintext.stderr).toBe(4);
    expect(plaintext.stderr).toContain("pass --tls");
  });
});
