/**
 * The fuzz properties (fast-check): for each input kvgate takes from outside — OpenAI request bodies
 * and headers, SSE from an upstream, Prometheus text, KV-event frames (both msgpack layouts, both
 * decoders), EndpointPickerConfig YAML, endpoints files — arbitrary and mutated-valid input either
 * works or is refused with that input's own error type (a GatewayError with a 4xx/503 status, a
 * PromParseError, an ExtractError, a KVEventDecodeError, a ConfigError, an EndpointConfigError);
 * anything else (a TypeError, a RangeError, a hang) is a bug. test/fuzz.test.ts runs them seeded and
 * bounded; `npm run fuzz` runs them long and prints the case counts. The end-to-end properties
 * (HTTP through a live gateway, ext_proc streams) are in test/fuzz-e2e.test.ts.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { EndpointConfigError, parseEndpointsFile } from "../../src/datalayer/endpoints.ts";
import { ExtractError, extractMetrics } from "../../src/datalayer/extract.ts";
import { PromParseError, parsePromText } from "../../src/datalayer/prom-text.ts";
import { GatewayError } from "../../src/gateway/errors.ts";
import { UsageScanner } from "../../src/gateway/ext-proc/response-body.ts";
import { type ApiRoute, parseRequestBody } from "../../src/gateway/request-body.ts";
import { decodeEventBatch, encodeEventBatch, KVEventDecodeError } from "../../src/kv/event-codec.ts";
import { decodeEventBatchFast } from "../../src/kv/precise-decode.ts";
import { loadConfig } from "../../src/scheduler/config.ts";
import { ConfigError } from "../../src/scheduler/errors.ts";
import { randomBatch, rng } from "../helpers/kv-event-fixtures.ts";

/** A property and how many runs the bounded suite gives it. */
export interface FuzzProperty {
  name: string;
  property: fc.IRawProperty<unknown>;
  runs: number;
}

/** Throws unless `fn` returns or throws one of `allowed`. */
export function refusedCleanly(fn: () => unknown, ...allowed: Array<new (...a: never[]) => Error>): void {
  try {
    fn();
  } catch (err) {
    if (allowed.some((A) => err instanceof A)) return;
    throw new Error(`unexpected ${(err as Error)?.constructor?.name}: ${(err as Error)?.stack ?? err}`);
  }
}

// ---- OpenAI request bodies --------------------------------------------------------------------

const anyJson = fc.jsonValue({ maxDepth: 3 });
const weird = fc.oneof(
  anyJson,
  fc.string(),
  fc.integer(),
  fc.constantFrom(null, true, false, -1, 0, 1e308, Number.MAX_SAFE_INTEGER + 2, "", " ", "\u0000"),
);
const part = fc.record(
  { type: fc.oneof(fc.constantFrom("text", "image_url", "input_audio", "file"), weird), text: weird },
  { requiredKeys: [] },
);
const message = fc.record(
  {
    role: fc.oneof(fc.constantFrom("system", "user", "assistant", "tool"), weird),
    content: fc.oneof(fc.string(), fc.array(fc.oneof(part, weird), { maxLength: 4 }), weird),
    name: weird,
    tool_calls: weird,
  },
  { requiredKeys: [] },
);
const prompt = fc.oneof(
  fc.string(),
  fc.array(fc.string(), { maxLength: 4 }),
  fc.array(fc.integer({ min: -5, max: 300_000 }), { maxLength: 8 }),
  fc.array(fc.array(fc.integer({ min: -5, max: 300_000 }), { maxLength: 4 }), { maxLength: 3 }),
  weird,
);
/** OpenAI-shaped request objects whose every field may have the wrong type. */
export const requestObject = fc.record(
  {
    model: fc.oneof(fc.constantFrom("m", "other", " "), weird),
    messages: fc.oneof(fc.array(message, { maxLength: 5 }), weird),
    prompt,
    input: prompt,
    stream: fc.oneof(fc.boolean(), weird),
    max_tokens: fc.oneof(fc.integer({ min: -3, max: 100_000 }), weird),
    max_completion_tokens: weird,
    cache_salt: weird,
    tools: fc.oneof(fc.array(anyJson, { maxLength: 3 }), weird),
    add_generation_prompt: weird,
    add_special_tokens: weird,
    stream_options: weird,
    kv_transfer_params: weird,
  },
  { requiredKeys: [] },
);

/** Bytes of a request: a shaped object, any JSON, or either cut, spliced or flipped. */
export const requestBytes = fc.oneof(
  requestObject.map((o) => Buffer.from(JSON.stringify(o))),
  anyJson.map((o) => Buffer.from(JSON.stringify(o) ?? "")),
  fc.tuple(requestObject, fc.nat(), fc.uint8Array({ maxLength: 8 })).map(([o, at, junk]) => {
    const b = Buffer.from(JSON.stringify(o));
    const i = b.length ? at % b.length : 0;
    return Buffer.concat([b.subarray(0, i), Buffer.from(junk), b.subarray(i + junk.length)]);
  }),
  fc.uint8Array({ maxLength: 64 }).map((u) => Buffer.from(u)),
);

