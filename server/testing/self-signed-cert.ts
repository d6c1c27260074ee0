/**
 * A self-signed server certificate for 127.0.0.1 and localhost, made with
 * `openssl` for tests that serve TLS on loopback.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** PEM files of a self-signed certificate (the certificate is its own CA). */
export interface SelfSignedCert {
  readonly certFile: string;
  readonly keyFile: string;
  /** Removes the files and their directory (once the servers using them are closed). */
  remove(): void;
}

/** Makes a P-256 certificate valid for a day, in a fresh temporary directory. */
export function makeSelfSignedCert(): SelfSignedCert {
  const dir = mkdtempSync(join(tmpdir(), "casq-cert-"));
  const certFile = join(dir, "cert.pem");
  const keyFile = join(dir, "key.pem");
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-days",
      "1",
      "-subj",
      "/CN=127.0.0.1",
      "-addext",
      "subjectAltName=IP:127.0.0.1,DNS:localhost",
      "-keyout",
      keyFile,
      "-out",
      certFile,
    ],
    { stdio: "pipe" },
  );
  return { certFile, keyFile, remove: () => rmSync(dir, { recursive: true, force: true }) };
}
