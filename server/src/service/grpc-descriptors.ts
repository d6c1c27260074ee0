/**
 * Descriptors of the two standard gRPC services every casq server offers
 * besides its own API, built at runtime instead of generated:
 *
 * - `grpc.health.v1.Health` (file `grpc/health/v1/health.proto`): Check and
 *   Watch, what load balancers, Kubernetes probes and grpc-health-probe ask.
 * - `grpc.reflection.v1.ServerReflection` and its older twin
 *   `grpc.reflection.v1alpha.ServerReflection` (files
 *   `grpc/reflection/v1{,alpha}/reflection.proto`): what `grpcurl list` and
 *   `grpcurl describe` use to discover the API without .proto files.
 *
 * Both protocols are small, stable and wire-defined by gRPC; describing them
 * here (field numbers and types as gRPC publishes them) keeps them out of
 * casq's own buf module and code generation. The TypeScript shapes below
 * match what protoc-gen-es would generate for them.
 */
import {
  create,
  createFileRegistry,
  type DescFile,
  type Message,
  type MessageInitShape,
} from "@bufbuild/protobuf";
import type { GenMessage, GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import {
  type DescriptorProtoSchema,
  type FieldDescriptorProtoSchema,
  type FileDescriptorProto,
  FileDescriptorProtoSchema,
  FieldDescriptorProto_Label as Label,
  type MethodDescriptorProtoSchema,
  FieldDescriptorProto_Type as Type,
} from "@bufbuild/protobuf/wkt";

// ------------------------------------------------------------ builders

type FieldSpec = {
  name: string;
  number: number;
  type: Type;
  typeName?: string;
  repeated?: boolean;
  oneof?: number;
};

function field(spec: FieldSpec): MessageInitShape<typeof FieldDescriptorProtoSchema> {
  return {
    name: spec.name,
    number: spec.number,
    label: spec.repeated ? Label.REPEATED : Label.OPTIONAL,
    type: spec.type,
    jsonName: spec.name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase()),
    ...(spec.typeName === undefined ? {} : { typeName: spec.typeName }),
    ...(spec.oneof === undefined ? {} : { oneofIndex: spec.oneof }),
  };
}

function message(
  name: string,
  fields: FieldSpec[],
  extra: { oneofs?: string[]; enums?: MessageInitShape<typeof DescriptorProtoSchema>["enumType"] } = {},
): MessageInitShape<typeof DescriptorProtoSchema> {
  return {
    name,
    field: fields.map(field),
    oneofDecl: (extra.oneofs ?? []).map((n) => ({ name: n })),
    ...(extra.enums ? { enumType: extra.enums } : {}),
  };
}

function method(
  name: string,
  input: string,
  output: string,
  streaming: { client?: boolean; server?: boolean } = {},
): MessageInitShape<typeof MethodDescriptorProtoSchema> {
  return {
    name,
    inputType: input,
    outputType: output,
    ...(streaming.client ? { clientStreaming: true } : {}),
    ...(streaming.server ? { serverStreaming: true } : {}),
  };
}

function build(proto: MessageInitShape<typeof FileDescriptorProtoSchema>): DescFile {
  const fileProto: FileDescriptorProto = create(FileDescriptorProtoSchema, { syntax: "proto3", ...proto });
  const registry = createFileRegistry(fileProto, () => undefined);
  const file = registry.getFile(fileProto.name);
  if (!file) throw new Error(`descriptor ${fileProto.name} did not build`);
  return file;
}

// ------------------------------------------------------------ health