export const apiRoute = fc.constantFrom<ApiRoute>("chat", "completions", "embeddings");

const requestBody: FuzzProperty = {
  name: "request bodies: parsed, or a GatewayError 400 naming the problem",
  runs: 400,
  property: fc.property(apiRoute, requestBytes, (route, bytes) => {
    try {
      parseRequestBody(route, bytes);
    } catch (err) {
      if (!(err instanceof GatewayError)) throw err;
      assert.equal(err.status, 400);
      assert.ok(err.message.length > 0);
    }
  }),
};

// ---- SSE from upstream (the usage scanner both front ends run on every response chunk) ----------

const sseEvent = fc.oneof(
  fc.constant('data: {"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}\n\n'),
  fc.string().map((s) => `data: ${s}\n\n`),
  fc.constant("data: [DONE]\n\n"),
  fc.string(),
  fc.constantFrom(": keep-alive\n\n", "event: x\n", "\r\n", 'data: {"usage":{"prompt_tokens":1e999}}\n\n'),
);
const sse: FuzzProperty = {
  name: "SSE from upstream, chunked anywhere: the usage scanner never throws and reads only finite counts",
  runs: 300,
  property: fc.property(
    fc.array(sseEvent, { maxLength: 12 }),
    fc.array(fc.nat(), { maxLength: 6 }),
    (evs, cuts) => {
      const all = Buffer.from(evs.join(""), "latin1");
      const s = new UsageScanner();
      let at = 0;
      for (const c of cuts) {
        const end = Math.min(all.length, at + (c % 97));
        s.push(all.subarray(at, end));
        at = end;
      }
      s.push(all.subarray(at));
      for (const v of [s.promptTokens, s.completionTokens])
        assert.ok(v === null || (Number.isSafeInteger(v) && v >= 0), `usage count ${v}`);
    },
  ),
};

// ---- Prometheus text ------------------------------------------------------------------------------

const VALID_PROM = [
  "# HELP vllm:num_requests_running Number of requests in model execution batches.",
  "# TYPE vllm:num_requests_running gauge",
  'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
  "# TYPE vllm:num_requests_waiting gauge",
  'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
  'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
  'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",num_cpu_blocks="None"} 1.0',
  "# TYPE vllm:prefix_cache_queries counter",
  'vllm:prefix_cache_queries_total{engine="0"} 1.5e3',
  'vllm:prefix_cache_hits_total{engine="0"} +Inf',
  'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 4 1712345678000',
].join("\n");
const promText = fc.oneof(
  fc.string({ unit: "binary", maxLength: 300 }),
  fc.tuple(fc.nat(), fc.nat({ max: 6 }), fc.string({ maxLength: 6 })).map(([at, del, ins]) => {
    const i = at % VALID_PROM.length;
    return VALID_PROM.slice(0, i) + ins + VALID_PROM.slice(i + del);
  }),
  fc
    .array(fc.constantFrom(...VALID_PROM.split("\n"), "{", "}", '"', "\\", " ", "NaN", "\n"), {
      maxLength: 20,
    })
    .map((a) => a.join("")),
);
const prom: FuzzProperty = {
  name: "Prometheus text: lenient parse never throws, strict throws only PromParseError, extraction only ExtractError",
  runs: 400,
  property: fc.property(promText, (text) => {
    const r = parsePromText(text, { lenient: true });
    assert.ok(r.skippedLines >= r.errors.length);
    refusedCleanly(() => parsePromText(text), PromParseError);
    refusedCleanly(() => {
      const m = extractMetrics(r.families);
      for (const v of [m.waitingQueueSize, m.runningRequestsSize, m.kvCacheUsagePercent])
        assert.ok(Number.isFinite(v) && v >= 0, `extracted ${v}`);
    }, ExtractError);
  }),
};

// ---- KV-event frames ------------------------------------------------------------------------------

