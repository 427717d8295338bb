/**
 * ext_proc test clients for `kvgate epp`: one built from kvgate's own minimal protos, one from the
 * FULL upstream Envoy protos that ship in @grpc/grpc-js-xds (deps/envoy-api with its imports). That
 * npm copy predates FULL_DUPLEX_STREAMED: it lacks BodyMutation.streamed_response = 3 with
 * StreamedBodyResponse, ProcessingRequest.protocol_config = 11 with ProtocolConfiguration,
 * BodySendMode FULL_DUPLEX_STREAMED = 4 (and GRPC = 5), and HttpBody's end_of_stream_without_message = 3 and
 * grpc_message_compressed = 4. upstreamRoot() adds exactly those, with upstream's names
 * and numbers (envoyproxy/data-plane-api @84e84367), through protobufjs reflection (the same loader
 * the Envoy-like proxy uses, src/bench/ext-proc/protos.ts), so a client
 * decodes what current Envoy would. Plus a call wrapper that collects responses and the final status,
 * builders for the messages Envoy sends, and a pool of fake replicas with an EPP in front.
 */

import { accessSync } from "node:fs";
import { join } from "node:path";
import {
  type ClientDuplexStream,
  credentials,
  type GrpcObject,
  loadPackageDefinition,
  type ServiceClientConstructor,
  type StatusObject,
} from "@grpc/grpc-js";
import { fromJSON } from "@grpc/proto-loader";
import protobuf from "protobufjs";
import { loadUpstreamRoot } from "../../src/bench/ext-proc/protos.ts";
import { type EppHandle, type EppOptions, startEpp } from "../../src/gateway/ext-proc/epp.ts";
import type { PbStruct, ProcessingResponse } from "../../src/gateway/ext-proc/proto.ts";
import { EXT_PROC_PROTO, LOADER_OPTIONS, PROTO_ROOT } from "../../src/gateway/ext-proc/proto.ts";
import { defaultConfigText } from "../../src/gateway/routing.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./gateway-fakes.ts";

function rootFrom(dirs: string[]): protobuf.Root {
  const root = new protobuf.Root();
  const original = root.resolvePath.bind(root);
  root.resolvePath = (origin, target) => {
    for (const d of dirs) {
      const p = join(d, target);
      try {
        accessSync(p);
        return p;
      } catch {}
    }
    return original(origin, target);
  };
  root.loadSync(EXT_PROC_PROTO, { keepCase: true });
  root.resolveAll();
  return root;
}

/** The upstream protos from @grpc/grpc-js-xds, with the newer pieces added (see the header). */
export function upstreamRoot(): protobuf.Root {
  return loadUpstreamRoot();
}

/** kvgate's own protos. */
export function kvgateRoot(): protobuf.Root {
  return rootFrom([PROTO_ROOT]);
}

export function clientCtor(root: protobuf.Root): ServiceClientConstructor {
  const pkg = loadPackageDefinition(fromJSON(root.toJSON(), LOADER_OPTIONS)) as GrpcObject;
  const v3 = (((pkg.envoy as GrpcObject).service as GrpcObject).ext_proc as GrpcObject).v3 as GrpcObject;
  return v3.ExternalProcessor as ServiceClientConstructor;
}

export type Req = Record<string, unknown>;

/** One Process stream: send Envoy's messages, await kvgate's answers, read the final status. */
export class ExtProcCall {
  readonly responses: ProcessingResponse[] = [];
  readonly status: Promise<StatusObject>;
  readonly call: ClientDuplexStream<Req, ProcessingResponse>;
  #wake: (() => void) | null = null;
  #ended = false;

  constructor(client: InstanceType<ServiceClientConstructor>) {
    this.call = client.Process() as ClientDuplexStream<Req, ProcessingResponse>;
    this.call.on("data", (r: ProcessingResponse) => {
      this.responses.push(r);
      this.#wake?.();
    });
    this.call.on("error", () => {});
    this.status = new Promise((resolve) =>
      this.call.on("status", (s: StatusObject) => {
        this.#ended = true;
        this.#wake?.();
        resolve(s);
      }),
    );
  }

  send(...msgs: Req[]): this {
    for (const m of msgs) this.call.write(m);
    return this;
  }

  /** Resolves once at least `n` responses have arrived (rejects after `ms` or when the call ends). */
  async waitFor(n: number, ms = 5000): Promise<ProcessingResponse[]> {
    const deadline = Date.now() + ms;
    while (this.responses.length < n) {
      if (this.#ended) throw new Error(`stream ended after ${this.responses.length} of ${n} responses`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out with ${this.responses.length} of ${n} responses`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, left);
        this.#wake = () => {
          clearTimeout(t);
          r();
        };
      });
    }
    return this.responses;
  }

  end(): void {
    this.call.end();
  }
}

export function connect(
  ctor: ServiceClientConstructor,
  port: number,
  cert: string | null,
): InstanceType<ServiceClientConstructor> {
  const creds = cert ? credentials.createSsl(Buffer.from(cert)) : credentials.createInsecure();
  const opts = cert ? { "grpc.ssl_target_name_override": "localhost" } : {};
  return new ctor(`127.0.0.1:${port}`, creds, opts);
}

export function headerMap(h: Record<string, string>): { headers: Array<{ key: string; raw_value: Buffer }> } {
  return { headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) };
}