/** `grpc/health/v1/health.proto`. */
export const file_grpc_health_v1_health: DescFile = build({
  name: "grpc/health/v1/health.proto",
  package: "grpc.health.v1",
  messageType: [
    message("HealthCheckRequest", [{ name: "service", number: 1, type: Type.STRING }]),
    message(
      "HealthCheckResponse",
      [
        {
          name: "status",
          number: 1,
          type: Type.ENUM,
          typeName: ".grpc.health.v1.HealthCheckResponse.ServingStatus",
        },
      ],
      {
        enums: [
          {
            name: "ServingStatus",
            value: [
              { name: "UNKNOWN", number: 0 },
              { name: "SERVING", number: 1 },
              { name: "NOT_SERVING", number: 2 },
              { name: "SERVICE_UNKNOWN", number: 3 },
            ],
          },
        ],
      },
    ),
  ],
  service: [
    {
      name: "Health",
      method: [
        method("Check", ".grpc.health.v1.HealthCheckRequest", ".grpc.health.v1.HealthCheckResponse"),
        method("Watch", ".grpc.health.v1.HealthCheckRequest", ".grpc.health.v1.HealthCheckResponse", {
          server: true,
        }),
      ],
    },
  ],
  options: { goPackage: "google.golang.org/grpc/health/grpc_health_v1" },
});

/** Serving status of a service (grpc.health.v1.HealthCheckResponse.ServingStatus). */
export enum ServingStatus {
  UNKNOWN = 0,
  SERVING = 1,
  NOT_SERVING = 2,
  SERVICE_UNKNOWN = 3,
}

/** grpc.health.v1.HealthCheckRequest */
export type HealthCheckRequest = Message<"grpc.health.v1.HealthCheckRequest"> & {
  /** Service name; empty means the server as a whole. */
  service: string;
};

/** grpc.health.v1.HealthCheckResponse */
export type HealthCheckResponse = Message<"grpc.health.v1.HealthCheckResponse"> & {
  status: ServingStatus;
};

/** Schema of HealthCheckRequest. */
export const HealthCheckRequestSchema = messageOf<HealthCheckRequest>(
  file_grpc_health_v1_health,
  "grpc.health.v1.HealthCheckRequest",
);

/** Schema of HealthCheckResponse. */
export const HealthCheckResponseSchema = messageOf<HealthCheckResponse>(
  file_grpc_health_v1_health,
  "grpc.health.v1.HealthCheckResponse",
);

/** grpc.health.v1.Health */
export const Health = serviceOf<{
  check: {
    methodKind: "unary";
    input: typeof HealthCheckRequestSchema;
    output: typeof HealthCheckResponseSchema;
  };
  watch: {
    methodKind: "server_streaming";
    input: typeof HealthCheckRequestSchema;
    output: typeof HealthCheckResponseSchema;
  };
}>(file_grpc_health_v1_health, "grpc.health.v1.Health");

// ------------------------------------------------------------ reflection

function reflectionFile(pkg: "grpc.reflection.v1" | "grpc.reflection.v1alpha"): DescFile {
  const t = (name: string) => `.${pkg}.${name}`;
  return build({
    name: `grpc/reflection/${pkg.slice("grpc.reflection.".length)}/reflection.proto`,
    package: pkg,
    messageType: [
      message(
        "ServerReflectionRequest",
        [
          { name: "host", number: 1, type: Type.STRING },
          { name: "file_by_filename", number: 3, type: Type.STRING, oneof: 0 },
          { name: "file_containing_symbol", number: 4, type: Type.STRING, oneof: 0 },
          {
            name: "file_containing_extension",
            number: 5,
            type: Type.MESSAGE,
            typeName: t("ExtensionRequest"),
            oneof: 0,
          },
          { name: "all_extension_numbers_of_type", number: 6, type: Type.STRING, oneof: 0 },
          { name: "list_services", number: 7, type: Type.STRING, oneof: 0 },
        ],
        { oneofs: ["message_request"] },
      ),
      message("ExtensionRequest", [
        { name: "containing_type", number: 1, type: Type.STRING },
        { name: "extension_number", number: 2, type: Type.INT32 },
      ]),
      message(
        "ServerReflectionResponse",
        [
          { name: "valid_host", number: 1, type: Type.STRING },
          { name: "original_request", number: 2, type: Type.MESSAGE, typeName: t("ServerReflectionRequest") },
          {
            name: "file_descriptor_response",
            number: 4,
            type: Type.MESSAGE,
            typeName: t("FileDescriptorResponse"),
            oneof: 0,
          },
          {
            name: "all_extension_numbers_response",
            number: 5,
            type: Type.MESSAGE,
            typeName: t("ExtensionNumberResponse"),
            oneof: 0,
          },
          {
            name: "list_services_response",
            number: 6,
            type: Type.MESSAGE,
            typeName: t("ListServiceResponse"),
            oneof: 0,
          },
          { name: "error_response", number: 7, type: Type.MESSAGE, typeName: t("ErrorResponse"), oneof: 0 },
        ],
        { oneofs: ["message_response"] },
      ),
      message("FileDescriptorResponse", [
        { name: "file_descriptor_proto", number: 1, type: Type.BYTES, repeated: true },
      ]),
      message("ExtensionNumberResponse", [
        { name: "base_type_name", number: 1, type: Type.STRING },
        { name: "extension_number", number: 2, type: Type.INT32, repeated: true },
      ]),
      message("ListServiceResponse", [
        { name: "service", number: 1, type: Type.MESSAGE, typeName: t("ServiceResponse"), repeated: true },
      ]),
      message("ServiceResponse", [{ name: "name", number: 1, type: Type.STRING }]),
      message("ErrorResponse", [
        { name: "error_code", number: 1, type: Type.INT32 },
        { name: "error_message", number: 2, type: Type.STRING },
      ]),
    ],
    service: [
      {
        name: "ServerReflection",
        method: [
          method("ServerReflectionInfo", t("ServerReflectionRequest"), t("ServerReflectionResponse"), {
            client: true,
            server: true,
          }),
        ],
      },
    ],
  });
}

