/**
 * A minimal OTLP/HTTP trace receiver for tests: processes in any language
 * export spans to it with their standard OTLP exporters
 * (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=<receiver.endpoint>`, protobuf body),
 * and the test reads back the spans it got.
 *
 * Only the fields the tests look at are decoded, straight from the protobuf
 * wire format of `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`
 * (field numbers from opentelemetry-proto's trace.proto) or its OTLP/JSON
 * form; everything else is skipped. {@link startOtlpGrpcReceiver} takes the
 * same request over gRPC (`TraceService/Export`).
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { gunzipSync } from "node:zlib";
import { BinaryReader, type WireType } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";

/** One received span, ids as lowercase hex ("" when absent). */
export interface ReceivedSpan {
  /** `service.name` of the resource that sent it. */
  readonly service: string;
  /** All resource attributes of the sender. */
  readonly resource: Readonly<Record<string, string | number | boolean>>;
  readonly traceId: string;
  readonly spanId: string;
  readonly parentSpanId: string;
  readonly name: string;
  /** OTLP SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  readonly kind: number;
  readonly attributes: Readonly<Record<string, string | number | boolean>>;
  readonly links: readonly { readonly traceId: string; readonly spanId: string }[];
  /** OTLP status code: 0 unset, 1 ok, 2 error. */
  readonly statusCode: number;
}

/** A running receiver. */
export interface OtlpReceiver {
  /** The URL to give exporters as `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. */
  readonly endpoint: string;
  /** Every span received so far. */
  spans(): readonly ReceivedSpan[];
  close(): Promise<void>;
}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");

/** Calls `onField(fieldNo, wireType, reader)` for each field of the message in `bytes`; unread fields are skipped. */
function fields(bytes: Uint8Array, onField: (no: number, wire: WireType, r: BinaryReader) => boolean): void {
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [no, wire] = reader.tag();
    if (!onField(no, wire, reader)) reader.skip(wire, no);
  }
}

type AttributeValue = string | number | boolean;

function anyValue(bytes: Uint8Array): AttributeValue | undefined {
  let value: AttributeValue | undefined;
  fields(bytes, (no, _wire, r) => {
    if (no === 1) value = r.string();
    else if (no === 2) value = r.bool();
    else if (no === 3) value = Number(r.int64());
    else if (no === 4) value = r.double();
    else return false;
    return true;
  });
  return value;
}

function keyValue(bytes: Uint8Array, into: Record<string, AttributeValue>): void {
  let key = "";
  let value: AttributeValue | undefined;
  fields(bytes, (no, _wire, r) => {
    if (no === 1) key = r.string();
    else if (no === 2) value = anyValue(r.bytes());
    else return false;
    return true;
  });
  if (key !== "" && value !== undefined) into[key] = value;
}

function link(bytes: Uint8Array): { traceId: string; spanId: string } {
  let traceId = "";
  let spanId = "";
  fields(bytes, (no, _wire, r) => {
    if (no === 1) traceId = hex(r.bytes());
    else if (no === 2) spanId = hex(r.bytes());
    else return false;
    return true;
  });
  return { traceId, spanId };
}

function span(bytes: Uint8Array, resource: Record<string, AttributeValue>): ReceivedSpan {
  const service = String(resource["service.name"] ?? "");
  let traceId = "";
  let spanId = "";
  let parentSpanId = "";
  let name = "";
  let kind = 0;
  let statusCode = 0;
  const attributes: Record<string, AttributeValue> = {};
  const links: { traceId: string; spanId: string }[] = [];
  fields(bytes, (no, _wire, r) => {
    if (no === 1) traceId = hex(r.bytes());
    else if (no === 2) spanId = hex(r.bytes());
    else if (no === 4) parentSpanId = hex(r.bytes());
    else if (no === 5) name = r.string();
    else if (no === 6) kind = r.int32();
    else if (no === 9) keyValue(r.bytes(), attributes);
    else if (no === 13) links.push(link(r.bytes()));
    else if (no === 15)
      fields(r.bytes(), (statusNo, _w, sr) => {
        if (statusNo !== 3) return false;
        statusCode = sr.int32();
        return true;
      });
    else return false;
    return true;
  });
  return { service, resource, traceId, spanId, parentSpanId, name, kind, attributes, links, statusCode };
}

