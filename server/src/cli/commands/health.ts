/**
 * `casq health`: asks a broker's gRPC health service (grpc.health.v1.Health
 * Check) and exits 0 when it answers SERVING, 1 for any other status, 4 when
 * nothing answers. Made for container HEALTHCHECKs and scripts that wait for
 * a broker; Kubernetes can ask the same service with its own gRPC probe.
 */
import { readFileSync } from "node:fs";
import type * as http2 from "node:http2";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
} from "@casq/api/grpc/health/v1/health_pb.ts";
import { createGrpcTransport } from "@casq/sdk/grpc-transport.ts";
import { bearerInterceptor } from "@casq/sdk/transport.ts";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import type { Command } from "commander";
import { CliError, ExitCode, usageError } from "../cli-error.ts";
import { addConnectionOptions, type ClientOptions, describeRpcError } from "../client.ts";
import { printLines } from "../output.ts";

interface HealthOptions extends ClientOptions {
  service: string;
}

/** Registers `casq health`. */
export function registerHealth(program: Command): void {
  const command = program
    .command("health")
    .description("ask a broker's gRPC health service; exit 0 when SERVING")
    .option("--service <name>", "service to ask about (default: the server as a whole)", "");
  addConnectionOptions(command);
  command.addHelpText(
    "after",
    `
Prints the status (SERVING, NOT_SERVING, ...). Exit 0 when SERVING, 1 otherwise, 4 when nothing answers.

Examples:
  $ casq health
  $ casq health --server casq-0.casq:50051 --timeout 3s`,
  );
  command.action(async (options: HealthOptions) => {
    const status = await check(options);
    printLines(ServingStatus[status] ?? `status ${status}`);
    if (status !== ServingStatus.SERVING) {
      throw new CliError(ExitCode.serverError, `casq health: ${options.server} is not serving.`);
    }
  });
}

async function check(options: HealthOptions): Promise<ServingStatus> {
  const tls = Boolean(options.tls || options.ca !== undefined || options.clientCert !== undefined);
  const baseUrl = `${tls ? "https" : "http"}://${options.server}`;
  const session = new Http2SessionManager(baseUrl, {}, tlsOptions(options));
  const token = options.token;
  const interceptors: Interceptor[] = token !== undefined && token !== "" ? [bearerInterceptor(token)] : [];
  const client = createClient(
    Health,
    createGrpcTransport({ baseUrl, sessionManager: session, interceptors }),
  );
  try {
    const response = await client.check(
      { service: options.service },
      { timeoutMs: options.timeout ?? 30_000 },
    );
    return response.status;
  } catch (error) {
    throw describeRpcError(error, options.server, tls);
  } finally {
    session.abort();
  }
}

function tlsOptions(options: HealthOptions): http2.SecureClientSessionOptions {
  const read = (path: string, flag: string): Buffer => {
    try {
      return readFileSync(path);
    } catch (error) {
      throw usageError(`${flag} ${path}: cannot read the file (${(error as Error).message}).`);
    }
  };
  return {
    ...(options.ca !== undefined && { ca: read(options.ca, "--ca") }),
    ...(options.clientCert !== undefined && { cert: read(options.clientCert, "--client-cert") }),
    ...(options.clientKey !== undefined && { key: read(options.clientKey, "--client-key") }),
  };
}
