/**
 * `kvgate epp` end to end behind the Envoy-like proxy (src/bench/ext-proc/), as a user runs it behind
 * Envoy: the openai client → proxy → ext_proc (FULL_DUPLEX_STREAMED over TLS, the EPP's default
 * self-signed certificate) → the replica the EPP picked. Simulated replicas for affinity, streaming,
 * a replica dying and a model rewrite; scripted fake model servers where a test needs to see the
 * headers that arrive or to look saturated.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";
import { chatBodies, encodeBodies } from "../src/bench/ext-proc/bench-bodies.ts";
import { runLevel } from "../src/bench/ext-proc/bench-load.ts";
import { type EnvoyLikeProxy, startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import type { ModelRewrite } from "../src/datalayer/pool-resources.ts";
import { type EppHandle, type EppOptions, startEpp } from "../src/gateway/ext-proc/epp.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";
import { parseSse, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const id = (r: { port: number }) => `127.0.0.1:${r.port}`;
const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);

let rewrites: ModelRewrite[] = [];
let objectives = new Map<string, number>();
const cleanups: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

/** An EPP on free loopback ports and the proxy in front of it, both closed after the file. */
async function eppBehindProxy(
  opts: EppOptions,
  ready: (epp: EppHandle) => boolean,
): Promise<{ epp: EppHandle; proxy: EnvoyLikeProxy }> {
  const epp = await startEpp({
    grpcHost: "127.0.0.1",
    grpcPort: 0,
    grpcHealthPort: 0,
    metricsPort: 0,
    scrapeIntervalMs: 25,
    seed: 7,
    log: () => {},
    resources: () => ({ objectives, rewrites }),
    ...opts,
  });
  cleanups.push(() => epp.close());
  await waitFor(() => ready(epp), "the EPP's data layer is ready");
  const proxy = await startEnvoyLikeProxy({ extProc: `127.0.0.1:${epp.grpc.port}`, tls: epp.grpc.secure });
  cleanups.push(() => proxy.close());
  return { epp, proxy };
}

let replicas: TestReplica[] = [];
let proxy: EnvoyLikeProxy;
let epp: EppHandle;
let client: OpenAI;

before(async () => {
  replicas = await Promise.all([0, 1, 2].map(() => startTestReplica({ servedModelName: "m" })));
  cleanups.push(() => Promise.all(replicas.map((r) => r.close())).then(() => {}));
  ({ epp, proxy } = await eppBehindProxy(
    { endpoints: replicas.map(id).join(",") },
    (e) => e.gateway.data.store.all().filter((r) => r.state.metrics && r.modelIds).length === 3,
  ));
  client = new OpenAI({ baseURL: `${proxy.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20_000 });
});

/** Which replica served the requests `run` makes (fails unless exactly one served them all). */
async function servedBy(run: () => Promise<void>, fleet = replicas): Promise<number> {
  const before = fleet.map(served);
  await run();
  const deltas = fleet.map((r, i) => served(r) - before[i]!);
  const busy = deltas.filter((d) => d > 0);
  assert.equal(busy.length, 1, `requests served per replica: ${deltas}`);
  return deltas.findIndex((d) => d > 0);
}

const system = `You are a careful assistant. ${"Background facts about the world follow. ".repeat(120)}`;
const ask = (q: string, model = "m") =>
  client.chat.completions.create({
    model,
    messages: [
      { role: "system", content: system },
      { role: "user", content: q },
    ],
    max_tokens: 4,
  });

test("prefix affinity: requests sharing a long system prompt land on one replica", {
  timeout: 60_000,
}, async () => {
  const first = await servedBy(async () => {
    await ask("question 0");
  });
  const rest = await servedBy(async () => {
    for (let i = 1; i <= 4; i++) await ask(`question ${i}`);
  });
  assert.equal(rest, first);
});

test("BUFFERED body mode reaches the same replica as FULL_DUPLEX_STREAMED for a shared prefix", {
  timeout: 60_000,
}, async () => {
  const buffered = await startEnvoyLikeProxy({
    extProc: `127.0.0.1:${epp.grpc.port}`,
    tls: true,
    mode: "BUFFERED",
    messageTimeoutMs: 10_000, // Envoy's 200 ms default is too tight for a loaded test machine
  });
  cleanups.push(() => buffered.close());
  const viaBuffered = new OpenAI({ baseURL: `${buffered.url}/v1`, apiKey: "unused", maxRetries: 0 });
  const home = await servedBy(async () => {
    await ask("buffered 0");
  });
  const again = await servedBy(async () => {
    for (let i = 1; i <= 3; i++) {
      const r = await viaBuffered.chat.completions.create({
        model: "m",
        messages: [
          { role: "system", content: system },
          { role: "user", content: `buffered ${i}` },
        ],
        max_tokens: 4,
      });
      assert.equal(r.choices[0]!.finish_reason, "length");
    }
  });
  assert.equal(again, home);
  assert.equal(buffered.stats.timeouts + buffered.stats.spurious, 0);
});

test("an SSE stream passes through the proxy and ext_proc intact", { timeout: 30_000 }, async () => {
  const res = await fetch(`${proxy.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: "Count to ten" }],
      max_tokens: 12,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  assert.equal(res.status, 200);
  assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
  const events = parseSse(await res.text());
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1);
  assert.ok(chunks.every((e) => e.object === "chat.completion.chunk" && e.id === chunks[0].id));
  assert.equal(chunks.at(-1).usage.completion_tokens, 12);
  const tokens = chunks.filter((e) => e.choices?.[0]?.delta?.content).length;
  assert.equal(tokens, 12, "one content delta per generated token");
});

