/**
 * The P/D request bodies (src/gateway/pd/bodies.ts) and the cached_tokens rewrite
 * (src/gateway/pd/cached-tokens.ts): the prefill body has every token limit = 1, stream false, no
 * stream_options and the remote-decode kv_transfer_params; the decode body is the original except
 * kv_transfer_params; the prefiller's answer is read as vLLM's NixlConnector returns it; the rewrite
 * changes usage.prompt_tokens_details.cached_tokens and nothing else, in JSON and in SSE split anywhere.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import {
  decodeBody,
  type JsonObject,
  type PdApi,
  pdApiOf,
  prefillBody,
  readPrefillAnswer,
  releaseBody,
  TOKEN_LIMIT_FIELDS,
} from "../src/gateway/pd/bodies.ts";
import {
  CachedTokensRewriter,
  rewriteCachedTokensJson,
  rewriteCachedTokensSse,
} from "../src/gateway/pd/cached-tokens.ts";

const REMOTE_DECODE = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
};

const api = fc.constantFrom<PdApi>("chat", "completions", "responses");
const jsonValue = fc.jsonValue({ maxDepth: 2 });
/** Request bodies with any mix of the fields the legs touch, present or absent, plus arbitrary others. */
const body = fc
  .record(
    {
      model: fc.string(),
      prompt: fc.string(),
      messages: fc.array(fc.record({ role: fc.constantFrom("user", "system"), content: fc.string() })),
      stream: fc.boolean(),
      stream_options: fc.record({ include_usage: fc.boolean() }),
      max_tokens: fc.integer({ min: 1, max: 4096 }),
      max_completion_tokens: fc.integer({ min: 1, max: 4096 }),
      min_tokens: fc.integer({ min: 0, max: 8 }),
      max_output_tokens: fc.integer({ min: 1, max: 4096 }),
      kv_transfer_params: fc.dictionary(fc.string(), jsonValue),
      temperature: fc.double({ min: 0, max: 2, noNaN: true }),
    },
    { requiredKeys: ["model"] },
  )
  .chain((b) =>
    fc.dictionary(fc.stringMatching(/^x_[a-z]{1,6}$/), jsonValue).map((extra) => ({ ...extra, ...b })),
  )
  .map((b) => JSON.parse(JSON.stringify(b)) as JsonObject); // plain objects, as the legs get them

test("prefill body: every token limit of the API is 1, stream false, no stream_options, remote-decode params; the rest unchanged", () => {
  fc.assert(
    fc.property(body, api, (b, a) => {
      const before = JSON.parse(JSON.stringify(b));
      const p = prefillBody(b as JsonObject, a);
      assert.deepEqual(b, before, "the original is not modified");
      for (const f of TOKEN_LIMIT_FIELDS[a]) assert.equal(p[f], 1, `${a}: ${f}`);
      assert.equal(p.stream, false);
      assert.equal("stream_options" in p, false);
      assert.deepEqual(p.kv_transfer_params, REMOTE_DECODE, "replaces any client value");
      const touched = new Set([...TOKEN_LIMIT_FIELDS[a], "stream", "stream_options", "kv_transfer_params"]);
      for (const [k, v] of Object.entries(b)) if (!touched.has(k)) assert.deepEqual(p[k], v, k);
      for (const k of Object.keys(p)) assert.ok(touched.has(k) || k in b, `no field invented: ${k}`);
    }),
  );
});

test("the API's limit fields: max_tokens, max_completion_tokens, min_tokens for chat and completions; max_output_tokens for responses", () => {
  const p = prefillBody({ model: "m", prompt: "hi" }, "completions");
  assert.deepEqual(
    [p.max_tokens, p.max_completion_tokens, p.min_tokens, p.max_output_tokens],
    [1, 1, 1, undefined],
  );
  const r = prefillBody({ model: "m", input: "hi", max_output_tokens: 300 }, "responses");
  assert.deepEqual([r.max_output_tokens, r.max_tokens], [1, undefined]);
  assert.equal(pdApiOf("/v1/chat/completions?x=1"), "chat");
  assert.equal(pdApiOf("/v1/responses"), "responses");
  assert.equal(pdApiOf("/v1/embeddings"), null);
});

test("decode body: the original except kv_transfer_params, which is the prefiller's object verbatim or absent", () => {
  const kv = fc.dictionary(fc.string(), jsonValue);
  fc.assert(
    fc.property(body, fc.option(kv, { nil: undefined }), (b, params) => {
      const d = decodeBody(b as JsonObject, params);
      const { kv_transfer_params: dk, ...dRest } = d;
      const { kv_transfer_params: _bk, ...bRest } = b as JsonObject;
      assert.deepEqual(dRest, bRest);
      if (params === undefined)
        assert.equal("kv_transfer_params" in d, false, "a client's value never goes on");
      else assert.equal(dk, params, "the same object, unknown keys and all");
    }),
  );
});

test("release body: one token, not streamed, with the prefiller's params", () => {
  const kv = { do_remote_prefill: true, remote_request_id: "r" };
  const r = releaseBody({ model: "m", prompt: "p", stream: true, max_tokens: 500 }, "completions", kv);
  assert.deepEqual([r.max_tokens, r.stream, r.kv_transfer_params], [1, false, kv]);
});

