/**
 * The deploy recipes in deploy/, checked as far as this machine can run them
 * (no systemd as PID 1, no container engine, no cluster):
 *
 * - systemd: `systemd-analyze verify` accepts the unit without a warning, and
 *   it has the hardening, restart and stop settings docs/operations.md names;
 * - container: hadolint (from .venv, requirements-dev.txt) finds nothing, and
 *   the Dockerfile is multi-stage, builds with npm ci + npm run build, runs as
 *   a non-root user and checks health with `casq health`;
 * - Kubernetes: the manifest parses and its Deployment is what the docs say
 *   (3 replicas on one S3 store, readiness on gRPC health, preStop and a
 *   grace period longer than preStop plus the shutdown timeout).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { parseAllDocuments } from "yaml";
import { expectOk, ROOT, runProgram } from "./support.ts";

const DEPLOY = join(ROOT, "deploy");

/** `KEY=VALUE` lines of a unit file, every value of a repeated key. */
function unitSettings(text: string): Map<string, string[]> {
  const settings = new Map<string, string[]>();
  for (const line of text.split("\n")) {
    const match = /^([A-Za-z]+)=(.*)$/.exec(line.trim());
    if (match?.[1] === undefined || match[2] === undefined) continue;
    settings.set(match[1], [...(settings.get(match[1]) ?? []), match[2]]);
  }
  return settings;
}

/** Seconds of a systemd or casq duration like `45s`, `2min` or `30s`. */
function seconds(text: string): number {
  const match = /^(\d+)\s*(s|sec|min|m)?$/.exec(text.trim());
  if (match?.[1] === undefined) throw new Error(`not a duration: ${text}`);
  return Number(match[1]) * (match[2] === "min" || match[2] === "m" ? 60 : 1);
}

describe("deploy/systemd/casq.service", () => {
  const path = join(DEPLOY, "systemd", "casq.service");
  const settings = unitSettings(readFileSync(path, "utf8"));
  const one = (key: string) => settings.get(key)?.at(-1);

  test("systemd-analyze verify accepts it without a warning", async () => {
    const result = expectOk("systemd-analyze verify", await runProgram("systemd-analyze", ["verify", path]));
    expect(result.stderr).toBe("");
  });

  test("hardened: own user, read-only system but the data dir, no privileges", () => {
    expect(one("User")).toBe("casq");
    expect(one("ProtectSystem")).toBe("strict");
    expect(one("ReadWritePaths")).toBe("/var/lib/casq");
    const store = settings.get("Environment")?.find((e) => e.startsWith("CASQ_STORE="));
    expect(store).toBe("CASQ_STORE=file:/var/lib/casq/data");
    expect(one("NoNewPrivileges")).toBe("yes");
    expect(one("CapabilityBoundingSet")).toBe("");
  });

  test("runs the broker as the started process, restarts on failure, stops gracefully in time", () => {
    // node on the bin itself: no npx, npm or shell in between to swallow SIGTERM.
    expect(one("ExecStart")).toBe("/usr/bin/node /opt/casq/node_modules/casq/bin/casq.js serve");
    expect(one("Restart")).toBe("on-failure");
    expect(one("KillSignal")).toBe("SIGTERM");
    const shutdown = settings.get("Environment")?.find((e) => e.startsWith("CASQ_SHUTDOWN_TIMEOUT="));
    expect(shutdown).toBeDefined();
    expect(seconds(one("TimeoutStopSec") ?? "0")).toBeGreaterThan(seconds(shutdown?.split("=")[1] ?? ""));
  });
});

describe("deploy/container/Dockerfile", () => {
  const path = join(DEPLOY, "container", "Dockerfile");
  const lines = readFileSync(path, "utf8")
    .replace(/\\\n/g, " ")
    .split("\n")
    .filter((l) => l.trim() !== "" && !l.startsWith("#"));

  test("hadolint finds nothing", async () => {
    const result = await runProgram(join(ROOT, ".venv", "bin", "hadolint"), [path]);
    expect(result.stdout + result.stderr).toBe("");
    expect(result.code).toBe(0);
  });

  test("multi-stage: builds with npm ci and npm run build, runs non-root with a gRPC health check", () => {
    const stages = lines.filter((l) => l.startsWith("FROM "));
    expect(stages.length).toBeGreaterThanOrEqual(2);
    const runtimeStart = lines.indexOf(stages.at(-1) ?? "");
    const build = lines.slice(0, runtimeStart).join("\n");
    expect(build).toMatch(/npm ci\b/);
    expect(build).toContain("npm run build");
    const runtime = lines.slice(runtimeStart);
    const user = runtime.filter((l) => l.startsWith("USER ")).at(-1);
    expect(user).toBeDefined();
    expect(user).not.toMatch(/^USER (root|0)(:|$)/);
    const health = runtime.find((l) => l.startsWith("HEALTHCHECK "));
    expect(health).toMatch(/CMD \["node", "[^"]*node_modules\/casq\/bin\/casq\.js", "health"/);
    // Exec form: node is PID 1 and gets docker stop's SIGTERM itself.
    expect(runtime.find((l) => l.startsWith("ENTRYPOINT "))).toMatch(/^ENTRYPOINT \["node", /);
  });
});

describe("deploy/kubernetes/casq.yaml", () => {
  const documents = parseAllDocuments(readFileSync(join(DEPLOY, "kubernetes", "casq.yaml"), "utf8"));

  test("parses, every document a Kubernetes object", () => {
    for (const document of documents) {
      expect(document.errors).toEqual([]);
      const object = document.toJS();
      expect(typeof object.apiVersion).toBe("string");
      expect(typeof object.kind).toBe("string");
      expect(typeof object.metadata?.name).toBe("string");
    }
  });

  test("a Deployment of 3 brokers on one S3 bucket, ready on gRPC health, with a hand-off on stop", () => {
    const objects = documents.map((d) => d.toJS());
    const deployment = objects.find((o) => o.kind === "Deployment");
    const service = objects.find((o) => o.kind === "Service");
    expect(deployment.spec.replicas).toBe(3);
    const pod = deployment.spec.template;
    expect(deployment.spec.selector.matchLabels).toEqual(pod.metadata.labels);
    expect(service.spec.selector).toEqual(pod.metadata.labels);
    const [container] = pod.spec.containers;
    const env = Object.fromEntries(
      container.env.map((e: { name: string; value?: string }) => [e.name, e.value]),
    );
    expect(env.CASQ_STORE).toMatch(/^s3:\/\/[^/]+\//);
    expect(env.CASQ_ADVERTISE).toBe("$(POD_IP):50051");
    const grpcPort = container.ports.find((p: { name: string }) => p.name === "grpc").containerPort;
    expect(env.CASQ_LISTEN).toBe(`0.0.0.0:${grpcPort}`);
    expect(container.readinessProbe.grpc.port).toBe(grpcPort);
    expect(service.spec.ports.find((p: { name: string }) => p.name === "grpc").targetPort).toBe("grpc");
    const preStop = container.lifecycle.preStop.sleep.seconds;
    expect(pod.spec.terminationGracePeriodSeconds).toBeGreaterThan(
      preStop + seconds(env.CASQ_SHUTDOWN_TIMEOUT),
    );
    expect(pod.spec.securityContext.runAsNonRoot).toBe(true);
  });
});