test("forged routing headers never reach the replica nor steer the pick", { timeout: 30_000 }, async () => {
  const fakes: FakeServer[] = [];
  for (let i = 0; i < 2; i++) {
    const f = await startFake({
      "GET /metrics": (_q, res) => void res.end(vllmMetrics()),
      "GET /v1/models": (_q, res) => void res.end(modelList("m")),
      "POST /v1/completions": (_q, res) =>
        void res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}'),
    });
    fakes.push(f);
    cleanups.push(() => f.close());
  }
  const { proxy: p } = await eppBehindProxy(
    { endpoints: fakes.map((f) => f.id).join(",") },
    (e) => e.gateway.data.store.all().filter((r) => r.state.metrics && r.modelIds).length === 2,
  );
  const prompt = `${"shared context ".repeat(200)}tail`;
  const post = (headers: Record<string, string>) =>
    fetch(`${p.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ model: "m", prompt, max_tokens: 1 }),
    });
  assert.equal((await post({})).status, 200);
  const home = fakes.findIndex((f) => f.requests.some((r) => r.method === "POST"));
  const other = fakes[1 - home]!;
  for (let i = 0; i < 3; i++) {
    const res = await post({
      "x-gateway-destination-endpoint": other.id,
      "x-prefiller-host-port": "169.254.169.254:80",
      "x-gateway-destination-endpoint-served": other.id,
    });
    assert.equal(res.status, 200);
  }
  const posts = fakes.map((f) => f.requests.filter((r) => r.method === "POST"));
  assert.equal(posts[home]!.length, 4, "the forged destination did not move the request off its prefix");
  assert.equal(posts[1 - home]!.length, 0);
  for (const r of posts[home]!) {
    assert.equal(r.headers["x-gateway-destination-endpoint"], fakes[home]!.id, "only the EPP's pick arrives");
    assert.equal(r.headers["x-prefiller-host-port"], undefined);
    assert.equal(r.headers["x-gateway-destination-endpoint-served"], undefined);
  }
});

test("a sheddable request gets 429 when the pool is saturated; 503 when no endpoint is ready", {
  timeout: 30_000,
}, async () => {
  const busy = await startFake({
    "GET /metrics": (_q, res) => void res.end(vllmMetrics({ waiting: 100, kv: 0.95 })),
    "GET /v1/models": (_q, res) => void res.end(modelList("m")),
    "POST /v1/completions": (_q, res) => void res.end('{"ok":true}'),
  });
  cleanups.push(() => busy.close());
  objectives = new Map([
    ["batch", -1],
    ["premium", 5],
  ]);
  const { proxy: p } = await eppBehindProxy({ endpoints: busy.id }, (e) =>
    Boolean(e.gateway.data.store.get(busy.id)?.state.metrics),
  );
  const post = (objective: string) =>
    fetch(`${p.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-llm-d-inference-objective": objective },
      body: '{"model":"m","prompt":"x"}',
    });
  const shed = await post("batch");
  assert.equal(shed.status, 429);
  assert.equal(shed.headers.get("x-llm-d-request-dropped-reason"), "rejected-saturated");
  assert.equal((await post("premium")).status, 200, "a priority ≥ 0 request is still admitted");
  const sent = busy.requests.filter((r) => r.method === "POST");
  assert.equal(sent.length, 1);
  assert.equal(sent[0]!.headers["x-llm-d-inference-objective"], undefined);

  const gone = await startFake({});
  await gone.close();
  const { proxy: empty } = await eppBehindProxy(
    { endpoints: gone.id, failureThreshold: 1 },
    (e) => e.gateway.data.store.get(gone.id)?.health === "unhealthy",
  );
  const none = await fetch(`${empty.url}/v1/completions`, {
    method: "POST",
    body: '{"model":"m","prompt":"x"}',
  });
  assert.equal(none.status, 503);
  assert.equal(none.headers.get("x-llm-d-request-dropped-reason"), "rejected-no-endpoints");
});

