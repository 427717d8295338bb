/**
 * Bad input to the simulated replica: each case gets its status and vLLM-style error JSON
 * ({"error": {message, type, param, code}}), and the replica keeps serving afterwards, including
 * after raw garbage on the socket and after a failure in the middle of a stream.
 */
import assert from "node:assert/strict";
import { connect } from "node:net";
import { after, before, test } from "node:test";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import type { Tokenizer } from "../src/engine/tokenizer.ts";
import {
  type Json,
  parseSse,
  postJson,
  startTestReplica,
  type TestReplica,
  waitFor,
} from "./helpers/replica.ts";

let r: TestReplica;
before(async () => {
  r = await startTestReplica({
    servedModelName: "sim-model",
    maxModelLen: 1024,
    maxRequestBodyBytes: 64 * 1024,
  });
});
after(() => r.close());

function assertError(
  res: { status: number; body: Json },
  status: number,
  type?: string,
  param?: string | null,
) {
  assert.equal(res.status, status, JSON.stringify(res.body));
  const e = res.body.error;
  assert.ok(e, `no error object in ${JSON.stringify(res.body)}`);
  assert.equal(typeof e.message, "string");
  assert.equal(e.code, status);
  assert.equal(typeof e.type, "string");
  assert.ok("param" in e);
  if (type) assert.equal(e.type, type);
  if (param !== undefined) assert.equal(e.param, param);
}

const cmpl = (body: unknown) => postJson(`${r.url}/v1/completions`, body);
const chat = (body: unknown) => postJson(`${r.url}/v1/chat/completions`, body);

test("malformed JSON and non-object bodies → 400", async () => {
  assertError(await cmpl("{not json"), 400, "BadRequestError");
  assertError(await cmpl("[1,2,3]"), 400, "BadRequestError");
  assertError(await cmpl(""), 400, "BadRequestError");
  assertError(await chat("null"), 400, "BadRequestError");
});

test("missing or mistyped fields → 400 naming the field", async () => {
  assertError(await cmpl({ max_tokens: 3 }), 400, "BadRequestError", "prompt");
  assertError(await cmpl({ prompt: 42 }), 400, "BadRequestError", "prompt");
  assertError(await cmpl({ prompt: [1, "a"] }), 400, "BadRequestError", "prompt");
  assertError(await cmpl({ prompt: [-1, 2] }), 400, "BadRequestError", "prompt");
  assertError(await cmpl({ prompt: "x", max_tokens: 0 }), 400, "BadRequestError", "max_tokens");
  assertError(await cmpl({ prompt: "x", max_tokens: 1.5 }), 400, "BadRequestError", "max_tokens");
  assertError(await cmpl({ prompt: "x", max_tokens: "10" }), 400, "BadRequestError", "max_tokens");
  assertError(await cmpl({ prompt: "x", stream: "yes" }), 400, "BadRequestError", "stream");
  assertError(await cmpl({ prompt: "x", temperature: "hot" }), 400, "BadRequestError", "temperature");
  assertError(await cmpl({ prompt: "x", n: 0 }), 400, "BadRequestError", "n");
  assertError(
    await cmpl({ prompt: "x", stream_options: { include_usage: true } }),
    400,
    "BadRequestError",
    "stream_options",
  );
  assertError(await cmpl({ prompt: "x", priority: 5 }), 400, "BadRequestError", "priority");
  assertError(await cmpl({ prompt: "x", cache_salt: "" }), 400, "BadRequestError", "cache_salt");
  assertError(
    await cmpl({ prompt: "x", max_tokens: 2, min_tokens: 5 }),
    400,
    "BadRequestError",
    "min_tokens",
  );
  assertError(await chat({ messages: "hello" }), 400, "BadRequestError", "messages");
  assertError(await chat({}), 400, "BadRequestError", "messages");
  assertError(await chat({ messages: [{ content: "no role" }] }), 400, "BadRequestError");
  assertError(await chat({ messages: [{ role: "user", content: 5 }] }), 400, "BadRequestError");
  assertError(
    await chat({ messages: [{ role: "user", content: "x" }], max_completion_tokens: -1 }),
    400,
    "BadRequestError",
  );
});

test("token ids outside the vocabulary → 400", async () => {
  assertError(await cmpl({ prompt: [1, 2, 10_000_000] }), 400, "BadRequestError", "prompt");
  assertError(
    await postJson(`${r.url}/detokenize`, { tokens: [10_000_000] }),
    400,
    "BadRequestError",
    "tokens",
  );
  assertError(await postJson(`${r.url}/detokenize`, { tokens: "abc" }), 400, "BadRequestError", "tokens");
  assertError(await postJson(`${r.url}/tokenize`, { prompt: 3 }), 400, "BadRequestError", "prompt");
});

