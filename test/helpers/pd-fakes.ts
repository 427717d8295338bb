/**
 * Scripted vLLM stand-ins for the P/D leg tests (gateway and sidecar), until simulated replicas play
 * the roles: a prefiller that answers a one-token prefill with vLLM NixlConnector's
 * kv_transfer_params (an extra key included, to see it passed on verbatim), and a decoder that
 * answers JSON or SSE (usage chunk with stream_options.include_usage) reporting a cached_tokens
 * count the legs must rewrite. Both record what arrives (gateway-fakes.ts).
 */
import type { EndpointSpec } from "../../src/datalayer/endpoints.ts";
import { type FakeServer, type Handler, modelList, startFake, vllmMetrics } from "./gateway-fakes.ts";
import type { Json } from "./replica.ts";

export const PREFILL_PARAMS = {
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [[3, 4, 5]],
  remote_engine_id: "5b8f5c56-engine",
  remote_request_id: "cmpl-prefill-1",
  remote_host: "10.0.0.42",
  remote_port: 5600,
  tp_size: 1,
  remote_num_tokens: 318,
};

/** What the prefiller reports as its own prefix-cache hits; the decoder reports DECODER_CACHED. */
export const PREFILLER_CACHED = 48;
export const DECODER_CACHED = 896;

export const prefillAnswer = (params: unknown = PREFILL_PARAMS) =>
  JSON.stringify({
    id: "cmpl-prefill-1",
    object: "text_completion",
    choices: [{ index: 0, text: "x", finish_reason: "length" }],
    usage: {
      prompt_tokens: 900,
      completion_tokens: 1,
      total_tokens: 901,
      prompt_tokens_details: { cached_tokens: PREFILLER_CACHED },
    },
    kv_transfer_params: params,
  });

export const prefillOk: Handler = (_q, res) =>
  void res.writeHead(200, { "content-type": "application/json" }).end(prefillAnswer());

const usage = (cached: number) => ({
  prompt_tokens: 900,
  completion_tokens: 2,
  total_tokens: 902,
  prompt_tokens_details: { cached_tokens: cached },
});

/** The decoder's answer to `body`: SSE when it streams (usage chunk on include_usage), else JSON. */
export const decodeOk: Handler = (_q, res, raw) => {
  const b = JSON.parse(raw.toString()) as Json;
  if (b.stream) {
    res.writeHead(200, { "content-type": "text/event-stream" });
    const chunk = (o: object) => res.write(`data: ${JSON.stringify(o)}\n\n`);
    chunk({ id: "d", choices: [{ index: 0, text: "he" }], usage: null });
    chunk({ id: "d", choices: [{ index: 0, text: "llo" }], usage: null });
    if (b.stream_options?.include_usage) chunk({ id: "d", choices: [], usage: usage(DECODER_CACHED) });
    res.end("data: [DONE]\n\n");
    return;
  }
  const text = JSON.stringify({
    id: "d",
    object: "text_completion",
    choices: [{ index: 0, text: "hello", finish_reason: "length" }],
    usage: usage(DECODER_CACHED),
  });
  res
    .writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
    .end(text);
};

/** A fake replica serving /metrics and /v1/models ("m"), and `gen` on both generation routes. */
export function fakeReplica(gen: Handler): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics()),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": gen,
    "POST /v1/chat/completions": gen,
  });
}

/** The recorded generation requests of a fake, bodies parsed. */
export const generations = (f: FakeServer) =>
  f.requests
    .filter((r) => r.method === "POST")
    .map((r) => ({ headers: r.headers, body: JSON.parse(r.body.toString()) as Json }));

/** An endpoint spec with the llm-d.ai/role label. */
export const roleSpec = (f: FakeServer, role: string): EndpointSpec => ({
  id: f.id,
  host: "127.0.0.1",
  port: f.port,
  labels: { "llm-d.ai/role": role },
  kvEvents: null,
});

/** A prompt the pd.yaml decider (nonCachedTokens 16) always splits, and one it never does. */
export const LONG_PROMPT = `summarise this: ${"an entirely uncached and rather long passage of text ".repeat(40)}`;
export const SHORT_PROMPT = "hi";

/** The sum of the samples named `name` whose labels include `labels` (0 when there are none). */
export function sampleValue(
  families: Map<string, { samples: Array<{ name: string; labels: Record<string, string>; value: number }> }>,
  name: string,
  labels: Record<string, string> = {},
): number {
  let sum = 0;
  for (const f of families.values())
    for (const s of f.samples)
      if (s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  return sum;
}