export const requestHeaders = (h: Record<string, string>, end = false): Req => ({
  request_headers: { headers: headerMap(h), end_of_stream: end },
});
export const requestBody = (body: Buffer | string, end: boolean): Req => ({
  request_body: { body: Buffer.from(body), end_of_stream: end },
});
export const responseHeaders = (h: Record<string, string>, served?: string, end = false): Req => ({
  response_headers: { headers: headerMap(h), end_of_stream: end },
  ...(served
    ? {
        metadata_context: {
          filter_metadata: { "envoy.lb": structOf({ "x-gateway-destination-endpoint-served": served }) },
        },
      }
    : {}),
});
export const responseBody = (body: Buffer | string, end: boolean): Req => ({
  response_body: { body: Buffer.from(body), end_of_stream: end },
});

/** A google.protobuf.Struct (camelCase kinds, as protobufjs's built-in definition has them). */
export function structOf(o: Record<string, string | string[]>): PbStruct {
  const fields: PbStruct["fields"] = {};
  for (const [k, v] of Object.entries(o))
    fields[k] = Array.isArray(v)
      ? { listValue: { values: v.map((s) => ({ stringValue: s })) } }
      : { stringValue: v };
  return { fields };
}

/** The header mutation's set_headers as a name → value map (raw_value preferred, as Envoy reads it). */
export function setHeaders(
  m: { set_headers?: Array<{ header: { key?: string; value?: string; raw_value?: Buffer } }> } | undefined,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const o of m?.set_headers ?? [])
    out[o.header.key ?? ""] = o.header.raw_value?.length
      ? o.header.raw_value.toString()
      : (o.header.value ?? "");
  return out;
}

/** The envoy.lb destination in a response's dynamic metadata. */
export function lbDestination(r: ProcessingResponse): string | undefined {
  return r.dynamic_metadata?.fields?.["envoy.lb"]?.structValue?.fields?.["x-gateway-destination-endpoint"]
    ?.stringValue;
}

/** Fake vLLM replicas (metrics and model list only: ext_proc never forwards) and an EPP in front. */
export async function startPool(
  n: number,
  load: { waiting?: number; kv?: number } = {},
  models: string[] = ["m"],
  metricsOk = true,
  /** Loopback addresses to listen on, one per replica (default 127.0.0.1 for all). */
  hosts: string[] = [],
): Promise<FakeServer[]> {
  return Promise.all(
    Array.from({ length: n }, (_, i) =>
      startFake(
        {
          "GET /metrics": (_q, res) =>
            void (metricsOk ? res.writeHead(200).end(vllmMetrics(load)) : res.writeHead(500).end()),
          "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList(...models)),
        },
        0,
        hosts[i] ?? "127.0.0.1",
      ),
    ),
  );
}

export async function startTestEpp(pool: FakeServer[], opts: Partial<EppOptions> = {}): Promise<EppHandle> {
  const epp = await startEpp({
    ...(opts.source ? {} : { endpoints: pool.map((f) => f.id).join(",") }),
    grpcHost: "127.0.0.1",
    grpcPort: 0,
    grpcHealthPort: 0,
    metricsPort: 0,
    scrapeIntervalMs: 20,
    readyPollMs: 20,
    seed: 7,
    log: () => {},
    ...opts,
  });
  if (opts.endpoints === undefined && opts.source === undefined)
    await waitFor(
      () => epp.gateway.data.store.all().every((r) => r.modelIds !== null || r.health === "unhealthy"),
      "every replica scraped",
    );
  return epp;
}

/** In-flight requests the scheduler's inflight-load-producer counts on `id`. */
export function inFlight(epp: EppHandle, id: string): number {
  const v = epp.gateway.routing.scheduler.endpointViews(id)["inflight-load-producer"];
  return Number(v?.inFlightRequests ?? Number.NaN);
}

export const CHAT_PATH = {
  ":method": "POST",
  ":path": "/v1/chat/completions",
  "content-type": "application/json",
};

export function chatBody(content: string, model = "m", stream = true): string {
  return JSON.stringify({ model, messages: [{ role: "user", content }], stream, max_tokens: 8 });
}

/**
 * The three EPPs the interop tests drive (ext-proc-server in FULL_DUPLEX_STREAMED, ext-proc-buffered
 * in BUFFERED): `epp` over three replicas with two picks per decision and a rewrite friendly → m,
 * `busyEpp` over one saturated replica with the sheddable objective `batch`, `sickEpp` over one
 * replica whose /metrics fails (never ready).
 */
export interface InteropFixture {
  pool: FakeServer[];
  busy: FakeServer[];
  epp: EppHandle;
  busyEpp: EppHandle;
  sickEpp: EppHandle;
  close(): Promise<void>;
}

export async function startInteropFixture(): Promise<InteropFixture> {
  const config = defaultConfigText();
  const twoPicks = config.replace(
    "- type: max-score-picker\n",
    "- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}\n",
  );
  const objectives = `${config}---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: batch}\nspec: {priority: -1}\n`;
  const [pool, busy, sick] = await Promise.all([
    startPool(3),
    startPool(1, { waiting: 100, kv: 0.95 }),
    startPool(1, {}, ["m"], false),
  ]);
  const [epp, busyEpp, sickEpp] = await Promise.all([
    startTestEpp(pool, {
      config: twoPicks,
      resources: () => ({
        objectives: new Map(),
        rewrites: [
          {
            name: "alias",
            createdAtMs: 1,
            rules: [{ matches: ["friendly"], targets: [{ model: "m", weight: null }] }],
          },
        ],
      }),
    }),
    startTestEpp(busy, { config: objectives }),
    startTestEpp(sick),
  ]);
  return {
    pool,
    busy,
    epp,
    busyEpp,
    sickEpp,
    async close() {
      await Promise.all([epp, busyEpp, sickEpp].map((e) => e.close()));
      await Promise.all([...pool, ...busy, ...sick].map((f) => f.close()));
    },
  };
}
