/**
 * bench:ext-proc's load generator: N concurrent ext_proc streams, each playing Envoy's side of one
 * request after another (closed loop) in FULL_DUPLEX_STREAMED: request_headers with protocol_config,
 * the chat body in `chunkBytes` pieces (end_of_stream on the last), the header reply awaited (the
 * decision: its latency runs from writing the end-of-stream chunk to receiving the reply), the
 * streamed body replies read to their end, then the response phase as Envoy would send it for a
 * non-streaming completion (response_headers with the served endpoint in `envoy.lb` metadata, one
 * response_body with usage, end_of_stream) and its replies, then a half-close.
 *
 * The big messages (body chunks, the response body) are encoded once, with the same upstream protos,
 * and written as bytes, so the load generator's CPU goes to the conversation rather than to
 * re-encoding 40 KB per request; the small per-request ones (headers, with a unique x-request-id and
 * the picked endpoint) are encoded per request.
 *
 * grpc-js multiplexes every stream of a channel on one HTTP/2 connection; the streams are spread
 * over ceil(N / streamsPerConnection) channels, each with `grpc.use_local_subchannel_pool` so it
 * really opens its own connection (as Envoy spreads ext_proc streams over its workers' pools).
 */
import { performance } from "node:perf_hooks";
import * as grpc from "@grpc/grpc-js";
import { extProcProtocol, PROCESS_PATH, type ProcessingResponse } from "./protos.ts";

export interface LoadOptions {
  target: string;
  secure: boolean;
  concurrency: number;
  /** Measured window, after the ramp and warmupMs. */
  durationMs: number;
  warmupMs: number;
  streamsPerConnection: number;
  /** The bodies' request_body messages, pre-encoded (see encodeBodies). */
  encoded: Buffer[][];
  /** A request that takes longer than this counts as an error ("timeout"). */
  requestTimeoutMs: number;
}

export interface LevelResult {
  concurrency: number;
  connections: number;
  /** Seconds until every stream had finished its first request (and the warmup had passed). */
  rampS: number;
  /** Header replies received in the measured window (which follows the ramp). */
  decisions: number;
  windowS: number;
  decisionsPerSec: number;
  latencyMs: { p50: number; p90: number; p99: number; max: number };
  /** Streams that completed every phase (in the window). */
  completed: number;
  /** Decisions over the whole level, warmup and drain included (for CPU per decision). */
  allDecisions: number;
  /** The load generator's own CPU over the level, percent of one core. */
  loadGenCpuPercent: number;
  /** Errors over the whole level: ramp, window and drain. */
  errors: Record<string, number>;
  errorCount: number;
  /** Most streams open at once. */
  maxOpenStreams: number;
}

const header = (key: string, value: string) => ({ key, raw_value: Buffer.from(value) });

const FULL_DUPLEX = 4;
const RESPONSE_BODY = Buffer.from(
  JSON.stringify({
    id: "cmpl-bench",
    object: "chat.completion",
    model: "m",
    choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }],
    usage: { prompt_tokens: 8192, completion_tokens: 16, total_tokens: 8208 },
  }),
);

let responseBodyMsg: Buffer | null = null;

interface One {
  error?: string;
  /** ms from the end-of-stream write to the header reply; null without a decision. */
  latency: number | null;
  t0: number;
}

/** One request's whole conversation on a fresh stream. */
function runOne(client: grpc.Client, chunks: Buffer[], o: LoadOptions, seq: number): Promise<One> {
  const { encodeRequest, decodeResponse } = extProcProtocol();
  const responseBody = (responseBodyMsg ??= encodeRequest({
    response_body: { body: RESPONSE_BODY, end_of_stream: true },
  }));
  const serialize = (m: Buffer | object) => (Buffer.isBuffer(m) ? m : encodeRequest(m));
  return new Promise((resolve) => {
    const call = client.makeBidiStreamRequest<Buffer | object, ProcessingResponse>(
      PROCESS_PATH,
      serialize,
      decodeResponse,
    );
    let t0 = 0;
    let latency: number | null = null;
    let served = "";
    let done = false;
    let responses = 0;
    const finish = (error?: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (error) call.cancel();
      resolve({ error, latency, t0 });
    };
    const timer = setTimeout(() => finish("timeout"), o.requestTimeoutMs);
    call.on("data", (m: ProcessingResponse) => {
      switch (m.response) {
        case "request_headers": {
          latency = performance.now() - t0;
          const dest = m.request_headers?.response?.header_mutation?.set_headers?.find(
            (h) => h.header?.key === "x-gateway-destination-endpoint",
          );
          served = dest?.header?.raw_value?.toString().split(",")[0] ?? "";
          if (!served) finish("no destination");
          return;
        }
        case "request_body": {
          const s = m.request_body?.response?.body_mutation?.streamed_response;
          if (!s) return finish("request body reply without streamed_response");
          if (!s.end_of_stream) return;
          call.write({
            response_headers: {
              headers: { headers: [header(":status", "200"), header("content-type", "application/json")] },
            },
            metadata_context: {
              filter_metadata: {
                "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: served } } },
              },
            },
          });
          call.write(responseBody);
          return;
        }
        case "response_headers":
          responses++;
          return;
        case "response_body":
          if (m.response_body?.response?.body_mutation?.streamed_response?.end_of_stream) {
            responses++;
            if (responses === 2) call.end();
          }
          return;
        case "immediate_response": {
          const ir = m.immediate_response;
          const reason = ir?.headers?.set_headers?.find(
            (h) => h.header?.key === "x-llm-d-request-dropped-reason",
          );
          const why = reason?.header?.raw_value?.toString() ?? "";
          return finish(`immediate ${ir?.status?.code ?? "?"}${why ? ` ${why}` : ""}`);
        }
        default:
          return finish(`unexpected ${m.response}`);
      }
    });
    call.on("error", (e: Error & { code?: number }) => finish(`grpc ${grpc.status[e.code ?? 2] ?? e.code}`));
    call.on("status", (s: grpc.StatusObject) => {
      if (s.code !== 0) return finish(`grpc ${grpc.status[s.code]}`);
      finish(responses === 2 ? undefined : "closed before the response phase ended");
    });
    call.write({
      request_headers: {
        headers: {
          headers: [
            header(":authority", "inference-gateway"),
            header(":path", "/v1/chat/completions"),
            header(":method", "POST"),
            header(":scheme", "http"),
            header("content-type", "application/json"),
            header("x-request-id", `bench-${seq}`),
          ],
        },
        end_of_stream: false,
      },
      metadata_context: {},
      protocol_config: { request_body_mode: FULL_DUPLEX, response_body_mode: FULL_DUPLEX },
    });
    for (let i = 0; i < chunks.length; i++) {
      if (i === chunks.length - 1) t0 = performance.now();
      call.write(chunks[i]!);
    }
  });
}

