/**
 * The ext_proc client's protocol, built from Envoy's own proto definitions rather than kvgate's
 * hand-written copy, so the test proxy and bench check `kvgate epp` against what Envoy encodes.
 *
 * The definitions are the upstream `envoyproxy/data-plane-api` files that `@grpc/grpc-js-xds` ships
 * under `deps/envoy-api` (with `deps/xds`, `deps/googleapis` and `deps/protoc-gen-validate` for their
 * imports). That copy predates the full-duplex body mode, so after loading, the pieces current
 * data-plane-api has and it lacks are added by reflection, with upstream's names and numbers:
 *   - `envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED = 4`
 *     (`envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto`);
 *   - `envoy.service.ext_proc.v3.StreamedBodyResponse { bytes body = 1; bool end_of_stream = 2; }`
 *     (`envoy/service/ext_proc/v3/external_processor.proto`; its later fields 3–4 serve the gRPC body
 *     mode and are not needed for HTTP bodies);
 *   - `BodyMutation.streamed_response = 3` in the `mutation` oneof, the reply FULL_DUPLEX_STREAMED needs.
 *   - `ProcessingRequest.protocol_config = 11`, `ProtocolConfiguration { BodySendMode request_body_mode = 1;
 *     BodySendMode response_body_mode = 2; bool send_body_without_waiting_for_header_response = 3; }`:
 *     current Envoy puts it on the first message of every stream (`Filter::encodeProtocolConfig` in
 *     `source/extensions/filters/http/ext_proc/ext_proc.cc`), and it is the only way a server can tell
 *     BUFFERED from FULL_DUPLEX_STREAMED before the body arrives.
 * Without them a client decodes a server's `streamed_response` as an empty `body_mutation`.
 *
 * `@grpc/grpc-js-xds` is a devDependency: this module (and everything in src/bench/ext-proc/) is for
 * tests and `npm run bench:ext-proc`, which run from a checkout after `npm ci`; nothing the CLI or the
 * gateway runs imports it. Without the package it throws an error saying so.
 *
 * Objects use proto field names (keepCase), except inside `google.protobuf.Struct`/`Value`, whose
 * protobufjs built-ins are camelCase (`stringValue`, `structValue`) whatever keepCase says.
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { fromJSON, type Options } from "@grpc/proto-loader";
import protobuf from "protobufjs";

export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";
export const PROCESS_PATH = `/${EXT_PROC_SERVICE}/Process`;

/** proto-loader options: proto field names, bytes as Buffers, enums as numbers (an HTTP status code
 *  is its own number in `envoy.type.v3.StatusCode`), oneof discriminators. */
export const LOADER_OPTIONS: Options = {
  keepCase: true,
  longs: Number,
  bytes: Buffer,
  defaults: false,
  oneofs: true,
};

/** Where `@grpc/grpc-js-xds` keeps the upstream proto trees, or null when it is not installed. */
export function upstreamProtoDirs(): string[] | null {
  let main: string;
  try {
    main = createRequire(import.meta.url).resolve("@grpc/grpc-js-xds");
  } catch {
    return null;
  }
  // build/src/index.js → package root
  const root = dirname(dirname(dirname(main)));
  const dirs = ["envoy-api", "xds", "googleapis", "protoc-gen-validate"].map((d) => join(root, "deps", d));
  return dirs.every((d) => existsSync(d)) ? dirs : null;
}

/** Adds the FULL_DUPLEX_STREAMED pieces current data-plane-api has; a no-op for each already there. */
export function addFullDuplexPieces(root: protobuf.Root): void {
  const mode = root.lookupEnum("envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode");
  if (mode.values["FULL_DUPLEX_STREAMED"] === undefined) mode.add("FULL_DUPLEX_STREAMED", 4);
  const pkg = root.lookup("envoy.service.ext_proc.v3") as protobuf.Namespace;
  if (!pkg.get("StreamedBodyResponse")) {
    pkg.add(
      new protobuf.Type("StreamedBodyResponse")
        .add(new protobuf.Field("body", 1, "bytes"))
        .add(new protobuf.Field("end_of_stream", 2, "bool"))
        .add(new protobuf.Field("end_of_stream_without_message", 3, "bool"))
        .add(new protobuf.Field("grpc_message_compressed", 4, "bool")),
    );
  }
  if (mode.values["GRPC"] === undefined) mode.add("GRPC", 5);
  const body = root.lookupType("envoy.service.ext_proc.v3.HttpBody");
  if (!body.fields["end_of_stream_without_message"])
    body
      .add(new protobuf.Field("end_of_stream_without_message", 3, "bool"))
      .add(new protobuf.Field("grpc_message_compressed", 4, "bool"));
  if (!pkg.get("ProtocolConfiguration")) {
    const mode = "envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode";
    pkg.add(
      new protobuf.Type("ProtocolConfiguration")
        .add(new protobuf.Field("request_body_mode", 1, mode))
        .add(new protobuf.Field("response_body_mode", 2, mode))
        .add(new protobuf.Field("send_body_without_waiting_for_header_response", 3, "bool")),
    );
    root
      .lookupType("envoy.service.ext_proc.v3.ProcessingRequest")
      .add(new protobuf.Field("protocol_config", 11, "ProtocolConfiguration"));
  }
  const mutation = root.lookupType("envoy.service.ext_proc.v3.BodyMutation");
  if (!mutation.fields["streamed_response"]) {
    const field = new protobuf.Field("streamed_response", 3, "StreamedBodyResponse");
    mutation.add(field);
    mutation.oneofs["mutation"]!.add(field);
  }
  root.resolveAll();
}

