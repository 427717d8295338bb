/**
 * The gateway's tokenization: the segment cache (src/gateway/tokenize-cache.ts) must give ids
 * IDENTICAL to encoding the whole prompt at once, for the sim tokenizer and for Hugging Face
 * tokenizer.json fixtures (a byte-level BPE with a BOS post-processor, and a char-level one with a
 * Whitespace pre-tokenizer), over random multi-turn chats and completions sharing system prompts;
 * and `--tokenizer endpoint` (src/gateway/tokenize-endpoint.ts) against a simulated replica.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { createSimTokenizer, SIM_SPECIAL_TOKENS } from "../src/engine/sim-tokenizer.ts";
import type { Tokenizer } from "../src/engine/tokenizer.ts";
import { startGateway } from "../src/gateway/gateway.ts";
import { loadGatewayTokenizer, promptTokenIds, tokenizerCacheOf } from "../src/gateway/tokenize.ts";
import { createCachingTokenizer } from "../src/gateway/tokenize-cache.ts";
import { EndpointTokenizer } from "../src/gateway/tokenize-endpoint.ts";
import type { ChatMessage, EndpointState, PromptInput } from "../src/scheduler/types.ts";
import { postJson, startTestReplica, waitFor } from "./helpers/replica.ts";
import { rng } from "./helpers/rng.ts";
import {
  addedTokens,
  BOS_POST_PROCESSOR,
  bpeModel,
  CHATML_TEMPLATE,
  SPECIAL_TOKENS,
} from "./helpers/tokenizer-fixtures.ts";

// Atoms for random texts: words, spacing, punctuation, unicode, markers, marker fragments.
const ATOMS = [
  "the", " cat", "sat", "extraordinarily", " on", "mat", "hello", " hell", "he", "x", "42", "_id", " ",
  "  ", "\n", "\n\n", "\t", "\r\n", ".", ",", "!?", "()", "<", "|", ">", "<|", "<|im_", "é", "漢字", "😀",
  "naïve", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "{\"k\": [1, 2]}", " \u00a0 ",
]; // biome-ignore format: one table

function randomText(r: () => number, maxAtoms: number): string {
  let s = "";
  const n = Math.floor(r() * maxAtoms);
  for (let i = 0; i < n; i++) s += ATOMS[Math.floor(r() * ATOMS.length)];
  return s;
}

/** Random prompts: chats over a few shared system prompts (multi-turn), and completions sharing prefixes. */
function* randomPrompts(seed: number, n: number): Generator<{ prompt: PromptInput; flags: object }> {
  const r = rng(seed);
  const systems = Array.from({ length: 3 }, () => randomText(r, 200));
  const prefixes = Array.from({ length: 3 }, () => randomText(r, 120));
  for (let i = 0; i < n; i++) {
    const flags: { addGenerationPrompt?: boolean; addSpecialTokens?: boolean } = {};
    if (r() < 0.2) flags.addGenerationPrompt = r() < 0.5;
    if (r() < 0.3) flags.addSpecialTokens = r() < 0.5;
    if (r() < 0.6) {
      const messages: ChatMessage[] = [];
      if (r() < 0.8) messages.push({ role: "system", content: systems[Math.floor(r() * 3)]! });
      const turns = 1 + Math.floor(r() * 4);
      for (let t = 0; t < turns; t++) {
        messages.push({ role: "user", content: randomText(r, 30) });
        if (t < turns - 1 || r() < 0.3) messages.push({ role: "assistant", content: randomText(r, 20) });
      }
      yield { prompt: { kind: "chat", messages }, flags };
    } else {
      const text = (r() < 0.7 ? prefixes[Math.floor(r() * 3)]! : "") + randomText(r, 40);
      yield { prompt: { kind: "completion", prompt: text }, flags };
    }
  }
}

/** Checks cached == uncached on random prompts, twice over (second pass hits the cache). */
function assertIdentical(plain: Tokenizer, cached: Tokenizer, seed: number, n: number): void {
  for (let pass = 0; pass < 2; pass++) {
    let k = 0;
    for (const { prompt, flags } of randomPrompts(seed, n)) {
      const want = promptTokenIds(plain, prompt, flags);
      const got = promptTokenIds(cached, prompt, flags);
      assert.deepEqual(got, want, `pass ${pass} prompt #${k}: ${JSON.stringify(prompt).slice(0, 300)}`);
      k++;
    }
  }
}

