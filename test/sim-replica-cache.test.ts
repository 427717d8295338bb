/**
 * Prefix caching as clients see it (usage.prompt_tokens_details.cached_tokens) and client
 * disconnects: a repeated prompt hits all its full blocks except the last token's, cache_salt
 * separates tenants, and a client that goes away mid-stream has its request aborted and its blocks
 * freed (they stay cached, so KV usage returns to 0 as vLLM counts evictable blocks as free).
 */
import assert from "node:assert/strict";
import { request } from "node:http";
import { test } from "node:test";
import { gauge } from "../src/datalayer/prom-text.ts";
import { postJson, scrapeMetrics, startTestReplica, waitFor } from "./helpers/replica.ts";

const ids = (n: number, base = 1000) => Array.from({ length: n }, (_, i) => base + i);

test("a repeated long prompt gets all its full blocks as cached_tokens; a different cache_salt gets 0", async (t) => {
  const r = await startTestReplica();
  t.after(() => r.close());
  const cmpl = (body: object) =>
    postJson(`${r.url}/v1/completions`, { max_tokens: 2, ignore_eos: true, ...body });
  for (const len of [500, 497, 496, 17, 16]) {
    const prompt = ids(len, 1000 + len * 7);
    const first = await cmpl({ prompt });
    assert.equal(first.body.usage.prompt_tokens_details.cached_tokens, 0, `first call, len ${len}`);
    const second = await cmpl({ prompt });
    const expected = Math.floor((len - 1) / 16) * 16;
    assert.equal(second.body.usage.prompt_tokens_details.cached_tokens, expected, `second call, len ${len}`);
    const salted = await cmpl({ prompt, cache_salt: "tenant-a" });
    assert.equal(salted.body.usage.prompt_tokens_details.cached_tokens, 0, `salted, len ${len}`);
    const salted2 = await cmpl({ prompt, cache_salt: "tenant-a" });
    assert.equal(
      salted2.body.usage.prompt_tokens_details.cached_tokens,
      expected,
      `same salt again, len ${len}`,
    );
    const other = await cmpl({ prompt, cache_salt: "tenant-b" });
    assert.equal(other.body.usage.prompt_tokens_details.cached_tokens, 0, `other salt, len ${len}`);
  }
});

test("chat: a shared conversation prefix is cached, streamed usage reports it", async (t) => {
  const r = await startTestReplica();
  t.after(() => r.close());
  const system = { role: "system", content: "You are a careful assistant. ".repeat(40) };
  const body = (q: string) => ({
    messages: [system, { role: "user", content: q }],
    max_tokens: 2,
    stream: true,
    stream_options: { include_usage: true },
  });
  await postJson(`${r.url}/v1/chat/completions`, body("first question"));
  const res = await postJson(`${r.url}/v1/chat/completions`, body("second question"));
  const usage = res.text
    .split("\n\n")
    .filter((l) => l.startsWith("data: {"))
    .map((l) => JSON.parse(l.slice(6)))
    .at(-1).usage;
  const sys = await postJson(`${r.url}/tokenize`, { messages: [system], add_generation_prompt: false });
  const cached = usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0 && cached % 16 === 0, `cached ${cached}`);
  assert.ok(cached <= sys.body.count, "only the shared system prefix can hit");
  assert.ok(cached >= sys.body.count - 32, `cached ${cached} of a ${sys.body.count}-token shared prefix`);
});

test("a client that disconnects mid-stream aborts its request and frees its blocks", async (t) => {
  const r = await startTestReplica({ timeScale: 20 });
  t.after(() => r.close());
  const engine = r.server.engine;
  const chunks = await new Promise<number>((resolve, reject) => {
    const req = request(
      `${r.url}/v1/completions`,
      { method: "POST", headers: { "content-type": "application/json" } },
      (res) => {
        let n = 0;
        res.on("data", (d: Buffer) => {
          n += d.toString().split("data: ").length - 1;
          if (n >= 3) {
            req.destroy();
            resolve(n);
          }
        });
        res.on("error", () => {});
      },
    );
    req.on("error", (e) => (req.destroyed ? undefined : reject(e)));
    req.end(JSON.stringify({ prompt: ids(300), max_tokens: 4000, ignore_eos: true, stream: true }));
  });
  await waitFor(() => engine.stats().numRequestsRunning === 0 && engine.stats().numRequestsWaiting === 0);
  const s = engine.stats();
  // Cut short: at least the streamed tokens (one per chunk), far fewer than the 4,000 an unaborted
  // ignore_eos request generates. The rest would take ~1.5 s of wall time here; the server sees the
  // disconnect within a poll turn (a catch-up turn runs at most 256 steps).
  assert.ok(
    s.generationTokens >= chunks && s.generationTokens < 1000,
    `${s.generationTokens} tokens generated`,
  );
  assert.equal(s.requestSuccess.abort, 1);
  assert.equal(s.kvCacheUsage, 0, "blocks are free (cached ones are evictable)");
  assert.ok(s.numCachedBlocks >= 18, `the prompt's 18 full blocks stay cached, got ${s.numCachedBlocks}`);
  const m = await scrapeMetrics(r.url);
  assert.equal(gauge(m, "vllm:num_requests_running"), 0);
  assert.equal(gauge(m, "vllm:kv_cache_usage_perc"), 0);
  assert.equal(gauge(m, "vllm:request_success_total", { finished_reason: "abort" }), 1);
  // Nothing left behind in the driver, and the replica still serves.
  assert.equal(r.server.driver.inFlight, 0);
  const ok = await postJson(`${r.url}/v1/completions`, { prompt: ids(300), max_tokens: 1 });
  assert.equal(
    ok.body.usage.prompt_tokens_details.cached_tokens,
    288,
    "the aborted request's prefix is still cached",
  );
});

test("a non-streaming client that goes away is aborted too", async (t) => {
  const r = await startTestReplica({ timeScale: 20 });
  t.after(() => r.close());
  const engine = r.server.engine;
  const ac = new AbortController();
  const pending = fetch(`${r.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: ids(100), max_tokens: 4000, ignore_eos: true }),
    signal: ac.signal,
  }).catch((e: Error) => e);
  await waitFor(() => engine.stats().numRequestsRunning === 1);
  ac.abort();
  assert.ok((await pending) instanceof Error);
  await waitFor(() => engine.stats().numRequestsRunning === 0);
  assert.equal(engine.stats().requestSuccess.abort, 1);
  assert.equal(engine.stats().kvCacheUsage, 0);
});
