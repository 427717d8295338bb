/**
 * The simulated replica's OpenAI-compatible surface against the real engine: JSON and SSE shapes of
 * /v1/completions and /v1/chat/completions (vLLM's chunk layout, include_usage, [DONE]), batch and
 * token-id prompts, n, request_id, return_token_ids, exact lengths, seeded determinism, and the
 * /v1/models, /health, /ping, /version, /tokenize and /detokenize endpoints.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { type Json, parseSse, postJson, startTestReplica, type TestReplica } from "./helpers/replica.ts";

let r: TestReplica;
before(async () => {
  r = await startTestReplica({ servedModelName: ["sim-model", "alias"] });
});
after(() => r.close());

const LONG = "The quick brown fox jumps over the lazy dog. ".repeat(8);

describe("completions", () => {
  test("JSON response shape and usage with cached_tokens", async () => {
    const res = await postJson(`${r.url}/v1/completions`, {
      model: "sim-model",
      prompt: LONG,
      max_tokens: 7,
      ignore_eos: true,
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type")!, /^application\/json/);
    const b = res.body;
    assert.match(b.id, /^cmpl-/);
    assert.equal(b.object, "text_completion");
    assert.equal(b.model, "sim-model");
    assert.equal(typeof b.created, "number");
    assert.equal(b.choices.length, 1);
    const c = b.choices[0];
    assert.equal(c.index, 0);
    assert.equal(typeof c.text, "string");
    assert.ok(c.text.length > 0);
    assert.equal(c.finish_reason, "length");
    assert.equal(c.stop_reason, null);
    assert.equal(c.logprobs, null);
    assert.equal(b.usage.completion_tokens, 7);
    assert.ok(b.usage.prompt_tokens > 0);
    assert.equal(b.usage.total_tokens, b.usage.prompt_tokens + 7);
    assert.equal(typeof b.usage.prompt_tokens_details.cached_tokens, "number");
  });

  test("SSE chunks: text_completion objects, finish on the last, usage chunk, [DONE]", async () => {
    const res = await postJson(`${r.url}/v1/completions`, {
      prompt: "Hello",
      max_tokens: 5,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type")!, /^text\/event-stream/);
    const ev = parseSse(res.text);
    assert.equal(ev.at(-1), "[DONE]");
    const usage = ev.at(-2);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.usage.completion_tokens, 5);
    assert.equal(typeof usage.usage.prompt_tokens_details.cached_tokens, "number");
    const chunks = ev.slice(0, -2);
    assert.equal(chunks.length, 5, "one chunk per step: one token per decode step");
    for (const ch of chunks) {
      assert.equal(ch.object, "text_completion");
      assert.equal(ch.usage, null, "include_usage puts usage: null on every chunk");
      assert.equal(ch.id, usage.id);
      assert.deepEqual(Object.keys(ch.choices[0]).sort(), [
        "finish_reason",
        "index",
        "logprobs",
        "stop_reason",
        "text",
      ]);
    }
    assert.deepEqual(
      chunks.map((c) => c.choices[0].finish_reason),
      [null, null, null, null, "length"],
    );
  });

  test("a stream without stream_options has no usage field and ends with [DONE]", async () => {
    const res = await postJson(`${r.url}/v1/completions`, {
      prompt: "Hi",
      max_tokens: 2,
      ignore_eos: true,
      stream: true,
    });
    const ev = parseSse(res.text);
    assert.equal(ev.at(-1), "[DONE]");
    assert.equal(ev.length, 2 + 1, "a chunk per token (max_tokens 2, ignore_eos), then [DONE]");
    for (const ch of ev.slice(0, -1)) assert.equal("usage" in ch, false);
  });

  test("batch prompts: a choice per prompt (× n), indexed prompt-major", async () => {
    const res = await postJson(`${r.url}/v1/completions`, {
      prompt: ["one", "two", "three"],
      n: 2,
      max_tokens: 3,
      ignore_eos: true,
    });
    assert.equal(res.status, 200);
    assert.deepEqual(
      res.body.choices.map((c: Json) => c.index),
      [0, 1, 2, 3, 4, 5],
    );
    assert.equal(res.body.usage.completion_tokens, 18);
  });

  test("token-id prompts, return_token_ids, request_id echo", async () => {
    const res = await postJson(`${r.url}/v1/completions`, {
      prompt: [11, 12, 13, 14, 15],
      max_tokens: 4,
      ignore_eos: true,
      return_token_ids: true,
      request_id: "my-req-1",
    });
    assert.equal(res.status, 200);
    assert.equal(res.body.id, "cmpl-my-req-1");
    assert.deepEqual(res.body.choices[0].prompt_token_ids, [11, 12, 13, 14, 15]);
    assert.equal(res.body.choices[0].token_ids.length, 4);
    assert.equal(res.body.usage.prompt_tokens, 5);
  });

  test("echo prepends the prompt text, streamed or not", async () => {
    const res = await postJson(`${r.url}/v1/completions`, { prompt: "Echo me", max_tokens: 2, echo: true });
    assert.ok(res.body.choices[0].text.startsWith("Echo me"));
    const st = await postJson(`${r.url}/v1/completions`, {
      prompt: "Echo me",
      max_tokens: 2,
      echo: true,
      stream: true,
    });
    assert.ok(parseSse(st.text)[0].choices[0].text.startsWith("Echo me"));
  });

  test("the same seed gives the same output; max_tokens with ignore_eos gives exact lengths", async () => {
    const body = {
      prompt: "determinism",
      max_tokens: 12,
      ignore_eos: true,
      seed: 42,
      return_token_ids: true,
    };
    const a = await postJson(`${r.url}/v1/completions`, body);
    const b = await postJson(`${r.url}/v1/completions`, body);
    const c = await postJson(`${r.url}/v1/completions`, { ...body, seed: 43 });
    assert.deepEqual(a.body.choices[0].token_ids, b.body.choices[0].token_ids);
    assert.equal(a.body.choices[0].text, b.body.choices[0].text);
    assert.notDeepEqual(a.body.choices[0].token_ids, c.body.choices[0].token_ids);
    assert.equal(a.body.choices[0].token_ids.length, 12);
  });

  test("streamed text concatenates to the non-streamed text for the same seed", async () => {
    const body = { prompt: "concat", max_tokens: 9, ignore_eos: true, seed: 7 };
    const full = await postJson(`${r.url}/v1/completions`, body);
    const st = await postJson(`${r.url}/v1/completions`, { ...body, stream: true });
    const text = parseSse(st.text)
      .slice(0, -1)
      .map((c) => c.choices[0].text)
      .join("");
    assert.equal(text, full.body.choices[0].text);
  });
});

describe("chat completions", () => {
  const messages = [
    { role: "system", content: "You are terse." },
    { role: "user", content: "Say something." },
  ];

  test("JSON response shape", async () => {
    const res = await postJson(`${r.url}/v1/chat/completions`, {
      model: "alias",
      messages,
      max_completion_tokens: 6,
      ignore_eos: true,
    });
    assert.equal(res.status, 200);
    const b = res.body;
    assert.match(b.id, /^chatcmpl-/);
    assert.equal(b.object, "chat.completion");
    assert.equal(b.model, "alias");
    const c = b.choices[0];
    assert.equal(c.message.role, "assistant");
    assert.equal(typeof c.message.content, "string");
    assert.equal(c.finish_reason, "length");
    assert.equal(c.stop_reason, null);
    assert.equal(b.usage.completion_tokens, 6);
    assert.equal(typeof b.usage.prompt_tokens_details.cached_tokens, "number");
  });

  test("SSE: role chunk first, content deltas, final chunk with finish_reason and stop_reason, usage, [DONE]", async () => {
    const res = await postJson(`${r.url}/v1/chat/completions`, {
      messages,
      max_tokens: 4,
      ignore_eos: true,
      stream: true,
      stream_options: { include_usage: true },
    });
    const ev = parseSse(res.text);
    assert.equal(ev.at(-1), "[DONE]");
    const [first, ...rest] = ev.slice(0, -2);
    assert.equal(first.object, "chat.completion.chunk");
    assert.deepEqual(first.choices, [
      { index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null },
    ]);
    assert.equal(first.usage, null);
    assert.equal(rest.length, 4);
    for (const ch of rest.slice(0, -1)) {
      assert.equal(typeof ch.choices[0].delta.content, "string");
      assert.equal(ch.choices[0].finish_reason, null);
      assert.equal("stop_reason" in ch.choices[0], false);
      assert.equal(ch.usage, null);
    }
    const last = rest.at(-1);
    assert.equal(last.choices[0].finish_reason, "length");
    assert.equal(last.choices[0].stop_reason, null);
    const usage = ev.at(-2);
    assert.deepEqual(usage.choices, []);
    assert.equal(usage.object, "chat.completion.chunk");
    assert.equal(usage.usage.completion_tokens, 4);
    assert.equal(usage.usage.total_tokens, usage.usage.prompt_tokens + 4);
  });

  test("n > 1 gives n choices, each streamed with its own role chunk", async () => {
    const res = await postJson(`${r.url}/v1/chat/completions`, {
      messages,
      n: 3,
      max_tokens: 2,
      ignore_eos: true,
      seed: 1,
    });
    assert.deepEqual(
      res.body.choices.map((c: Json) => c.index),
      [0, 1, 2],
    );
    assert.equal(res.body.usage.completion_tokens, 6);
    const st = await postJson(`${r.url}/v1/chat/completions`, {
      messages,
      n: 2,
      max_tokens: 2,
      ignore_eos: true,
      stream: true,
    });
    const roles = parseSse(st.text).filter(
      (e) => e !== "[DONE]" && e.choices[0]?.delta?.role === "assistant",
    );
    assert.deepEqual(roles.map((e) => e.choices[0].index).sort(), [0, 1]);
  });

  test("a natural stop ends with finish_reason stop and no EOS text", async () => {
    const res = await postJson(`${r.url}/v1/chat/completions`, { messages, max_tokens: 2000, seed: 3 });
    assert.equal(res.status, 200);
    const c = res.body.choices[0];
    assert.equal(c.finish_reason, "stop");
    assert.ok(res.body.usage.completion_tokens < 2000);
  });
});

describe("other endpoints", () => {
  test("/v1/models lists every served name as a vLLM ModelCard", async () => {
    const res = await fetch(`${r.url}/v1/models`);
    const b = (await res.json()) as Json;
    assert.equal(b.object, "list");
    assert.deepEqual(
      b.data.map((m: Json) => m.id),
      ["sim-model", "alias"],
    );
    const m = b.data[0];
    assert.equal(m.object, "model");
    assert.equal(m.owned_by, "vllm");
    assert.equal(m.max_model_len, 8192);
    assert.equal(m.parent, null);
    assert.equal(typeof m.root, "string");
    assert.equal(m.permission[0].object, "model_permission");
  });

  test("/health and /ping answer 200 with an empty body; /version has a version", async () => {
    for (const path of ["/health", "/ping"]) {
      const res = await fetch(`${r.url}${path}`);
      assert.equal(res.status, 200);
      assert.equal(await res.text(), "");
    }
    const v = (await (await fetch(`${r.url}/version`)).json()) as Json;
    assert.match(v.version, /^\d+\.\d+\.\d+/);
  });

  test("/tokenize (completion and chat forms) and /detokenize round-trip", async () => {
    const tk = await postJson(`${r.url}/tokenize`, { prompt: "Hello tokenizer", return_token_strs: true });
    assert.equal(tk.status, 200);
    assert.equal(tk.body.count, tk.body.tokens.length);
    assert.equal(tk.body.max_model_len, 8192);
    assert.equal(tk.body.token_strs.length, tk.body.count);
    const plain = await postJson(`${r.url}/tokenize`, {
      prompt: "Hello tokenizer",
      add_special_tokens: false,
    });
    assert.equal(plain.body.token_strs, null);
    const dt = await postJson(`${r.url}/detokenize`, { tokens: plain.body.tokens });
    assert.equal(dt.status, 200);
    assert.equal(dt.body.prompt, "Hello tokenizer");
    const chat = await postJson(`${r.url}/tokenize`, { messages: [{ role: "user", content: "hi" }] });
    assert.equal(chat.status, 200);
    assert.ok(chat.body.count > 1);
    // The chat prompt the replica generates from has the same length as /tokenize reports.
    const gen = await postJson(`${r.url}/v1/chat/completions`, {
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 1,
    });
    assert.equal(gen.body.usage.prompt_tokens, chat.body.count);
  });
});
