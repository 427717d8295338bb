/**
 * The ext_proc wire types: loads kvgate's minimal copy of Envoy's protos (`proto/` at the repository
 * root, upstream's packages, names and field numbers) with @grpc/proto-loader, and gives TypeScript
 * shapes to the decoded messages (keepCase: snake_case fields; enums as numbers; oneofs named by a
 * virtual field). google.protobuf.Struct and Value come from protobufjs's built-in definitions, so
 * their fields stay camelCase (`stringValue`, `structValue`) even with keepCase.
 */
import { fileURLToPath } from "node:url";
import type { ServiceDefinition } from "@grpc/grpc-js";
import { loadSync, type Options } from "@grpc/proto-loader";

export const PROTO_ROOT = fileURLToPath(new URL("../../../proto", import.meta.url));
export const EXT_PROC_PROTO = "envoy/service/ext_proc/v3/external_processor.proto";
export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";

export const LOADER_OPTIONS: Options = {
  keepCase: true,
  longs: Number,
  enums: Number,
  defaults: false,
  oneofs: true,
};

/** ProcessingMode.BodySendMode (envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto). */
export const BodySendMode = {
  NONE: 0,
  STREAMED: 1,
  BUFFERED: 2,
  BUFFERED_PARTIAL: 3,
  FULL_DUPLEX_STREAMED: 4,
} as const;

/** HeaderValueOption.HeaderAppendAction. */
export const OVERWRITE_IF_EXISTS_OR_ADD = 2;

export interface HeaderValue {
  key?: string;
  value?: string;
  raw_value?: Buffer;
}
export interface HeaderMap {
  headers?: HeaderValue[];
}
export interface HeaderValueOption {
  header: HeaderValue;
  append_action?: number;
}
export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}

/** google.protobuf.Value / Struct as protobufjs decodes them (camelCase, one kind set). */
export interface PbValue {
  nullValue?: number;
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: PbStruct;
  listValue?: { values?: PbValue[] };
  kind?: string;
}
export interface PbStruct {
  fields?: Record<string, PbValue>;
}

export interface HttpHeaders {
  headers?: HeaderMap;
  end_of_stream?: boolean;
}
export interface HttpBody {
  body?: Buffer;
  end_of_stream?: boolean;
  end_of_stream_without_message?: boolean;
}
export interface HttpTrailers {
  trailers?: HeaderMap;
}

export interface ProcessingRequest {
  request?:
    | "request_headers"
    | "response_headers"
    | "request_body"
    | "response_body"
    | "request_trailers"
    | "response_trailers";
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  request_body?: HttpBody;
  response_body?: HttpBody;
  request_trailers?: HttpTrailers;
  response_trailers?: HttpTrailers;
  metadata_context?: { filter_metadata?: Record<string, PbStruct> };
  observability_mode?: boolean;
  protocol_config?: { request_body_mode?: number; response_body_mode?: number };
}

export interface BodyMutation {
  body?: Buffer;
  streamed_response?: { body: Buffer; end_of_stream: boolean };
}
export interface CommonResponse {
  status?: number;
  header_mutation?: HeaderMutation;
  body_mutation?: BodyMutation;
  clear_route_cache?: boolean;
}
export interface ImmediateResponse {
  status: { code: number };
  headers?: HeaderMutation;
  body?: Buffer;
  details?: string;
}

export interface ProcessingResponse {
  request_headers?: { response: CommonResponse };
  response_headers?: { response: CommonResponse };
  request_body?: { response: CommonResponse };
  response_body?: { response: CommonResponse };
  request_trailers?: { header_mutation?: HeaderMutation };
  response_trailers?: { header_mutation?: HeaderMutation };
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: PbStruct;
}

let cached: ServiceDefinition | null = null;

/** The ExternalProcessor service definition, for grpc-js Server.addService (loaded once). */
export function extProcService(): ServiceDefinition {
  if (cached) return cached;
  const pkg = loadSync(EXT_PROC_PROTO, { ...LOADER_OPTIONS, includeDirs: [PROTO_ROOT] });
  cached = pkg[EXT_PROC_SERVICE] as ServiceDefinition;
  return cached;
}
