/**
 * The CLI's connection flags (`--server`, `--token`, `--tls`, `--ca`,
 * `--client-cert`, `--client-key`, `--timeout`; see client.ts) as the
 * `ClientOptions` of the TypeScript SDK, for commands built on it.
 *
 * `--server` names one broker; the SDK follows redirects from there to the
 * leaders of the queue's shards.
 */
import { readFileSync } from "node:fs";
import type { ClientOptions as SdkClientOptions, TlsOptions } from "@casq/sdk";
import { usageError } from "./cli-error.ts";
import type { ClientOptions } from "./client.ts";

/** The SDK options for the parsed connection flags; unreadable PEM files are usage errors. */
export function sdkClientOptions(options: ClientOptions): SdkClientOptions {
  return {
    brokers: [options.server],
    ...(options.token !== undefined && options.token !== "" && { token: options.token }),
    ...(options.timeout !== undefined && { timeoutMs: options.timeout }),
    ...(options.retryTimeout !== undefined && { retryTimeoutMs: options.retryTimeout }),
    tls: sdkTls(options),
  };
}

function sdkTls(options: ClientOptions): TlsOptions | boolean {
  const { ca, clientCert, clientKey } = options;
  if (ca === undefined && clientCert === undefined && clientKey === undefined) return Boolean(options.tls);
  return {
    ...(ca !== undefined && { ca: readPem(ca, "--ca") }),
    ...(clientCert !== undefined && { cert: readPem(clientCert, "--client-cert") }),
    ...(clientKey !== undefined && { key: readPem(clientKey, "--client-key") }),
  };
}

function readPem(path: string, flag: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    throw usageError(`${flag} ${path}: cannot read the file (${(error as Error).message}).`);
  }
}
