/**
 * `kvgate serve --pools` end to end with simulated replicas: two models in two pools (one pool with
 * declared models, one learning them from its replicas), a 70/30 InferenceModelRewrite split across
 * the pools, unknown models, GET /v1/models, the trusted model-selecting header, per-pool admin.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type MultiPoolHandle, startMultiPool } from "../src/gateway/multi-pool/front.ts";
import { parsePoolsFile } from "../src/gateway/multi-pool/pools-file.ts";
import { waitFor } from "./helpers/gateway-fakes.ts";
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
const fronts: MultiPoolHandle[] = [];

async function front(extra: string): Promise<MultiPoolHandle> {
  const text = `pools:
  - { name: pool-a, endpoints: [${poolA.map(id).join(", ")}], models: [alpha] }
  - { name: pool-b, endpoints: ${poolB.map(id).join(",")} }
rewrites:${REWRITES.replace(/\n/g, "\n  ")}
${extra}`;
  const h = await startMultiPool({
    poolsSpec: parsePoolsFile(text, "pools.yaml", "."),
    scrapeIntervalMs: 25,
    seed: 1,
    log: () => {},
  });
  fronts.push(h);
  await waitFor(
    () =>
      [...h.front.pools.values()].every((gw) =>
        gw.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
      ),
    "every replica scraped",
  );
  return h;
}

let main: MultiPoolHandle;

before(async () => {
  poolA = await Promise.all([
    startTestReplica({ servedModelName: "alpha" }),
    startTestReplica({ servedModelName: "alpha" }),
  ]);
  poolB = [await startTestReplica({ servedModelName: "beta" })];
  main = await front("");
});

after(async () => {
  await Promise.all(fronts.map((f) => f.close()));
  await Promise.all([...poolA, ...poolB].map((r) => r.close()));
});

const complete = (h: MultiPoolHandle, model: string, headers: Record<string, string> = {}) =>
  postJson(`${h.url}/v1/completions`, { model, prompt: "hello there", max_tokens: 1 }, headers);

test("each model's requests reach only its pool", { timeout: 30_000 }, async () => {
  const a0 = sum(poolA);
  const b0 = sum(poolB);
  for (let i = 0; i < 10; i++) {
    const r = await complete(main, i % 2 ? "alpha" : "beta");
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.model, i % 2 ? "alpha" : "beta");
  }
  assert.equal(sum(poolA) - a0, 5);
  assert.equal(sum(poolB) - b0, 5);
});

test("an unknown model gets vLLM's 404 naming the served models", async () => {
  const r = await complete(main, "gamma");
  assert.equal(r.status, 404);
  const e: Json = r.body.error;
  assert.equal(e.type, "NotFoundError");
  assert.equal(e.code, 404);
  assert.equal(e.param, "model");
  assert.match(e.message, /`gamma` does not exist/);
  assert.match(e.message, /alpha, beta, chat/);
  // Counted by the front door, on its own /metrics.
  const metrics = await (await fetch(`${main.adminUrl}/metrics`)).text();
  assert.match(metrics, /kvgate_front_door_rejections_total\{status="404",reason="unknown-model"\} [1-9]/);
  assert.match(metrics, /kvgate_front_door_requests_total\{pool="pool-a"\} [1-9]/);
});

test("an unknown route gets a 404, a wrong method a 405, each naming what to use", async () => {
  const none = await fetch(`${main.url}/v2/anything`);
  assert.equal(none.status, 404);
  assert.match(
    ((await none.json()) as Json).error.message,
    /^No route for GET \/v2\/anything; use POST \/v1\/completions, \/v1\/chat\/completions or \/v1\/embeddings, or GET \/v1\/models or \/health/,
  );
  const get = await fetch(`${main.url}/v1/chat/completions`);
  assert.equal(get.status, 405);
  assert.equal(get.headers.get("allow"), "POST");
  assert.equal(
    ((await get.json()) as Json).error.message,
    "Method GET is not allowed on /v1/chat/completions; use POST",
  );
  const post = await fetch(`${main.url}/health`, { method: "POST", body: "{}" });
  assert.equal(post.status, 405);
  assert.equal(((await post.json()) as Json).error.message, "Method POST is not allowed on /health; use GET");
});

test("a 70/30 rewrite splits 1,000 requests within 2% of its weights", { timeout: 120_000 }, async () => {
  const a0 = sum(poolA);
  const b0 = sum(poolB);
  const n = 1000;
  let next = 0;
  const models = new Map<string, number>();
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < n) {
        next++;
        const r = await complete(main, "chat");
        assert.equal(r.status, 200, r.text);
        models.set(r.body.model, (models.get(r.body.model) ?? 0) + 1);
      }
    }),
  );
  const a = sum(poolA) - a0;
  const b = sum(poolB) - b0;
  assert.equal(a + b, n);
  assert.ok(Math.abs(a / n - 0.7) <= 0.02, `alpha share ${a / n}`);
  assert.ok(Math.abs(b / n - 0.3) <= 0.02, `beta share ${b / n}`);
  // The replicas saw the rewritten model names (they answer with the model they were asked for).
  assert.equal(models.get("alpha"), a);
  assert.equal(models.get("beta"), b);
});

test("GET /v1/models lists both pools' models and the rewrite's source name", async () => {
  const r = await fetch(`${main.url}/v1/models`);
  assert.equal(r.status, 200);
  const ids = ((await r.json()) as Json).data.map((c: Json) => c.id).sort();
  assert.deepEqual(ids, ["alpha", "beta", "chat"]);
});

test("admin: /pools and each pool's own admin API", async () => {
  const pools = (await (await fetch(`${main.adminUrl}/pools`)).json()) as Json;
  assert.deepEqual(
    pools.pools.map((p: Json) => [p.name, p.endpoints.length, p.replicaModels]),
    [
      ["pool-a", 2, ["alpha"]],
      ["pool-b", 1, ["beta"]],
    ],
  );
  const eps = await fetch(`${main.adminUrl}/pools/pool-b/endpoints`);
  assert.equal(eps.status, 200);
  assert.match(await eps.text(), new RegExp(id(poolB[0])));
  const metrics = await (await fetch(`${main.adminUrl}/pools/pool-a/metrics`)).text();
  // The pool's own registry: its InferencePool gauges carry its name.
  assert.match(metrics, /\{name="pool-a"\} 2\b/);
  assert.doesNotMatch(metrics, /name="pool-b"/);
  assert.equal((await fetch(`${main.adminUrl}/pools/nope/endpoints`)).status, 404);
});

test("the trusted header chooses the model only from trusted sources", { timeout: 30_000 }, async () => {
  const trusting = await front(
    "trustedHeader: { name: x-selected-model, selects: model, trustedSources: [127.0.0.0/8] }",
  );
  const elsewhere = await front(
    "trustedHeader: { name: x-selected-model, selects: model, trustedSources: [10.0.0.0/8] }",
  );
  const b0 = sum(poolB);
  const r = await complete(trusting, "alpha", { "x-selected-model": "beta" });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.model, "beta");
  assert.equal(sum(poolB) - b0, 1);
  const ignored = await complete(elsewhere, "alpha", { "x-selected-model": "beta" });
  assert.equal(ignored.status, 200);
  assert.equal(ignored.body.model, "alpha");
  assert.equal(sum(poolB) - b0, 1);
  // Without a trustedHeader config the header is just a header.
  const plain = await complete(main, "alpha", { "x-selected-model": "beta" });
  assert.equal(plain.body.model, "alpha");
});

test("the trusted header may name the pool instead", { timeout: 30_000 }, async () => {
  const byPool = await front("trustedHeader: { name: x-kvgate-pool, selects: pool }");
  const r = await complete(byPool, "beta", { "x-kvgate-pool": "pool-b" });
  assert.equal(r.status, 200, r.text);
  const bad = await complete(byPool, "beta", { "x-kvgate-pool": "pool-z" });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /pool "pool-z".*pools: pool-a, pool-b/);
});

test("bad pools files get errors that say what to write", () => {
  const bad = (text: string, re: RegExp) =>
    assert.throws(
      () => parsePoolsFile(text, "p.yaml", "."),
      (e: Error) => e.name === "PoolsFileError" && re.test(e.message),
    );
  bad("pools: []", /at least one pool/);
  bad("pools: [{ name: a }]", /exactly one of endpoints .*, endpointsFile .* or inferencePool/);
  bad("pools: [{ name: a, endpoints: x:1, endpointsFile: f }]", /exactly one of endpoints/);
  bad(
    "pools: [{ name: a, endpoints: x:1, inferencePool: { name: p } }]",
    /exactly one of .* or inferencePool/,
  );
  bad(
    "pools: [{ name: a, inferencePool: { name: p, group: example.com } }]",
    /inference\.networking\.k8s\.io \(v1\)/,
  );
  bad("pools: [{ name: a, inferencePool: { pool: p } }]", /pool/);
  bad("pools: [{ name: A_b, endpoints: x:1 }]", /DNS label/);
  bad("pools: [{ name: a, endpoints: x:1, colour: red }]", /colour/);
  bad("pools: [{ name: a, endpoints: x:1 }, { name: a, endpoints: y:1 }]", /used twice/);
  bad(
    "pools: [{ name: a, endpoints: x:1, models: [m] }, { name: b, endpoints: y:1, models: [m] }]",
    /model m is declared by pools a and b/,
  );
  bad(
    "pools: [{ name: a, endpoints: x:1 }]\nrewrites: [{ kind: InferenceModelRewrite, metadata: { name: r }, spec: { rules: [{ targets: [{ modelRewrite: m, weight: 0 }] }] } }]",
    /weight must be an integer/,
  );
  bad(
    "pools: [{ name: a, endpoints: x:1 }]\nrewrites: missing.yaml",
    /rewrites file .*missing\.yaml.*check the path/,
  );
  bad(
    "pools: [{ name: a, endpoints: x:1 }]\ntrustedHeader: { name: x-pool, selects: pool, trustedSources: [10.0.0.0/40] }",
    /not an address or CIDR/,
  );
  bad(
    "pools: [{ name: a, endpoints: x:1 }]\ntrustedHeader: { name: Pool, selects: pool }",
    /starting with x-/,
  );
  bad("pools: [", /not valid YAML/);
});
