/**
 * End to end through simulated vLLM replicas with the official `openai` client and the scheduler's
 * default config: the OpenAI surface, prefix affinity vs spreading, /explain, and failover when a
 * replica is killed while requests are in flight.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { promptTokenIds } from "../src/gateway/tokenize.ts";
import { waitFor } from "./helpers/gateway-fakes.ts";
import { parseSse, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
const id = (r: TestReplica) => `127.0.0.1:${r.port}`;

/** The index of the one replica that served exactly one request since `before`; fails otherwise. */
function servedBy(fleet: TestReplica[], before: number[]): number {
  const deltas = fleet.map((r, i) => served(r) - before[i]);
  const one = deltas.indexOf(1);
  assert.ok(one >= 0 && deltas.every((d, i) => d === (i === one ? 1 : 0)), `requests served: ${deltas}`);
  return one;
}

async function ready(gw: GatewayHandle, n: number): Promise<void> {
  await waitFor(
    () =>
      gw.gateway.data.store.all().filter((r) => r.state.metrics !== null && r.modelIds !== null).length === n,
    "every replica scraped",
  );
}

let replicas: TestReplica[] = [];
let gw: GatewayHandle;
let client: OpenAI;

before(async () => {
  replicas = await Promise.all([
    startTestReplica({ servedModelName: "m" }),
    startTestReplica({ servedModelName: "m" }),
    startTestReplica({ servedModelName: ["m", "m2"] }),
  ]);
  gw = await startGateway({
    endpoints: replicas.map(id).join(","),
    scrapeIntervalMs: 25,
    seed: 7,
    log: () => {},
  });
  await ready(gw, 3);
  client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20_000 });
});

after(async () => {
  await gw?.close();
  await Promise.all(replicas.map((r) => r.close()));
});

test("the openai client works through the gateway: completions, chat, streaming, models", {
  timeout: 30_000,
}, async () => {
  const c = await client.completions.create({ model: "m", prompt: "Once upon a time", max_tokens: 5 });
  assert.equal(c.object, "text_completion");
  assert.equal(typeof c.choices[0].text, "string");
  assert.equal(c.usage?.completion_tokens, 5);

  const chat = await client.chat.completions.create({
    model: "m",
    messages: [{ role: "user", content: "Say hi" }],
    max_tokens: 4,
  });
  assert.equal(chat.choices[0].message.role, "assistant");

  const stream = await client.chat.completions.create({
    model: "m",
    messages: [{ role: "user", content: "Count to three" }],
    max_tokens: 6,
    stream: true,
  });
  let text = "";
  let finish: string | null = null;
  let chunks = 0;
  for await (const ch of stream) {
    chunks++;
    text += ch.choices[0]?.delta?.content ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  // vLLM's chat stream: a role chunk, then one content chunk per token (every sampled sim token
  // decodes to non-empty text, so none is skipped) up to max_tokens.
  assert.equal(chunks, 1 + 6, `got ${chunks} chunks`);
  assert.ok(text.length > 0);
  assert.equal(finish, "length");

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id).sort(), ["m", "m2"], "merged from the pool, deduplicated");

  await assert.rejects(
    client.completions.create({ model: "absent", prompt: "x", max_tokens: 1 }),
    (e: InstanceType<typeof OpenAI.APIError>) => e.status === 404,
  );
});

test("requests sharing a prefix land on one replica; unrelated ones spread", {
  timeout: 60_000,
}, async () => {
  const whichServed = async (messages: OpenAI.Chat.ChatCompletionMessageParam[]) => {
    const before = replicas.map(served);
    await client.chat.completions.create({ model: "m", messages, max_tokens: 2 });
    return servedBy(replicas, before);
  };
  const hitsBefore = replicas.reduce((a, r) => a + r.server.engine.stats().prefixCacheHits, 0);
  const groups: number[][] = [];
  for (let g = 0; g < 3; g++) {
    const system = `You are agent ${g}. ${`Rules for group ${g}: be brief, be exact, cite sources. `.repeat(40)}`;
    const landed: number[] = [];
    for (let i = 0; i < 4; i++)
      landed.push(
        await whichServed([
          { role: "system", content: system },
          { role: "user", content: `question ${i} for group ${g}` },
        ]),
      );
    groups.push(landed);
  }
  for (const landed of groups) assert.equal(new Set(landed).size, 1, `group landed on ${landed}`);
  const hitsAfter = replicas.reduce((a, r) => a + r.server.engine.stats().prefixCacheHits, 0);
  assert.ok(hitsAfter > hitsBefore, "the replicas reused cached prefixes");

  // Prompts that share nothing past the chat template: a fixed pseudo-random word per request.
  const unrelated = (i: number) => ((i + 1) * 2654435761).toString(36);
  const spread = new Set<number>();
  for (let i = 0; i < 12; i++)
    spread.add(await whichServed([{ role: "user", content: `${i}: ${unrelated(i).repeat(20)}` }]));
  assert.ok(spread.size >= 2, `unrelated requests all went to replica ${[...spread]}`);
});