/** `grpc/reflection/v1/reflection.proto`. */
export const file_grpc_reflection_v1_reflection: DescFile = reflectionFile("grpc.reflection.v1");
/** `grpc/reflection/v1alpha/reflection.proto`. */
export const file_grpc_reflection_v1alpha_reflection: DescFile = reflectionFile("grpc.reflection.v1alpha");

/** grpc.reflection.*.ServerReflectionRequest (the same shape in v1 and v1alpha). */
export type ServerReflectionRequest = Message<string> & {
  host: string;
  messageRequest:
    | { case: "fileByFilename"; value: string }
    | { case: "fileContainingSymbol"; value: string }
    | {
        case: "fileContainingExtension";
        value: Message<string> & { containingType: string; extensionNumber: number };
      }
    | { case: "allExtensionNumbersOfType"; value: string }
    | { case: "listServices"; value: string }
    | { case: undefined; value?: undefined };
};

/** grpc.reflection.*.ServerReflectionResponse (the same shape in v1 and v1alpha). */
export type ServerReflectionResponse = Message<string> & {
  validHost: string;
  originalRequest?: ServerReflectionRequest;
  messageResponse:
    | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
    | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
    | { case: "listServicesResponse"; value: { service: { name: string }[] } }
    | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } }
    | { case: undefined; value?: undefined };
};

/** The methods of ServerReflection (the same in v1 and v1alpha). */
export type ServerReflectionMethods = {
  serverReflectionInfo: {
    methodKind: "bidi_streaming";
    input: GenMessage<ServerReflectionRequest>;
    output: GenMessage<ServerReflectionResponse>;
  };
};

/** grpc.reflection.v1.ServerReflection */
export const ServerReflectionV1 = serviceOf<ServerReflectionMethods>(
  file_grpc_reflection_v1_reflection,
  "grpc.reflection.v1.ServerReflection",
);

/** grpc.reflection.v1alpha.ServerReflection */
export const ServerReflectionV1alpha = serviceOf<ServerReflectionMethods>(
  file_grpc_reflection_v1alpha_reflection,
  "grpc.reflection.v1alpha.ServerReflection",
);

// ------------------------------------------------------------ lookups

function messageOf<T extends Message>(file: DescFile, typeName: string): GenMessage<T> {
  const found = file.messages.find((m) => m.typeName === typeName);
  if (!found) throw new Error(`${typeName} is not in ${file.proto.name}`);
  return found as unknown as GenMessage<T>;
}

function serviceOf<T extends GenServiceMethods>(file: DescFile, typeName: string): GenService<T> {
  const found = file.services.find((s) => s.typeName === typeName);
  if (!found) throw new Error(`${typeName} is not in ${file.proto.name}`);
  return found as unknown as GenService<T>;
}