test("a model rewrite sends the request to the target model and the client sees its own name", {
  timeout: 30_000,
}, async () => {
  rewrites = [
    {
      name: "alias-to-m",
      createdAtMs: 0,
      rules: [{ matches: ["alias"], targets: [{ model: "m", weight: null }] }],
    },
  ];
  try {
    const reply = await ask("rewritten", "alias");
    assert.equal(reply.model, "alias");
    assert.equal(reply.choices[0]!.message.role, "assistant");
  } finally {
    rewrites = [];
  }
});

test("when a replica dies the picks move to the live ones", { timeout: 60_000 }, async () => {
  const home = await servedBy(async () => {
    await ask("before the crash");
  });
  const dead = replicas[home]!;
  await dead.close();
  await waitFor(
    () => epp.gateway.data.store.get(id(dead))?.health === "unhealthy",
    "the dead replica is out",
  );
  const live = replicas.filter((_, i) => i !== home);
  const before = live.map(served);
  for (let i = 0; i < 4; i++) {
    const r = await ask(`after the crash ${i}`);
    assert.equal(r.choices.length, 1);
  }
  assert.equal(
    live.reduce((n, r, i) => n + served(r) - before[i]!, 0),
    4,
  );
});

test("bench:ext-proc's load generator completes whole Envoy-like conversations with kvgate epp", {
  timeout: 60_000,
}, async () => {
  const bodies = chatBodies(4, 2, 40_000);
  for (const b of bodies) {
    const chat = JSON.parse(b.toString());
    assert.equal(chat.model, "m");
    assert.ok(Math.abs(b.length - 40_000) < 2_000, `an ~8k-token chat body is ~40 KB (got ${b.length})`);
  }
  const r = await runLevel({
    target: `127.0.0.1:${epp.grpc.port}`,
    secure: epp.grpc.secure,
    concurrency: 4,
    durationMs: 300,
    warmupMs: 0,
    streamsPerConnection: 2,
    encoded: encodeBodies(bodies, 16_000),
    requestTimeoutMs: 30_000,
  });
  assert.deepEqual(r.errors, {});
  assert.equal(r.connections, 2);
  assert.equal(r.maxOpenStreams, 4);
  assert.ok(r.allDecisions >= 4, "every stream got its decision");
});
