/**
 * gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), so that
 * `grpcurl list`, `grpcurl describe` and `grpcurl -d ... <method>` work
 * against a casq server without any .proto file.
 *
 * The server answers from the descriptors compiled into it: every file of
 * the services it serves, with their dependencies (google/protobuf/*.proto
 * included). Requests on one stream are answered in order:
 * - `list_services`: the fully-qualified names of the served services;
 * - `file_by_filename` / `file_containing_symbol`: the serialized
 *   FileDescriptorProto of the file, followed by those of every file it
 *   depends on (transitively), the way grpc-go answers;
 * - `all_extension_numbers_of_type`: an empty list for a known message
 *   (casq defines no extensions);
 * - anything unknown: an `error_response` with NOT_FOUND, the stream stays open.
 */

import {
  create,
  type DescFile,
  type DescMessage,
  fromBinary,
  type MessageInitShape,
  toBinary,
} from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import {
  type ServerReflectionRequest,
  ServerReflectionRequestSchema,
  ServerReflectionResponseSchema,
  type ServerReflection as ServerReflectionV1,
} from "@casq/api/grpc/reflection/v1/reflection_pb.ts";
import {
  ServerReflectionRequestSchema as ServerReflectionRequestSchemaV1alpha,
  ServerReflectionResponseSchema as ServerReflectionResponseSchemaV1alpha,
  type ServerReflection as ServerReflectionV1alpha,
} from "@casq/api/grpc/reflection/v1alpha/reflection_pb.ts";
import type { ServiceImpl } from "@connectrpc/connect";

/** gRPC code NOT_FOUND, as reflection error responses carry it. */
const NOT_FOUND = 5;

/** Everything reflection knows: files by name, the file of each symbol, and the service names. */
export class DescriptorIndex {
  private readonly files = new Map<string, DescFile>();
  private readonly symbols = new Map<string, DescFile>();
  private readonly messages = new Set<string>();
  readonly serviceNames: readonly string[];

  /** Indexes `files` (and, transitively, what they import); `services` are the names to list. */
  constructor(files: readonly DescFile[], services: readonly string[]) {
    for (const file of files) this.add(file);
    this.serviceNames = [...services].sort();
  }

  /** The file named `name`, if known. */
  file(name: string): DescFile | undefined {
    return this.files.get(name);
  }

  /** The file that defines `symbol` (a message, enum, service, method, field or enum value), if known. */
  fileOf(symbol: string): DescFile | undefined {
    const name = symbol.startsWith(".") ? symbol.slice(1) : symbol;
    const direct = this.symbols.get(name);
    if (direct) return direct;
    // Methods, fields and enum values: look up the enclosing element.
    const dot = name.lastIndexOf(".");
    return dot > 0 ? this.symbols.get(name.slice(0, dot)) : undefined;
  }

  /** True when `typeName` is a known message. */
  isMessage(typeName: string): boolean {
    return this.messages.has(typeName.startsWith(".") ? typeName.slice(1) : typeName);
  }

  /** Serialized FileDescriptorProtos of `file` and everything it imports, the file itself first. */
  serializedWithDependencies(file: DescFile): Uint8Array[] {
    const out: Uint8Array[] = [];
    const seen = new Set<string>();
    const visit = (f: DescFile) => {
      if (seen.has(f.proto.name)) return;
      seen.add(f.proto.name);
      out.push(toBinary(FileDescriptorProtoSchema, f.proto));
      for (const dep of f.dependencies) visit(dep);
    };
    visit(file);
    return out;
  }

  private add(file: DescFile): void {
    if (this.files.has(file.proto.name)) return;
    this.files.set(file.proto.name, file);
    const addMessage = (m: DescMessage) => {
      this.symbols.set(m.typeName, file);
      this.messages.add(m.typeName);
      for (const nested of m.nestedMessages) addMessage(nested);
      for (const e of m.nestedEnums) this.symbols.set(e.typeName, file);
      for (const x of m.nestedExtensions) this.symbols.set(x.typeName, file);
    };
    for (const m of file.messages) addMessage(m);
    for (const e of file.enums) this.symbols.set(e.typeName, file);
    for (const x of file.extensions) this.symbols.set(x.typeName, file);
    for (const s of file.services) this.symbols.set(s.typeName, file);
    for (const dep of file.dependencies) this.add(dep);
  }
}

/** Answers one reflection request. */
export function answerReflection(
  index: DescriptorIndex,
  request: ServerReflectionRequest,
): MessageInitShape<typeof ServerReflectionResponseSchema> {
  const base = { validHost: request.host, originalRequest: request };
  const notFound = (message: string) =>
    ({
      ...base,
      messageResponse: { case: "errorResponse", value: { errorCode: NOT_FOUND, errorMessage: message } },
    }) as const;
  const files = (file: DescFile | undefined, what: string) =>
    file === undefined
      ? notFound(`${what} is not known to this server`)
      : ({
          ...base,
          messageResponse: {
            case: "fileDescriptorResponse",
            value: { fileDescriptorProto: index.serializedWithDependencies(file) },
          },
        } as const);
  const r = request.messageRequest;
  switch (r.case) {
    case "listServices":
      return {
        ...base,
        messageResponse: {
          case: "listServicesResponse",
          value: { service: index.serviceNames.map((name) => ({ name })) },
        },
      };
    case "fileByFilename":
      return files(index.file(r.value), `file ${r.value}`);
    case "fileContainingSymbol":
      return files(index.fileOf(r.value), `symbol ${r.value}`);
    case "fileContainingExtension":
      return notFound(
        `extension ${r.value.extensionNumber} of ${r.value.containingType} is not known to this server`,
      );
    case "allExtensionNumbersOfType":
      return index.isMessage(r.value)
        ? {
            ...base,
            messageResponse: {
              case: "allExtensionNumbersResponse",
              value: { baseTypeName: r.value, extensionNumber: [] },
            },
          }
        : notFound(`type ${r.value} is not known to this server`);
    default:
      return notFound("empty reflection request");
  }
}

/** The ServerReflection v1 implementation. */
export function createReflectionServiceV1(index: DescriptorIndex): ServiceImpl<typeof ServerReflectionV1> {
  return {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) yield answerReflection(index, request);
    },
  };
}

/**
 * The ServerReflection v1alpha implementation. v1alpha is v1 under another
 * package name, with the same wire format: each request is read again as v1,
 * answered as v1, and the answer read again as v1alpha.
 */
export function createReflectionServiceV1alpha(
  index: DescriptorIndex,
): ServiceImpl<typeof ServerReflectionV1alpha> {
  return {
    async *serverReflectionInfo(requests) {
      for await (const request of requests) {
        const v1 = fromBinary(
          ServerReflectionRequestSchema,
          toBinary(ServerReflectionRequestSchemaV1alpha, request),
        );
        const answer = create(ServerReflectionResponseSchema, answerReflection(index, v1));
        yield fromBinary(
          ServerReflectionResponseSchemaV1alpha,
          toBinary(ServerReflectionResponseSchema, answer),
        );
      }
    },
  };
}