test("/explain returns the pick with per-scorer scores and forwards nothing", {
  timeout: 30_000,
}, async () => {
  const before = replicas.map(served);
  const r = await fetch(`${gw.adminUrl}/explain`, {
    method: "POST",
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "explain me" }] }),
  });
  assert.equal(r.status, 200);
  const ex = (await r.json()) as {
    route: string;
    picked: string;
    candidates: Array<{
      address: string;
      total: number | null;
      removedBy: string | null;
      scores: Record<string, { raw: number; weight: number; weighted: number }>;
    }>;
  };
  assert.equal(ex.route, "chat");
  assert.deepEqual(ex.candidates.map((c) => c.address).sort(), replicas.map(id).sort());
  assert.ok(ex.candidates.some((c) => c.address === ex.picked));
  for (const c of ex.candidates) {
    if (c.removedBy !== null) continue;
    const names = Object.keys(c.scores);
    assert.ok(names.length >= 1);
    const sum = names.reduce((a, n) => a + c.scores[n].weighted, 0);
    assert.ok(Math.abs(sum - (c.total as number)) < 1e-9, "total is the sum of weighted scores");
    for (const n of names) assert.ok(c.scores[n].raw >= 0 && c.scores[n].raw <= 1);
  }
  assert.deepEqual(replicas.map(served), before);
});

test("killing a replica mid-run loses no request that had not started streaming", {
  timeout: 60_000,
}, async () => {
  const fleet = await Promise.all(
    [0, 1, 2].map(() => startTestReplica({ servedModelName: "m", timeScale: 4 })),
  );
  const g = await startGateway({
    endpoints: fleet.map(id).join(","),
    scrapeIntervalMs: 25,
    seed: 3,
    log: () => {},
  });
  const victim = fleet[0];
  // The victim is cut while it runs a non-streaming request (max_tokens 40; streams ask for 41):
  // only such a request, reset before its first byte, must fail over (and be counted as a reset).
  let plainOnVictim = 0;
  const engine = victim.server.engine;
  const addRequest = engine.addRequest.bind(engine);
  engine.addRequest = (r, now) => {
    if (r.maxTokens === 40) plainOnVictim++;
    addRequest(r, now);
  };
  try {
    await ready(g, 3);
    const c = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 30_000 });
    const plain = Array.from({ length: 24 }, (_, i) =>
      c.completions.create({
        model: "m",
        prompt: `request ${i} ${"lorem ipsum ".repeat(i + 5)}`,
        max_tokens: 40,
      }),
    );
    const streams = Array.from({ length: 6 }, (_, i) =>
      fetch(`${g.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt: `stream ${i}`, max_tokens: 41, stream: true }),
      }).then(async (res) => ({ status: res.status, text: await res.text() })),
    );
    await waitFor(() => plainOnVictim > 0 && engine.stats().numRequestsRunning > 0, "victim busy");
    await victim.close();
    const results = await Promise.allSettled(plain);
    const lost = results.filter((r) => r.status === "rejected");
    assert.equal(lost.length, 0, `lost: ${lost.map((r) => (r as PromiseRejectedResult).reason).join("; ")}`);
    for (const s of await Promise.all(streams)) {
      assert.equal(s.status, 200);
      const events = parseSse(s.text);
      assert.equal(events.at(-1), "[DONE]", "every stream ends cleanly");
      const last = events.at(-2);
      assert.ok(
        last?.error?.message || last?.choices?.[0]?.finish_reason,
        `stream ended with ${JSON.stringify(last)}`,
      );
    }
    assert.equal(g.gateway.data.store.get(id(victim))?.health, "unhealthy");
    const m = await g.gateway.metrics.text();
    assert.match(
      m,
      new RegExp(`kvgate_upstream_failures_total\\{endpoint="${id(victim)}",kind="reset"\\} [1-9]`),
    );
  } finally {
    await g.close();
    await Promise.all(fleet.map((r) => r.close()));
  }
});

test("with --tokenizer sim the gateway hashes real token ids and still keeps prefixes together", {
  timeout: 60_000,
}, async () => {
  const fleet = await Promise.all([0, 1].map(() => startTestReplica({ servedModelName: "m" })));
  const g = await startGateway({
    endpoints: fleet.map(id).join(","),
    tokenizer: "sim",
    scrapeIntervalMs: 25,
    log: () => {},
  });
  try {
    await ready(g, 2);
    const tok = g.gateway.tokenizer;
    assert.ok(tok);
    const ids = promptTokenIds(tok, { kind: "completion", prompt: "hello there" });
    assert.deepEqual(ids, tok.encode("hello there", true));
    assert.deepEqual(promptTokenIds(tok, { kind: "completion", prompt: [5, 6, 7] }), [5, 6, 7]);
    assert.equal(promptTokenIds(tok, { kind: "completion", prompt: ["a", "b"] }), undefined);
    const c = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20_000 });
    const system = "Shared instructions for every question. ".repeat(60);
    const landed = new Set<number>();
    for (let i = 0; i < 4; i++) {
      const before = fleet.map(served);
      await c.chat.completions.create({
        model: "m",
        messages: [
          { role: "system", content: system },
          { role: "user", content: `q${i}` },
        ],
        max_tokens: 2,
      });
      landed.add(servedBy(fleet, before));
    }
    assert.equal(landed.size, 1);
    const hits = fleet.reduce((a, r) => a + r.server.engine.stats().prefixCacheHits, 0);
    assert.ok(hits > 0);
  } finally {
    await g.close();
    await Promise.all(fleet.map((r) => r.close()));
  }
});
