/**
 * `kvgate epp --pools` with pools discovered from Kubernetes, end to end behind the Envoy-like proxy:
 * two InferencePools in the in-process fake API server (no kube-apiserver can run here), each pool
 * of the pools file naming one, with simulated replicas at the pods' IPs (distinct loopback
 * addresses sharing the pools' one target port). Each pool has its own watch: a pod joining one
 * pool serves only that pool's model; a cluster InferenceModelRewrite scoped to one pool applies
 * inside it; an unknown model gets the 404.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import { type MultiPoolEppHandle, startMultiPoolEpp } from "../src/gateway/multi-pool/epp-pools.ts";
import { parsePoolsFile } from "../src/gateway/multi-pool/pools-file.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, pod, poolV1, rewrite, until } from "./helpers/kube-fixtures.ts";
import { freePort, LOCAL_EPP } from "./helpers/local-epp.ts";
import { postJson, requestsServed, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const PODS = podsPath(NS);
const POOLS = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
const REWRITES = crdPath("llm-d.ai", "v1alpha2", NS, "inferencemodelrewrites");
const served = requestsServed;

const cleanups: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

let api: FakeKubeApi;
let epp: MultiPoolEppHandle;
let proxyUrl: string;
let port: number;
/** qwen pool: q1 (Ready at start), q2 (joins later); llama pool: l1. */
let q1: TestReplica;
let q2: TestReplica;
let l1: TestReplica;

before(async () => {
  port = await freePort("127.0.0.2");
  [q1, q2, l1] = await Promise.all([
    startTestReplica({ host: "127.0.0.2", port, servedModelName: "qwen" }),
    startTestReplica({ host: "127.0.0.3", port, servedModelName: "qwen" }),
    startTestReplica({ host: "127.0.0.4", port, servedModelName: "llama" }),
  ]);
  cleanups.push(() => Promise.all([q1.close(), q2.close(), l1.close()]).then(() => {}));
  api = await FakeKubeApi.start();
  cleanups.push(() => api.close());
  api.apply(POOLS, poolV1("qwen", { app: "qwen" }, [port]));
  api.apply(POOLS, poolV1("llama", { app: "llama" }, [port]));
  api.apply(PODS, pod("qwen-1", { ip: "127.0.0.2", labels: { app: "qwen" } }));
  api.apply(PODS, pod("qwen-2", { ip: "127.0.0.3", labels: { app: "qwen" }, ready: false }));
  api.apply(PODS, pod("llama-1", { ip: "127.0.0.4", labels: { app: "llama" } }));
  // Scoped to the qwen pool: "chat" is served there, as qwen.
  api.apply(REWRITES, rewrite("chat-to-qwen", "qwen", [{ matches: ["chat"], targets: [["qwen"]] }]));
  const spec = parsePoolsFile(
    `pools:
  - { name: pool-qwen, inferencePool: { name: qwen, namespace: ${NS} } }
  - { name: pool-llama, inferencePool: { name: llama, namespace: ${NS} }, models: [llama] }
`,
    "pools.yaml",
    ".",
  );
  epp = await startMultiPoolEpp({
    poolsSpec: spec,
    kubeconfig: api.kubeConfig(),
    ...LOCAL_EPP,
    seed: 5,
  });
  cleanups.push(() => epp.close());
  const proxy = await startEnvoyLikeProxy({ extProc: `127.0.0.1:${epp.grpc.port}`, tls: epp.grpc.secure });
  cleanups.push(() => proxy.close());
  proxyUrl = proxy.url;
});

const store = (pool: string) => epp.live.current.pools.get(pool)?.data.store;
const scraped = (pool: string, id: string) =>
  Boolean(store(pool)?.get(id)?.state.metrics && store(pool)?.get(id)?.modelIds);
const complete = (model: string, prompt: string) =>
  postJson(`${proxyUrl}/v1/completions`, { model, prompt, max_tokens: 2 });

test("each discovered pool serves only its model, from its own pods", { timeout: 60_000 }, async () => {
  await until(
    "both pools' pods scraped",
    () => scraped("pool-qwen", `127.0.0.2:${port}`) && scraped("pool-llama", `127.0.0.4:${port}`),
    Boolean,
  );
  await until("SERVING", () => epp.serving(), Boolean);
  assert.deepEqual(
    store("pool-qwen")
      ?.all()
      .map((e) => e.spec.id),
    [`127.0.0.2:${port}`],
  );
  assert.deepEqual(
    store("pool-llama")
      ?.all()
      .map((e) => e.spec.id),
    [`127.0.0.4:${port}`],
  );
  const before = [served(q1), served(q2), served(l1)];
  for (let i = 0; i < 6; i++) {
    const model = i % 2 ? "llama" : "qwen";
    const r = await complete(model, `hello ${i}`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.model, model);
  }
  assert.deepEqual([served(q1) - before[0]!, served(q2) - before[1]!, served(l1) - before[2]!], [3, 0, 3]);
});

test("a pod joining one InferencePool joins only that pool", { timeout: 60_000 }, async () => {
  api.apply(PODS, pod("qwen-2", { ip: "127.0.0.3", labels: { app: "qwen" } })); // becomes Ready
  await until(
    "qwen-2 joined pool-qwen and was scraped",
    () => scraped("pool-qwen", `127.0.0.3:${port}`),
    Boolean,
  );
  assert.equal(store("pool-llama")?.get(`127.0.0.3:${port}`), undefined);
  const before = [served(q2), served(l1)];
  for (let i = 0; i < 12 && served(q2) === before[0]; i++) {
    const r = await complete("qwen", `fresh prompt ${i} ${"x".repeat(i * 40)}`);
    assert.equal(r.status, 200, r.text);
  }
  assert.ok(served(q2) > before[0]!, "the new pod receives qwen requests");
  assert.equal(served(l1), before[1], "llama's pod got none of them");
});

test("a cluster InferenceModelRewrite scoped to a pool applies inside it", { timeout: 60_000 }, async () => {
  const before = served(l1);
  const qwenBefore = served(q1) + served(q2);
  const r = await complete("chat", "rewritten");
  assert.equal(r.status, 200, r.text);
  assert.equal(r.body.model, "chat"); // the client's name comes back
  assert.equal(served(q1) + served(q2) - qwenBefore, 1);
  assert.equal(served(l1), before);
});

test("an unknown model gets the 404 naming what the pools serve", { timeout: 30_000 }, async () => {
  const r = await complete("mistral", "x");
  assert.equal(r.status, 404, r.text);
  assert.equal(r.body.error.param, "model");
  assert.match(r.body.error.message, /`mistral` does not exist.*llama, qwen/);
});