// ---- Hugging Face fixtures ----

/** GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet). */
function byteChars(): string[] {
  const keep: number[] = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const out: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCharCode(keep.includes(b) ? b : 256 + extra++);
  return out;
}

function writeByteLevel(dir: string): void {
  const chars = byteChars();
  const G = chars[32]!; // "Ġ", the space
  const merges = [
    ["h", "e"], [G, "t"], ["he", "l"], ["hel", "l"], ["hell", "o"], [G, "c"], [`${G}c`, "a"],
    [`${G}ca`, "t"], ["t", "h"], ["th", "e"], [`${G}t`, "he"], ["Ċ", "Ċ"], [G, G], ["a", "t"],
  ]; // biome-ignore format: one table
  const vocab: Record<string, number> = {};
  for (const s of SPECIAL_TOKENS) vocab[s] = Object.keys(vocab).length;
  for (const c of chars) vocab[c] = Object.keys(vocab).length;
  for (const [a, b] of merges) vocab[a! + b!] ??= Object.keys(vocab).length;
  const tokenizer = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens(),
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: BOS_POST_PROCESSOR,
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: bpeModel(
      vocab,
      merges.map(([a, b]) => `${a} ${b}`),
      null,
    ),
  };
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({
      name_or_path: "tiny-bytes",
      eos_token: "<|im_end|>",
      bos_token: "<s>",
      chat_template: CHATML_TEMPLATE,
    }),
  );
}

function writeCharLevel(dir: string): void {
  const pieces = [..."abcdefghijklmnopqrstuvwxyz", "he", "hel", "hell", "hello"];
  const vocab = Object.fromEntries([...SPECIAL_TOKENS, ...pieces].map((t, i) => [t, i]));
  const tokenizer = {
    version: "1.0",
    added_tokens: addedTokens(),
    normalizer: null,
    pre_tokenizer: { type: "Whitespace" },
    post_processor: null,
    decoder: null,
    model: bpeModel(vocab, ["h e", "he l", "hel l", "hell o"]),
  };
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  writeFileSync(
    join(dir, "tokenizer_config.json"),
    JSON.stringify({ name_or_path: "tiny-chars", eos_token: "<|im_end|>", chat_template: CHATML_TEMPLATE }),
  );
}

function tempDir(t: { after: (fn: () => void) => void }, write: (dir: string) => void): string {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-gwtok-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  write(dir);
  return dir;
}

// ---- the cache ----

test("sim: cached ids are identical to whole-prompt ids over random chats and completions", async () => {
  const plain = createSimTokenizer();
  const cached = await loadGatewayTokenizer("sim", { minSegmentChars: 0 });
  const c = tokenizerCacheOf(cached);
  assert.ok(c);
  assert.equal(c.stats().splitting, true);
  assertIdentical(plain, cached, 1, 400);
  assert.ok(c.stats().hits > 0 && c.stats().misses > 0);
  // A tiny budget (constant eviction) changes nothing either.
  const small = createCachingTokenizer(plain, Object.keys(SIM_SPECIAL_TOKENS), {
    maxBytes: 2000,
    minSegmentChars: 0,
  });
  assertIdentical(plain, small, 2, 200);
  assert.ok(small.stats().bytes <= 2000);
});

test("hf byte-level BPE (BOS post-processor): cached ids are identical to whole-prompt ids", async (t) => {
  const dir = tempDir(t, writeByteLevel);
  const plain = await loadGatewayTokenizer(dir, { maxBytes: 0 });
  assert.equal(tokenizerCacheOf(plain), null);
  const cached = await loadGatewayTokenizer(dir, { minSegmentChars: 0 });
  const c = tokenizerCacheOf(cached)!;
  assert.equal(c.stats().splitting, true);
  assert.equal(plain.encode("hello", true)[0], 1, "the fixture adds BOS");
  assertIdentical(plain, cached, 3, 300);
  assert.ok(c.stats().hits > 0);
});

test("hf char-level BPE (Whitespace pre-tokenizer): cached ids are identical to whole-prompt ids", async (t) => {
  const dir = tempDir(t, writeCharLevel);
  const plain = await loadGatewayTokenizer(dir, { maxBytes: 0 });
  const cached = await loadGatewayTokenizer(dir, { minSegmentChars: 0 });
  assert.equal(tokenizerCacheOf(cached)!.stats().splitting, true);
  assertIdentical(plain, cached, 4, 300);
});

