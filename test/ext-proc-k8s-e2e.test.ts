/**
 * `kvgate epp` fed by Kubernetes discovery, end to end behind the Envoy-like proxy: an InferencePool
 * in the in-process fake API server (no kube-apiserver can run here), pods that join and leave it,
 * and simulated replicas at the pods' IPs (distinct loopback addresses 127.0.0.2/3 sharing the
 * pool's one target port). Requests go client → proxy → ext_proc → the picked pod.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import { type KubernetesPool, startKubernetesPool } from "../src/datalayer/kubernetes/pool.ts";
import { type EppHandle, startEpp } from "../src/gateway/ext-proc/epp.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, pod, poolV1, until } from "./helpers/kube-fixtures.ts";
import { freePort } from "./helpers/local-epp.ts";
import { postJson, requestsServed, startTestReplica, type TestReplica } from "./helpers/replica.ts";

const PODS = podsPath(NS);
const POOLS = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
const served = requestsServed;

const cleanups: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => {});
});

let api: FakeKubeApi;
let pool: KubernetesPool;
let epp: EppHandle;
let proxyUrl: string;
let a: TestReplica;
let b: TestReplica;
let port: number;

before(async () => {
  port = await freePort("127.0.0.2");
  [a, b] = await Promise.all([
    startTestReplica({ host: "127.0.0.2", port, servedModelName: "m" }),
    startTestReplica({ host: "127.0.0.3", port, servedModelName: "m" }),
  ]);
  cleanups.push(() => Promise.all([a.close(), b.close()]).then(() => {}));
  api = await FakeKubeApi.start();
  cleanups.push(() => api.close());
  api.apply(POOLS, poolV1("qwen", { app: "qwen" }, [port]));
  api.apply(PODS, pod("qwen-a", { ip: "127.0.0.2", labels: { app: "qwen" } }));
  api.apply(PODS, pod("qwen-b", { ip: "127.0.0.3", labels: { app: "qwen" }, ready: false }));
  pool = startKubernetesPool({
    poolName: "qwen",
    namespace: NS,
    kubeconfig: api.kubeConfig(),
    log: () => {},
    retry: { backoffMs: { initial: 10, max: 50 }, absentRetryMs: 50 },
  });
  cleanups.push(() => pool.close());
  await pool.ready;
  epp = await startEpp({
    source: pool.source,
    resources: () => pool.resources(),
    ready: () => pool.isReady(),
    grpcHost: "127.0.0.1",
    grpcPort: 0,
    grpcHealthPort: 0,
    metricsPort: 0,
    scrapeIntervalMs: 25,
    seed: 3,
    log: () => {},
  });
  cleanups.push(() => epp.close());
  const proxy = await startEnvoyLikeProxy({ extProc: `127.0.0.1:${epp.grpc.port}`, tls: epp.grpc.secure });
  cleanups.push(() => proxy.close());
  proxyUrl = proxy.url;
});

const scraped = (id: string) => Boolean(epp.gateway.data.store.get(id)?.state.metrics);
const complete = (prompt: string) =>
  postJson(`${proxyUrl}/v1/completions`, { model: "m", prompt, max_tokens: 2 }).then((r) => {
    assert.equal(r.status, 200, r.text);
  });

test("pods joining and leaving the InferencePool are picked and dropped", { timeout: 60_000 }, async () => {
  await until("pod a scraped", () => scraped(`127.0.0.2:${port}`), Boolean);
  const before0 = [served(a), served(b)];
  for (let i = 0; i < 3; i++) await complete(`only a is Ready ${i}`);
  assert.deepEqual([served(a) - before0[0]!, served(b) - before0[1]!], [3, 0]);

  api.apply(PODS, pod("qwen-b", { ip: "127.0.0.3", labels: { app: "qwen" } })); // becomes Ready
  await until("pod b joined and scraped", () => scraped(`127.0.0.3:${port}`), Boolean);
  const before1 = served(b);
  for (let i = 0; i < 12 && served(b) === before1; i++)
    await complete(`fresh prompt ${i} ${"x".repeat(i * 50)}`);
  assert.ok(served(b) > before1, "the new pod receives requests");

  api.apply(PODS, pod("qwen-a", { ip: "127.0.0.2", labels: { app: "qwen" }, deleting: true }));
  await until(
    "pod a dropped",
    () => epp.gateway.data.store.get(`127.0.0.2:${port}`),
    (e) => e === undefined,
  );
  const before2 = [served(a), served(b)];
  for (let i = 0; i < 3; i++) await complete(`only a is Ready ${i}`); // a's prefixes, but a is gone
  assert.deepEqual([served(a) - before2[0]!, served(b) - before2[1]!], [0, 3]);
});