test("the prefiller's answer: vLLM's params (per-group block ids, unknown keys), none, or incomplete", () => {
  const params = {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [[1, 2, 4]],
    remote_engine_id: "e1101616",
    remote_request_id: "cmpl-1",
    remote_host: "10.0.0.42",
    remote_port: 5600,
    tp_size: 1,
    remote_num_tokens: 318,
  };
  const usage = { prompt_tokens: 318, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 64 } };
  assert.deepEqual(readPrefillAnswer({ kv_transfer_params: params, usage }), {
    kind: "params",
    params,
    cachedTokens: 64,
  });
  assert.deepEqual(readPrefillAnswer({ kv_transfer_params: null, usage: { prompt_tokens_details: null } }), {
    kind: "none",
    cachedTokens: 0,
  });
  assert.deepEqual(readPrefillAnswer({ choices: [] }), { kind: "none", cachedTokens: 0 });
  const { remote_host: _h, ...noHost } = params;
  const inc = readPrefillAnswer({ kv_transfer_params: noHost });
  assert.equal(inc.kind, "incomplete");
  assert.deepEqual(inc.kind === "incomplete" && inc.missing, ["remote_host"]);
});

const completion = (cached: unknown) => ({
  id: "cmpl-1",
  object: "text_completion",
  choices: [{ index: 0, text: "héllo ✓", finish_reason: "length" }],
  usage: { prompt_tokens: 900, completion_tokens: 5, total_tokens: 905, prompt_tokens_details: cached },
});

test("JSON rewrite: cached_tokens set to the prefiller's value, details created when null, the rest unchanged", () => {
  const out = JSON.parse(
    rewriteCachedTokensJson(Buffer.from(JSON.stringify(completion({ cached_tokens: 896 }))), 32).toString(),
  );
  assert.deepEqual(out, completion({ cached_tokens: 32 }));
  const made = JSON.parse(
    rewriteCachedTokensJson(Buffer.from(JSON.stringify(completion(null))), 0).toString(),
  );
  assert.deepEqual(made.usage.prompt_tokens_details, { cached_tokens: 0 });
  const notJson = Buffer.from("upstream said no");
  assert.equal(rewriteCachedTokensJson(notJson, 5), notJson, "not JSON: the same bytes");
  const noUsage = Buffer.from('{"error":{"message":"x"}}');
  assert.equal(rewriteCachedTokensJson(noUsage, 5), noUsage);
});

/** An SSE stream as vLLM sends it with include_usage: token chunks with usage null, then a usage chunk. */
function sse(cached: number | null, crlf = false): string {
  const nl = crlf ? "\r\n" : "\n";
  const chunk = (text: string) =>
    `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: text } }], usage: null })}${nl}${nl}`;
  const usage = {
    prompt_tokens: 900,
    completion_tokens: 3,
    total_tokens: 903,
    prompt_tokens_details: cached === null ? null : { cached_tokens: cached },
  };
  return `${chunk("Ünï")}${chunk("cödé ✓")}${chunk("usage")}data: ${JSON.stringify({ id: "c", choices: [], usage })}${nl}${nl}data: [DONE]${nl}${nl}`;
}

test("SSE rewrite: only the usage chunk changes, CRLF or LF, whatever the chunking", () => {
  assert.equal(rewriteCachedTokensSse(sse(896), 32), sse(32));
  assert.equal(rewriteCachedTokensSse(sse(null, true), 7), sse(7, true));
  fc.assert(
    fc.property(
      fc.boolean(),
      fc.array(fc.integer({ min: 1, max: 60 }), { minLength: 1, maxLength: 40 }),
      (crlf, sizes) => {
        const input = Buffer.from(sse(896, crlf));
        const rw = new CachedTokensRewriter(32);
        rw.start(200, true);
        const out: Buffer[] = [];
        let at = 0;
        for (let i = 0; at < input.length; i++) {
          const n = sizes[i % sizes.length] as number;
          out.push(rw.chunk(input.subarray(at, at + n))); // splits inside multi-byte characters too
          at += n;
        }
        out.push(rw.end());
        assert.equal(Buffer.concat(out).toString("utf8"), sse(32, crlf));
      },
    ),
  );
});

test("JSON through the rewriter: held to the end, then rewritten; an unterminated SSE tail is still rewritten", () => {
  const rw = new CachedTokensRewriter(3);
  rw.start(200, false);
  const whole = Buffer.from(JSON.stringify(completion({ cached_tokens: 900 })));
  assert.equal(rw.chunk(whole.subarray(0, 10)).length, 0);
  assert.equal(rw.chunk(whole.subarray(10)).length, 0);
  assert.deepEqual(JSON.parse(rw.end().toString()), completion({ cached_tokens: 3 }));
  const s = new CachedTokensRewriter(3);
  s.start(200, true);
  const line = `data: ${JSON.stringify({ usage: { prompt_tokens: 1 } })}`;
  assert.equal(s.chunk(Buffer.from(line)).length, 0);
  assert.equal(
    s.end().toString(),
    `data: ${JSON.stringify({ usage: { prompt_tokens: 1, prompt_tokens_details: { cached_tokens: 3 } } })}`,
  );
});
