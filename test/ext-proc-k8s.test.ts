/**
 * `kvgate epp --pool-name` end to end with Kubernetes discovery against the in-process fake API
 * server (no kube-apiserver runs here): the pool's Ready pods become the endpoints an ext_proc client
 * gets picks from, an InferenceModelRewrite from the cluster rewrites the body, health turns SERVING
 * once the pool is listed, and pods that leave stop being picked.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type KubernetesDiscovery, startKubernetesDiscovery } from "../src/cli/epp-kubernetes.ts";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  requestBody,
  requestHeaders,
  setHeaders,
  startTestEpp,
  upstreamRoot,
} from "./helpers/ext-proc-client.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";
import { NS, pod, poolV1, rewrite } from "./helpers/kube-fixtures.ts";

const ctor = clientCtor(upstreamRoot());
let api: FakeKubeApi;
let replicas: FakeServer[];
let k8s: KubernetesDiscovery;
let epp: EppHandle;

before(async () => {
  api = await FakeKubeApi.start();
  const routes = {
    "GET /metrics": (_q: unknown, res: import("node:http").ServerResponse) =>
      void res.writeHead(200).end(vllmMetrics()),
    "GET /v1/models": (_q: unknown, res: import("node:http").ServerResponse) =>
      void res.writeHead(200).end(modelList("m")),
  };
  // Two pods on one target port, on distinct loopback addresses, as pods have distinct IPs.
  const first = await startFake(routes, 0, "127.0.0.2");
  replicas = [first, await startFake(routes, first.port, "127.0.0.3")];
  api.apply(
    crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools"),
    poolV1("vllm", { app: "vllm" }, [first.port]),
  );
  api.apply(podsPath(NS), pod("vllm-0", { ip: "127.0.0.2" }));
  api.apply(podsPath(NS), pod("vllm-1", { ip: "127.0.0.3" }));
  api.apply(
    crdPath("llm-d.ai", "v1alpha2", NS, "inferencemodelrewrites"),
    rewrite("alias", "vllm", [{ matches: ["friendly"], targets: [["m"]] }]),
  );
  k8s = await startKubernetesDiscovery({
    poolName: "vllm",
    poolNamespace: NS,
    poolGroup: "inference.networking.k8s.io",
    leaderElection: false,
    kubeconfig: api.kubeConfig(),
    log: () => {},
  });
  epp = await startTestEpp([], {
    source: k8s.source,
    resources: k8s.resources,
    isLeader: k8s.isLeader,
    ready: k8s.ready,
  });
});

after(async () => {
  await epp?.close();
  await k8s?.close();
  await api?.close?.();
  await Promise.all((replicas ?? []).map((r) => r.close()));
});

/** Each question's own text, so no two share a prefix by accident. */
let asked = 0;

async function ask(model: string) {
  const c = new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate));
  c.send(requestHeaders(CHAT_PATH), requestBody(chatBody(`k8s question ${++asked}`, model), true));
  let rs = await c.waitFor(1);
  if (!rs[0].immediate_response) rs = await c.waitFor(2);
  const out = {
    code: rs[0].immediate_response?.status.code ?? 200,
    dest: setHeaders(rs[0].request_headers?.response.header_mutation)["x-gateway-destination-endpoint"],
    body: rs[1]?.request_body?.response.body_mutation?.streamed_response?.body.toString(),
  };
  c.call.cancel();
  return out;
}

test("the pool's Ready pods are picked, the cluster's rewrite applies, and pods that leave are dropped", async () => {
  await waitFor(() => epp.serving(), "SERVING after the pool was listed");
  await waitFor(
    () => epp.gateway.data.store.all().filter((r) => r.modelIds !== null).length === 2,
    "both pods scraped",
  );
  await waitFor(() => k8s.resources().rewrites.length === 1, "the rewrite listed");
  const ids = new Set(replicas.map((r) => r.id));
  const r = await ask("friendly");
  assert.equal(r.code, 200);
  assert.ok(ids.has(r.dest), r.dest);
  assert.equal(JSON.parse(r.body ?? "{}").model, "m");

  api.remove(podsPath(NS), "vllm-0");
  await waitFor(() => epp.gateway.data.store.size === 1, "vllm-0 dropped");
  for (let i = 0; i < 3; i++) assert.equal((await ask("m")).dest, replicas[1].id);
  api.remove(podsPath(NS), "vllm-1");
  await waitFor(() => epp.gateway.data.store.size === 0, "vllm-1 dropped");
  assert.equal((await ask("m")).code, 503);
});
