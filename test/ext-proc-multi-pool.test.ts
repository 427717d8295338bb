/**
 * `kvgate epp --pools` end to end behind the Envoy-like proxy (src/bench/ext-proc/), with simulated
 * replicas: two models in two pools, each model's requests decided by (and sent to) only its pool;
 * an unknown model answered with the front door's 404 as an ImmediateResponse; a 70/30
 * InferenceModelRewrite split across the pools; health SERVING only once every pool is ready;
 * metrics and admin per pool; the trusted model-selecting header.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type EnvoyLikeProxy, startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import { type MultiPoolEppHandle, startMultiPoolEpp } from "../src/gateway/multi-pool/epp-pools.ts";
import { parsePoolsFile } from "../src/gateway/multi-pool/pools-file.ts";
import { modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";
import { LOCAL_EPP } from "./helpers/local-epp.ts";
import {
  type Json,
  poolServed,
  postJson,
  replicaId,
  SPLIT_CHAT_REWRITES,
  startTestReplica,
  type TestReplica,
} from "./helpers/replica.ts";

const id = replicaId;
const sum = poolServed;
const REWRITES = SPLIT_CHAT_REWRITES;

let poolA: TestReplica[] = [];
let poolB: TestReplica[] = [];
const cleanups: (() => Promise<void>)[] = [];

function spec(extraPools: string, extra = "") {
  const text = `pools:
  - { name: pool-a, endpoints: [${poolA.map(id).join(", ")}], models: [alpha] }
  - { name: pool-b, endpoints: ${poolB.map(id).join(",")} }
${extraPools}
rewrites:${REWRITES.replace(/\n/g, "\n  ")}
${extra}`;
  return parsePoolsFile(text, "pools.yaml", ".");
}

async function eppBehindProxy(
  extraPools = "",
  extra = "",
): Promise<{ epp: MultiPoolEppHandle; proxy: EnvoyLikeProxy }> {
  const epp = await startMultiPoolEpp({
    poolsSpec: spec(extraPools, extra),
    ...LOCAL_EPP,
    seed: 3,
  });
  cleanups.push(() => epp.close());
  const proxy = await startEnvoyLikeProxy({ extProc: `127.0.0.1:${epp.grpc.port}`, tls: epp.grpc.secure });
  cleanups.push(() => proxy.close());
  return { epp, proxy };
}

let main: { epp: MultiPoolEppHandle; proxy: EnvoyLikeProxy };

before(async () => {
  poolA = await Promise.all([
    startTestReplica({ servedModelName: "alpha" }),
    startTestReplica({ servedModelName: "alpha" }),
  ]);
  poolB = [await startTestReplica({ servedModelName: "beta" })];
  cleanups.push(() => Promise.all([...poolA, ...poolB].map((r) => r.close())).then(() => {}));
  main = await eppBehindProxy();
  await waitFor(
    () =>
      [...main.epp.live.current.pools.values()].every((gw) =>
        gw.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
      ),
    "every replica scraped",
  );
  await waitFor(() => main.epp.serving(), "the EPP reports SERVING");
});

after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

const complete = (model: string, headers: Record<string, string> = {}, p = main.proxy) =>
  postJson(`${p.url}/v1/completions`, { model, prompt: "hello there", max_tokens: 1 }, headers);
const metricsOf = async (path: string) => (await fetch(`${main.epp.metrics.url}${path}`)).text();

test("each model's requests are decided by and reach only its pool", { timeout: 60_000 }, async () => {
  const a0 = sum(poolA);
  const b0 = sum(poolB);
  for (let i = 0; i < 10; i++) {
    const model = i % 2 ? "alpha" : "beta";
    const r = await complete(model);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.model, model);
  }
  assert.equal(sum(poolA) - a0, 5);
  assert.equal(sum(poolB) - b0, 5);
  // Each pool's own scheduler decided its requests: its llm-d request counter, not the other's.
  const a = await metricsOf("/pools/pool-a/metrics");
  const b = await metricsOf("/pools/pool-b/metrics");
  assert.match(a, /llm_d_epp_request_total\{model_name="alpha"[^}]*\} [1-9]/);
  assert.doesNotMatch(a, /llm_d_epp_request_total\{model_name="beta"/);
  assert.match(b, /llm_d_epp_request_total\{model_name="beta"[^}]*\} [1-9]/);
  assert.doesNotMatch(b, /llm_d_epp_request_total\{model_name="alpha"/);
  // The token histograms are the pool's, from the usage its replicas returned.
  assert.match(a, /llm_d_epp_request_input_tokens_count\{model_name="alpha"[^}]*\} [1-9]/);
});

test("an unknown model gets the front door's 404 as an ImmediateResponse", { timeout: 30_000 }, async () => {
  const before = sum(poolA) + sum(poolB);
  const r = await complete("gamma");
  assert.equal(r.status, 404, r.text);
  const e: Json = r.body.error;
  assert.equal(e.type, "NotFoundError");
  assert.equal(e.code, 404);
  assert.equal(e.param, "model");
  assert.match(e.message, /`gamma` does not exist/);
  assert.match(e.message, /alpha, beta, chat/);
  assert.equal(sum(poolA) + sum(poolB), before, "no replica saw it");
  const front = await metricsOf("/metrics");
  assert.match(front, /kvgate_front_door_rejections_total\{status="404",reason="unknown-model"\} [1-9]/);
  assert.match(front, /kvgate_front_door_requests_total\{pool="pool-b"\} [1-9]/);
  assert.match(front, /kvgate_ext_proc_streams_total\{outcome="rejected"\} [1-9]/);
});

test("a 70/30 rewrite splits requests across the pools by its weights", { timeout: 120_000 }, async () => {
  const a0 = sum(poolA);
  const b0 = sum(poolB);
  const n = 200;
  let next = 0;
  const answered = new Map<string, number>();
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next < n) {
        next++;
        const r = await complete("chat");
        assert.equal(r.status, 200, r.text);
        answered.set(r.body.model, (answered.get(r.body.model) ?? 0) + 1);
      }
    }),
  );
  const a = sum(poolA) - a0;
  const b = sum(poolB) - b0;
  assert.equal(a + b, n);
  assert.ok(Math.abs(a / n - 0.7) <= 0.02, `alpha share ${a / n}`);
  // The client gets back the name it asked for, as behind one pool.
  assert.deepEqual([...answered], [["chat", n]]);
});

test("the metrics port serves GET /pools and each pool's GET routes, and no POST", async () => {
  const pools = (await (await fetch(`${main.epp.metrics.url}/pools`)).json()) as Json;
  assert.deepEqual(
    pools.pools.map((p: Json) => [p.name, p.endpoints.length, p.replicaModels]),
    [
      ["pool-a", 2, ["alpha"]],
      ["pool-b", 1, ["beta"]],
    ],
  );
  const eps = (await (await fetch(`${main.epp.metrics.url}/pools/pool-b/endpoints`)).json()) as Json;
  assert.equal(JSON.stringify(eps).includes(id(poolB[0] as TestReplica)), true);
  const post = await fetch(`${main.epp.metrics.url}/pools/pool-a/reload`, { method: "POST" });
  assert.equal(post.status, 405);
  assert.match(((await post.json()) as Json).error.message, /--admin-port/);
});

test("health stays NOT_SERVING while a pool has no scraped endpoint", { timeout: 30_000 }, async () => {
  // pool-c's only endpoint is a closed port: its data layer never becomes ready.
  const dead = await startTestReplica({ servedModelName: "gamma" });
  const deadId = id(dead);
  await dead.close();
  const { epp } = await eppBehindProxy(`  - { name: pool-c, endpoints: ${deadId}, models: [gamma] }`);
  await waitFor(
    () =>
      [...["pool-a", "pool-b"]].every((p) =>
        epp.live.current.pools
          .get(p)
          ?.data.store.all()
          .some((r) => r.state.metrics),
      ),
    "pools a and b scraped",
  );
  // Once a and b are ready the next readiness poll still finds c not ready.
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(epp.serving(), false);
  assert.equal(epp.live.current.ready(), false);
});

test("a trusted header chooses the model; it is not forwarded", { timeout: 30_000 }, async () => {
  const fake = await startFake({
    "GET /metrics": (_q, res) => void res.end(vllmMetrics({ model: "delta" })),
    "GET /v1/models": (_q, res) => void res.end(modelList("delta")),
    "POST /v1/completions": (_q, res) =>
      void res
        .writeHead(200, { "content-type": "application/json" })
        .end(
          JSON.stringify({ object: "text_completion", model: "delta", choices: [{ index: 0, text: "hi" }] }),
        ),
  });
  cleanups.push(() => fake.close());
  const { epp, proxy } = await eppBehindProxy(
    `  - { name: pool-d, endpoints: ${fake.id}, models: [delta] }`,
    "trustedHeader: { name: x-semantic-model, selects: model }",
  );
  await waitFor(() => epp.serving(), "the EPP reports SERVING");
  const r = await complete("alpha", { "x-semantic-model": "delta" }, proxy);
  assert.equal(r.status, 200, r.text);
  const got = fake.requests.find((q) => q.url === "/v1/completions");
  assert.ok(got, "pool-d's replica got the request");
  assert.equal(JSON.parse(got.body.toString()).model, "delta");
  assert.equal(got.headers["x-semantic-model"], undefined);
  // The client still sees the model it asked for.
  assert.equal(r.body.model, "alpha");
});

test("trustedSources is refused: kvgate epp cannot see the client's address", async () => {
  await assert.rejects(
    startMultiPoolEpp({
      poolsSpec: spec(
        "",
        "trustedHeader: { name: x-kvgate-model, selects: model, trustedSources: [10.0.0.0/8] }",
      ),
      grpcPort: 0,
      grpcHealthPort: 0,
      metricsPort: 0,
    }),
    /trustedSources: kvgate epp does not see the client's address.*drop trustedSources/,
  );
});