test("an unsafe boundary is caught by the self-check: whole texts only, ids still identical", () => {
  const plain = createSimTokenizer();
  // A space is no safe cut for the sim tokenizer (" cat" is one piece).
  const cached = createCachingTokenizer(plain, [" ", "a"], { minSegmentChars: 0 });
  assert.equal(cached.stats().splitting, false);
  assertIdentical(plain, cached, 5, 100);
});

test("a shared system prompt is encoded once: one miss, then a hit for every request after it", async (t) => {
  const r = rng(9);
  const words = [
    "the",
    "gateway",
    "routes",
    "each",
    "request",
    "to",
    "a",
    "replica",
    "cache",
    "naïve",
    "漢字",
  ];
  /** Random prose of about `tokens` tokens under `tok` (grown in steps of 17 words). */
  const para = (tok: Tokenizer, tokens: number) => {
    let s = "";
    let i = 0;
    while (tok.encode(s, false).length < tokens)
      for (let k = 0; k < 17; k++, i++)
        s += (i % 17 === 16 ? ".\n" : " ") + words[Math.floor(r() * words.length)];
    return s;
  };
  const dir = tempDir(t, writeByteLevel);
  for (const [name, plain, cached] of [
    ["sim", createSimTokenizer(), await loadGatewayTokenizer("sim")],
    ["hf byte-level", await loadGatewayTokenizer(dir, { maxBytes: 0 }), await loadGatewayTokenizer(dir)],
  ] as const) {
    const system = para(plain, 6000);
    const questions = Array.from({ length: 20 }, () => para(plain, 1000));
    const chat = (q: string): PromptInput => ({
      kind: "chat",
      messages: [
        { role: "system", content: system },
        { role: "user", content: q },
      ],
    });
    const ids = () => questions.map((q) => promptTokenIds(cached, chat(q)));
    const want = questions.map((q) => promptTokenIds(plain, chat(q)));
    const stats = () => {
      const { hits, misses } = tokenizerCacheOf(cached)!.stats();
      return { hits, misses };
    };
    // First pass: the system prompt misses once and hits for the other 19; each question misses.
    assert.deepEqual(ids(), want, name);
    assert.deepEqual(stats(), { hits: 19, misses: 21 }, name);
    // Second pass: every segment is a hit, the ids unchanged.
    assert.deepEqual(ids(), want, name);
    assert.deepEqual(stats(), { hits: 59, misses: 21 }, name);
  }
});

// ---- --tokenizer endpoint ----

function sampleValue(
  families: Map<string, { samples: Array<{ name: string; value: number }> }>,
  name: string,
) {
  for (const f of families.values()) for (const s of f.samples) if (s.name === name) return s.value;
  return undefined;
}

const state = (address: string): EndpointState => ({ id: address, address, labels: {}, metrics: null });