/** Decodes an ExportTraceServiceRequest into its spans. */
export function decodeExportTraceRequest(bytes: Uint8Array): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  fields(bytes, (no, _wire, r) => {
    if (no !== 1) return false;
    const resourceSpans = r.bytes();
    const resource: Record<string, AttributeValue> = {};
    const scopeSpans: Uint8Array[] = [];
    fields(resourceSpans, (rsNo, _w, rr) => {
      if (rsNo === 1)
        fields(rr.bytes(), (resNo, _w2, res) => {
          if (resNo !== 1) return false;
          keyValue(res.bytes(), resource);
          return true;
        });
      else if (rsNo === 2) scopeSpans.push(rr.bytes());
      else return false;
      return true;
    });
    for (const scope of scopeSpans)
      fields(scope, (ssNo, _w, sr) => {
        if (ssNo !== 2) return false;
        out.push(span(sr.bytes(), resource));
        return true;
      });
    return true;
  });
  return out;
}

interface JsonKeyValue {
  key: string;
  value?: { stringValue?: string; boolValue?: boolean; intValue?: string | number; doubleValue?: number };
}

function jsonAttributes(list: readonly JsonKeyValue[] | undefined): Record<string, AttributeValue> {
  const out: Record<string, AttributeValue> = {};
  for (const { key, value } of list ?? []) {
    const v = value?.stringValue ?? value?.boolValue ?? value?.doubleValue ?? value?.intValue;
    if (v !== undefined) out[key] = typeof v === "string" && value?.intValue !== undefined ? Number(v) : v;
  }
  return out;
}

/** Decodes an ExportTraceServiceRequest in OTLP/JSON (ids in hex) into its spans. */
export function decodeJsonExportTraceRequest(text: string): ReceivedSpan[] {
  interface JsonSpan {
    traceId?: string;
    spanId?: string;
    parentSpanId?: string;
    name?: string;
    kind?: number;
    attributes?: JsonKeyValue[];
    links?: { traceId?: string; spanId?: string }[];
    status?: { code?: number };
  }
  const request = JSON.parse(text) as {
    resourceSpans?: {
      resource?: { attributes?: JsonKeyValue[] };
      scopeSpans?: { spans?: JsonSpan[] }[];
    }[];
  };
  return (request.resourceSpans ?? []).flatMap((rs) => {
    const resource = jsonAttributes(rs.resource?.attributes);
    const service = String(resource["service.name"] ?? "");
    return (rs.scopeSpans ?? []).flatMap((ss) =>
      (ss.spans ?? []).map((sp) => ({
        service,
        resource,
        traceId: (sp.traceId ?? "").toLowerCase(),
        spanId: (sp.spanId ?? "").toLowerCase(),
        parentSpanId: (sp.parentSpanId ?? "").toLowerCase(),
        name: sp.name ?? "",
        kind: sp.kind ?? 0,
        attributes: jsonAttributes(sp.attributes),
        links: (sp.links ?? []).map((l) => ({ traceId: l.traceId ?? "", spanId: l.spanId ?? "" })),
        statusCode: sp.status?.code ?? 0,
      })),
    );
  });
}

async function body(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const raw = Buffer.concat(chunks);
  return req.headers["content-encoding"] === "gzip" ? gunzipSync(raw) : raw;
}

/** Starts a receiver on a free loopback port. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const received: ReceivedSpan[] = [];
  const server: Server = createServer((req, res) => {
    if (req.method !== "POST" || req.url !== "/v1/traces") {
      res.writeHead(404).end();
      return;
    }
    const json = String(req.headers["content-type"] ?? "").includes("json");
    body(req).then(
      (bytes) => {
        if (json) {
          received.push(...decodeJsonExportTraceRequest(bytes.toString("utf8")));
          res.writeHead(200, { "content-type": "application/json" }).end("{}");
          return;
        }
        received.push(...decodeExportTraceRequest(bytes));
        // An empty ExportTraceServiceResponse is zero bytes.
        res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
      },
      () => res.writeHead(400).end(),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}/v1/traces`,
    spans: () => [...received],
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** Starts an OTLP/gRPC receiver (`TraceService/Export`) on a free loopback port; `endpoint` is `http://127.0.0.1:PORT`. */
export async function startOtlpGrpcReceiver(): Promise<OtlpReceiver> {
  const received: ReceivedSpan[] = [];
  const server = new grpc.Server();
  const raw = (b: Buffer) => b;
  server.addService(
    {
      Export: {
        path: "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        requestStream: false,
        responseStream: false,
        requestSerialize: raw,
        requestDeserialize: raw,
        responseSerialize: raw,
        responseDeserialize: raw,
      },
    },
    {
      Export: (call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
        received.push(...decodeExportTraceRequest(call.request));
        callback(null, Buffer.alloc(0));
      },
    },
  );
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? reject(error) : resolve(bound),
    ),
  );
  return {
    endpoint: `http://127.0.0.1:${port}`,
    spans: () => [...received],
    close: () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())),
  };
}