const frame = fc.oneof(
  fc.uint8Array({ maxLength: 200 }),
  fc
    .tuple(
      fc.integer(),
      fc.constantFrom<"array" | "map">("array", "map"),
      fc.nat(),
      fc.nat({ max: 8 }),
      fc.uint8Array({ maxLength: 6 }),
    )
    .map(([seed, format, at, del, ins]) => {
      const b = encodeEventBatch(randomBatch(rng(seed), 4), format);
      const i = b.length ? at % b.length : 0;
      const out = new Uint8Array(b.length - Math.min(del, b.length - i) + ins.length);
      out.set(b.subarray(0, i));
      out.set(ins, i);
      out.set(b.subarray(i + Math.min(del, b.length - i)), i + ins.length);
      return out;
    }),
);
const kvFrames: FuzzProperty = {
  name: "KV-event frames (array and map layouts, mutated): both decoders agree or refuse with KVEventDecodeError",
  runs: 400,
  property: fc.property(frame, (buf) => {
    let slow: unknown;
    let slowErr: unknown = null;
    try {
      slow = decodeEventBatch(buf);
    } catch (err) {
      if (!(err instanceof KVEventDecodeError)) throw err;
      slowErr = err;
    }
    let fast: unknown;
    try {
      fast = decodeEventBatchFast(buf);
    } catch (err) {
      if (!(err instanceof KVEventDecodeError)) throw err;
      assert.ok(
        slowErr !== null,
        `the fast decoder refused what the reference decoded: ${(err as Error).message}`,
      );
      return;
    }
    assert.equal(slowErr, null, "the fast decoder accepted what the reference refused");
    assert.deepEqual(fast, slow);
  }),
};

// ---- EndpointPickerConfig YAML ----------------------------------------------------------------------

const CONFIG = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters: { blockSizeTokens: 16, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250 }
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: { maxNumOfEndpoints: 1 }
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: max-score-picker
`;
const yamlScalar = fc.oneof(
  fc.constantFrom(
    "-1",
    "0",
    "1e309",
    ".nan",
    "~",
    "[]",
    "{}",
    "''",
    "true",
    "*a",
    "&a x",
    "!!binary AA==",
    "9007199254740993",
  ),
  fc.string({ maxLength: 8 }),
);
const configText = fc.oneof(
  // A value replaced: every `: x` and `- x` position gets an odd scalar.
  fc.tuple(fc.nat(), yamlScalar).map(([k, v]) => {
    const spots = [...CONFIG.matchAll(/(: |- )([^\n{]+)/g)];
    const m = spots[k % spots.length];
    const at = (m.index ?? 0) + m[1].length;
    return CONFIG.slice(0, at) + v + CONFIG.slice(at + m[2].length);
  }),
  // Lines dropped or duplicated.
  fc.array(fc.nat(), { minLength: 1, maxLength: 3 }).map((ks) => {
    const lines = CONFIG.split("\n");
    for (const k of ks)
      lines.splice(k % lines.length, 1, ...(k % 2 ? [] : [lines[k % lines.length], lines[k % lines.length]]));
    return lines.join("\n");
  }),
  fc.string({ maxLength: 200 }),
  anyJson.map((v) => JSON.stringify(v) ?? ""),
);
const config: FuzzProperty = {
  name: "EndpointPickerConfig YAML (mutated valid, arbitrary): loads or a ConfigError",
  runs: 300,
  property: fc.property(configText, (text) => refusedCleanly(() => loadConfig(text), ConfigError)),
};

// ---- endpoints files --------------------------------------------------------------------------------

const ENDPOINTS = `- address: 10.0.0.1:8000
  labels: { llm-d.ai/role: decode, zone: a }
  kvEvents: tcp://10.0.0.1:5557
  kvEventsReplay: tcp://10.0.0.1:5558
- address: "[::1]:8001"
- 10.0.0.2:8000
`;
const endpointsText = fc.oneof(
  fc.tuple(fc.nat(), yamlScalar).map(([k, v]) => {
    const spots = [...ENDPOINTS.matchAll(/(: |- )([^\n{]+)/g)];
    const m = spots[k % spots.length];
    const at = (m.index ?? 0) + m[1].length;
    return ENDPOINTS.slice(0, at) + v + ENDPOINTS.slice(at + m[2].length);
  }),
  fc.string({ maxLength: 120 }),
  anyJson.map((v) => JSON.stringify(v) ?? ""),
  fc
    .array(
      fc.record(
        { address: weird, labels: weird, kvEvents: weird, kvEventsReplay: weird },
        { requiredKeys: [] },
      ),
      { maxLength: 3 },
    )
    .map((v) => JSON.stringify(v)),
);
const endpoints: FuzzProperty = {
  name: "endpoints files (mutated valid, arbitrary): parsed to valid host:port ids, or an EndpointConfigError",
  runs: 300,
  property: fc.property(endpointsText, (text) =>
    refusedCleanly(() => {
      for (const s of parseEndpointsFile(text, "endpoints.yaml"))
        assert.match(s.id, /^(\[[0-9a-fA-F:.]+\]|[^\s:[\]]+):\d{1,5}$/, `endpoint id ${s.id}`);
    }, EndpointConfigError),
  ),
};

export const PURE_PROPERTIES: FuzzProperty[] = [requestBody, sse, prom, kvFrames, config, endpoints];