/** Loads the upstream protos with the additions; throws with what to do when they are missing. */
export function loadUpstreamRoot(): protobuf.Root {
  const dirs = upstreamProtoDirs();
  if (!dirs) {
    throw new Error(
      "the Envoy proto definitions are not installed: the Envoy-like ext_proc client reads them from the " +
        "devDependency @grpc/grpc-js-xds (deps/envoy-api); run `npm ci` in a kvgate checkout (not --omit=dev)",
    );
  }
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => {
    for (const dir of dirs) {
      const full = join(dir, target);
      if (existsSync(full)) return full;
    }
    return target;
  };
  root.loadSync("envoy/service/ext_proc/v3/external_processor.proto", { keepCase: true });
  root.resolveAll();
  addFullDuplexPieces(root);
  return root;
}

export interface ExtProcProtocol {
  root: protobuf.Root;
  /** The grpc-js client constructor for envoy.service.ext_proc.v3.ExternalProcessor. */
  Client: grpc.ServiceClientConstructor;
  /** Encodes / decodes the stream's messages exactly as the client does (for tests). */
  encodeRequest(msg: object): Buffer;
  decodeResponse(buf: Buffer): ProcessingResponse;
}

let cached: ExtProcProtocol | null = null;

/** The protocol, loaded once per process (~100 ms). */
export function extProcProtocol(): ExtProcProtocol {
  if (cached) return cached;
  const root = loadUpstreamRoot();
  const pkgDef = fromJSON(root.toJSON(), LOADER_OPTIONS);
  const loaded = grpc.loadPackageDefinition(pkgDef) as unknown as {
    envoy: { service: { ext_proc: { v3: { ExternalProcessor: grpc.ServiceClientConstructor } } } };
  };
  const Client = loaded.envoy.service.ext_proc.v3.ExternalProcessor;
  const method = Client.service["Process"]!;
  cached = {
    root,
    Client,
    encodeRequest: (msg) => method.requestSerialize(msg),
    decodeResponse: (buf) => method.responseDeserialize(buf) as ProcessingResponse,
  };
  return cached;
}

// The message shapes the client reads and writes (proto field names; oneof discriminators as
// `request` / `response` / `mutation`). Only the fields Envoy's filter uses are typed.

export interface HeaderValue {
  key: string;
  value?: string;
  raw_value?: Buffer;
}
export interface HeaderValueOption {
  header?: HeaderValue;
  append?: { value: boolean };
  append_action?: number;
}
export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}
export interface StreamedBodyResponse {
  body?: Buffer;
  end_of_stream?: boolean;
}
export interface BodyMutation {
  mutation?: "body" | "clear_body" | "streamed_response";
  body?: Buffer;
  clear_body?: boolean;
  streamed_response?: StreamedBodyResponse;
}
export interface CommonResponse {
  status?: number;
  header_mutation?: HeaderMutation;
  body_mutation?: BodyMutation;
  clear_route_cache?: boolean;
}
export interface ImmediateResponse {
  status?: { code?: number };
  headers?: HeaderMutation;
  body?: Buffer;
  details?: string;
}
/** A google.protobuf.Struct as protobufjs hands it over (camelCase kinds). */
export interface StructValue {
  fields?: Record<string, ProtoValue>;
}
export interface ProtoValue {
  stringValue?: string;
  numberValue?: number;
  boolValue?: boolean;
  structValue?: StructValue;
  listValue?: { values?: ProtoValue[] };
  kind?: string;
}
export interface ProcessingResponse {
  response?:
    | "request_headers"
    | "response_headers"
    | "request_body"
    | "response_body"
    | "request_trailers"
    | "response_trailers"
    | "immediate_response";
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: { header_mutation?: HeaderMutation };
  response_trailers?: { header_mutation?: HeaderMutation };
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: StructValue;
}