test("endpoint: ids equal the replica's (sim and HF), dead or slow endpoints give undefined", async (t) => {
  const dir = tempDir(t, writeByteLevel);
  const sim = await startTestReplica({ servedModelName: "m" });
  t.after(() => sim.close());
  const hf = await startTestReplica({ servedModelName: "m", tokenizer: dir });
  t.after(() => hf.close());
  const et = new EndpointTokenizer({ timeoutMs: 1000 });
  const local = { sim: createSimTokenizer(), hf: await loadGatewayTokenizer(dir, { maxBytes: 0 }) };
  for (const [name, rep] of [
    ["sim", sim],
    ["hf", hf],
  ] as const) {
    let n = 0;
    for (const { prompt, flags } of randomPrompts(11, 40)) {
      const want = promptTokenIds(local[name], prompt, flags);
      const got = await et.tokenIds("m", prompt, flags, [state(`127.0.0.1:${rep.port}`)]);
      assert.deepEqual(got, want, `${name} #${n++}`);
    }
  }
  assert.equal(et.failures, 0);
  // Token-id prompts pass through; several prompts are not tokenized.
  assert.deepEqual(await et.tokenIds("m", { kind: "completion", prompt: [5, 6] }, {}, []), [5, 6]);
  assert.equal(
    await et.tokenIds("m", { kind: "completion", prompt: ["a", "b"] }, {}, [state("x:1")]),
    undefined,
  );

  // Dead endpoint: a closed port.
  const dead = await startTestReplica({ servedModelName: "m" });
  const deadAddr = `127.0.0.1:${dead.port}`;
  await dead.close();
  assert.equal(
    await et.tokenIds("m", { kind: "completion", prompt: "hi" }, {}, [state(deadAddr)]),
    undefined,
  );
  // Wrong model: the replica answers 404.
  assert.equal(
    await et.tokenIds("other", { kind: "completion", prompt: "hi" }, {}, [state(`127.0.0.1:${sim.port}`)]),
    undefined,
  );
  // A hanging endpoint: the timeout bounds the wait.
  const hang = createServer(() => {});
  await new Promise<void>((res) => hang.listen(0, "127.0.0.1", res));
  t.after(() => {
    hang.closeAllConnections();
    hang.close();
  });
  const port = (hang.address() as { port: number }).port;
  const quick = new EndpointTokenizer({ timeoutMs: 100 });
  const t0 = performance.now();
  assert.equal(
    await quick.tokenIds("m", { kind: "completion", prompt: "hi" }, {}, [state(`127.0.0.1:${port}`)]),
    undefined,
  );
  assert.ok(performance.now() - t0 < 5000);
  assert.deepEqual(quick.stats(), { requests: 1, failures: 1 });
});

test("gateway --tokenizer endpoint: routes with the replica's ids; a failing /tokenize still serves", async (t) => {
  const rep = await startTestReplica({ servedModelName: "m" });
  t.after(() => rep.close());
  const gw = await startGateway({
    endpoints: `127.0.0.1:${rep.port}`,
    tokenizer: "endpoint",
    tokenizeTimeoutMs: 500,
    scrapeIntervalMs: 25,
    log: () => {},
  });
  t.after(() => gw.close());
  assert.equal(gw.gateway.tokenizer, null);
  assert.ok(gw.gateway.endpointTokenizer);
  await waitFor(() => gw.gateway.data.store.all().every((r) => r.state.metrics !== null));
  const ok = await postJson(`${gw.url}/v1/chat/completions`, {
    model: "m",
    messages: [{ role: "user", content: "hello there" }],
    max_tokens: 2,
  });
  assert.equal(ok.status, 200);
  // Break /tokenize only: the request is still served (routed without ids).
  const et = gw.gateway.endpointTokenizer!;
  const orig = et.tokenIds.bind(et);
  et.tokenIds = (model, prompt, flags, _c) => orig(model, prompt, flags, [state("127.0.0.1:1")]);
  const still = await postJson(`${gw.url}/v1/completions`, { model: "m", prompt: "hello", max_tokens: 2 });
  assert.equal(still.status, 200);
  const metrics = parsePromText(await (await fetch(`${gw.adminUrl}/metrics`)).text());
  const val = (name: string) => sampleValue(metrics.families, name);
  assert.equal(val("kvgate_tokenizer_endpoint_requests_total"), 2);
  assert.equal(val("kvgate_tokenizer_endpoint_failures_total"), 1);
});

test("gateway /metrics exposes the local tokenizer cache's hits and misses", async (t) => {
  const rep = await startTestReplica({ servedModelName: "m" });
  t.after(() => rep.close());
  const gw = await startGateway({ endpoints: `127.0.0.1:${rep.port}`, tokenizer: "sim", log: () => {} });
  t.after(() => gw.close());
  await waitFor(() => gw.gateway.data.store.all().every((r) => r.state.metrics !== null));
  const system = "You are a helpful assistant. ".repeat(20);
  for (let i = 0; i < 3; i++) {
    const res = await postJson(`${gw.url}/v1/chat/completions`, {
      model: "m",
      messages: [
        { role: "system", content: system },
        { role: "user", content: `question number ${i} `.repeat(10) },
      ],
      max_tokens: 2,
    });
    assert.equal(res.status, 200);
  }
  const metrics = parsePromText(await (await fetch(`${gw.adminUrl}/metrics`)).text());
  const val = (name: string) => sampleValue(metrics.families, name);
  assert.equal(val("kvgate_tokenizer_cache_hits_total"), 2);
  assert.equal(val("kvgate_tokenizer_cache_misses_total"), 4);
});