test("a prompt over --max-model-len → 400 with vLLM's context-length message", async () => {
  const long = await cmpl({ prompt: Array.from({ length: 1100 }, (_, i) => 100 + i), max_tokens: 1 });
  assertError(long, 400, "BadRequestError");
  assert.match(long.body.error.message, /maximum context length is 1024 tokens/);
  assert.match(long.body.error.message, /1100/);
  const tooMany = await cmpl({ prompt: Array.from({ length: 1000 }, (_, i) => 100 + i), max_tokens: 100 });
  assertError(tooMany, 400, "BadRequestError");
  assert.match(
    tooMany.body.error.message,
    /maximum context length is 1024 tokens\. However, you requested 1100 tokens/,
  );
});

test("unknown model → 404 NotFoundError", async () => {
  const res = await chat({ model: "gpt-17", messages: [{ role: "user", content: "x" }] });
  assertError(res, 404, "NotFoundError");
  assert.equal(res.body.error.message, "The model `gpt-17` does not exist.");
});

test("unknown routes → 404, wrong methods → 405, both as error JSON", async () => {
  const a = await fetch(`${r.url}/v2/whatever`);
  assertError({ status: a.status, body: await a.json() }, 404, "NotFoundError");
  const b = await fetch(`${r.url}/v1/completions`);
  assertError({ status: b.status, body: await b.json() }, 405);
  const c = await postJson(`${r.url}/v1/models`, {});
  assertError(c, 405);
});

test("a body over the limit → 413", async () => {
  const res = await cmpl({ prompt: "x".repeat(100 * 1024) });
  assertError(res, 413);
});

test("unknown fields are ignored, like vLLM's default", async () => {
  const res = await cmpl({
    prompt: "x",
    max_tokens: 2,
    not_a_field: { deep: [1] },
    kv_transfer_params: { a: 1 },
    top_k: 5,
  });
  assert.equal(res.status, 200);
});

test("raw garbage on the socket does not take the process down", async () => {
  await new Promise<void>((resolve) => {
    const s = connect(r.port, "127.0.0.1", () => {
      s.write(
        "\x00\x01\x02 GARBAGE \r\n\r\n\xff\xfe POST /v1/completions HTTP/9.9\r\nContent-Length: -5\r\n\r\n",
      );
    });
    s.on("data", () => {});
    s.on("error", () => resolve());
    s.on("close", () => resolve());
    s.setTimeout(2000, () => s.destroy());
  });
  await new Promise<void>((resolve) => {
    const s = connect(r.port, "127.0.0.1", () => {
      s.end(
        'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"prompt":',
      );
    });
    s.on("data", () => {});
    s.on("error", () => resolve());
    s.on("close", () => resolve());
    s.setTimeout(2000, () => s.destroy());
  });
  const ok = await cmpl({ prompt: "still alive?", max_tokens: 3 });
  assert.equal(ok.status, 200);
  assert.equal(ok.body.usage.completion_tokens <= 3, true);
  const health = await fetch(`${r.url}/health`);
  assert.equal(health.status, 200);
});

test("a failure mid-stream is sent as data: {error} then [DONE], and the request is aborted", async (t) => {
  const base = createSimTokenizer();
  let explode = false;
  const flaky: Tokenizer = {
    name: "flaky",
    vocabSize: base.vocabSize,
    eosTokenId: base.eosTokenId,
    encode: (text, special) => base.encode(text, special),
    applyChatTemplate: (m, o) => base.applyChatTemplate(m, o),
    decode: (ids) => {
      if (explode && ids.length > 0) throw new Error("decoder exploded");
      return base.decode(ids);
    },
  };
  const f = await startTestReplica({ tokenizer: flaky, timeScale: 20 });
  t.after(() => f.close());
  const engine = f.server.engine;
  const streamed = fetch(`${f.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: "hello", max_tokens: 500, ignore_eos: true, stream: true }),
  });
  await waitFor(() => engine.stats().generationTokens >= 3);
  explode = true;
  const res = await streamed;
  assert.equal(res.status, 200);
  const ev = parseSse(await res.text());
  assert.equal(ev.at(-1), "[DONE]");
  const err = ev.at(-2).error;
  assert.equal(err.code, 500);
  assert.equal(err.type, "InternalServerError");
  assert.match(err.message, /decoder exploded/);
  assert.ok(ev.length >= 3, "some chunks went out before the failure");
  await waitFor(() => engine.stats().numRequestsRunning === 0);
  assert.equal(engine.stats().requestSuccess.abort, 1);

  const json = await postJson(`${f.url}/v1/completions`, { prompt: "hello", max_tokens: 3 });
  assertError(json, 500, "InternalServerError");
  explode = false;
  assert.equal((await postJson(`${f.url}/v1/completions`, { prompt: "hello", max_tokens: 3 })).status, 200);
});