/** Runs one concurrency level: warmup, measured window, then waits for in-flight streams. */
export async function runLevel(o: LoadOptions): Promise<LevelResult> {
  const { Client } = extProcProtocol();
  const creds = o.secure
    ? grpc.credentials.createSsl(null, null, null, { rejectUnauthorized: false })
    : grpc.credentials.createInsecure();
  const connections = Math.max(1, Math.ceil(o.concurrency / o.streamsPerConnection));
  const clients = Array.from(
    { length: connections },
    () =>
      new Client(o.target, creds, {
        "grpc.use_local_subchannel_pool": 1,
        "grpc.max_receive_message_length": 64 * 1024 * 1024,
        ...(o.secure ? { "grpc.ssl_target_name_override": "kvgate-epp" } : {}),
      }),
  );
  const start = performance.now();
  // The window opens once every stream has finished its first request (all N were open at once:
  // the ramp, where 10,000 streams are "held") and warmupMs has passed.
  let from = Number.POSITIVE_INFINITY;
  let until = Number.POSITIVE_INFINITY;
  let firstDone = 0;
  const openWindow = () => {
    if (from !== Number.POSITIVE_INFINITY || firstDone < o.concurrency) return;
    from = Math.max(performance.now(), start + o.warmupMs);
    until = from + o.durationMs;
  };
  const warmupTimer = setTimeout(openWindow, o.warmupMs);
  const latencies: number[] = [];
  const errors: Record<string, number> = {};
  let completed = 0;
  let all = 0;
  const cpu0 = process.cpuUsage();
  let open = 0;
  let maxOpen = 0;
  let seq = 0;
  const worker = async (w: number) => {
    const client = clients[w % connections]!;
    let first = true;
    while (performance.now() < until) {
      const n = seq++;
      open++;
      maxOpen = Math.max(maxOpen, open);
      const r = await runOne(client, o.encoded[n % o.encoded.length]!, o, n);
      open--;
      if (r.latency !== null) all++;
      if (r.error) errors[r.error] = (errors[r.error] ?? 0) + 1; // ramp and drain included
      const decidedAt = r.latency === null ? Number.NaN : r.t0 + r.latency;
      if (decidedAt >= from && decidedAt <= until) {
        latencies.push(r.latency!);
        if (!r.error) completed++;
      }
      if (first) {
        first = false;
        firstDone++;
        openWindow();
      }
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, (_, w) => worker(w)));
  clearTimeout(warmupTimer);
  for (const c of clients) c.close();
  const cpu = process.cpuUsage(cpu0);
  const wallMs = performance.now() - start;
  const rampS = (from - start) / 1000;
  const sorted = Float64Array.from(latencies).sort();
  const at = (q: number) =>
    sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]! : NaN;
  const windowS = o.durationMs / 1000;
  return {
    concurrency: o.concurrency,
    connections,
    rampS,
    decisions: sorted.length,
    windowS,
    decisionsPerSec: sorted.length / windowS,
    latencyMs: {
      p50: at(0.5),
      p90: at(0.9),
      p99: at(0.99),
      max: sorted.length ? sorted[sorted.length - 1]! : NaN,
    },
    completed,
    allDecisions: all,
    loadGenCpuPercent: ((cpu.user + cpu.system) / 1000 / wallMs) * 100,
    errors,
    errorCount: Object.values(errors).reduce((a, b) => a + b, 0),
    maxOpenStreams: maxOpen,
  };
}
