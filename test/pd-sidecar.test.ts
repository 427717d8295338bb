/**
 * `kvgate pd-sidecar` in front of a scripted local vLLM: x-prefiller-host-port runs the two legs
 * (and never reaches vLLM), its values read as llm-d's sidecar reads them; SSRF protection refuses
 * a prefiller outside the allowlist (host and port) with an OpenAI 403; without the header every
 * request goes straight to vLLM, its errors verbatim; a dead prefiller is a counted local prefill on
 * the sidecar's /metrics; --inference-pool's allowlist follows the pool's pods (fake API server);
 * llm-d's flags for what kvgate lacks are refused with what to do.
 */
import assert from "node:assert/strict";
import { type TestContext, test } from "node:test";
import { request } from "undici";
import { startKubernetesDiscovery } from "../src/cli/epp-kubernetes.ts";
import { checkSidecarFlags } from "../src/cli/pd-sidecar.ts";
import { EndpointSource } from "../src/datalayer/endpoints.ts";
import { type PdSidecarOptions, startPdSidecar } from "../src/gateway/pd/sidecar.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { type FakeServer, startFake, waitFor } from "./helpers/gateway-fakes.ts";
import { NS, pod, poolV1 } from "./helpers/kube-fixtures.ts";
import {
  decodeOk,
  fakeReplica,
  generations,
  LONG_PROMPT,
  PREFILL_PARAMS,
  PREFILLER_CACHED,
  prefillOk,
  sampleValue,
} from "./helpers/pd-fakes.ts";
import { scrapeMetrics } from "./helpers/replica.ts";

async function setup(t: TestContext, opts: Partial<PdSidecarOptions> = {}, prefillers = 1) {
  const vllm = await fakeReplica(decodeOk);
  vllm.routes.set(
    "POST /v1/embeddings",
    (_q, res) =>
      void res
        .writeHead(500, { "content-type": "application/json", "x-vllm": "1" })
        .end('{"error":{"message":"engine dead"}}'),
  );
  const ps: FakeServer[] = [];
  for (let i = 0; i < prefillers; i++) ps.push(await fakeReplica(prefillOk));
  const logs: string[] = [];
  const sc = await startPdSidecar({
    host: "127.0.0.1",
    port: 0,
    vllmPort: vllm.port,
    allowlist: EndpointSource.fromList(ps.map((p) => p.id).join(",")),
    metricsPort: 0,
    log: (l) => logs.push(l),
    ...opts,
  });
  t.after(async () => {
    await sc.close();
    await Promise.all([vllm, ...ps].map((f) => f.close()));
  });
  return { sc, vllm, ps, logs };
}

async function call(
  url: string,
  path: string,
  body: object | null,
  headers: Record<string, string | string[]> = {},
) {
  const r = await request(`${url}${path}`, {
    method: body ? "POST" : "GET",
    body: body ? JSON.stringify(body) : undefined,
    headers: { "content-type": "application/json", ...headers },
  });
  return { status: r.statusCode, headers: r.headers, text: await r.body.text() };
}

test("the EPP's prefiller: prefill there, decode on the local vLLM, and vLLM never sees the header", async (t) => {
  const { sc, vllm, ps } = await setup(t);
  const p = ps[0]!;
  const r = await call(
    sc.url,
    "/v1/chat/completions",
    { model: "m", messages: [{ role: "user", content: LONG_PROMPT }] },
    {
      "x-prefiller-host-port": p.id,
    },
  );
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "prefill-decode");
  assert.equal(JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens, PREFILLER_CACHED);
  const [pre] = generations(p);
  const [dec] = generations(vllm);
  assert.deepEqual(
    [pre!.body.max_tokens, pre!.body.max_completion_tokens, pre!.body.min_tokens, pre!.body.stream],
    [1, 1, 1, false],
  );
  assert.deepEqual(dec!.body.kv_transfer_params, PREFILL_PARAMS);
  assert.equal(dec!.headers["x-request-id"], pre!.headers["x-request-id"]);
  for (const g of [pre!, dec!]) assert.equal(g.headers["x-prefiller-host-port"], undefined);
});

test("SSRF protection: a prefiller outside the allowlist (an allowed host on another port too) gets 403 and nothing is sent", async (t) => {
  const { sc, vllm, ps } = await setup(t);
  const p = ps[0]!;
  for (const target of ["203.0.113.7:8000", `127.0.0.1:${p.port === 65535 ? 1 : p.port + 1}`, "not a host"]) {
    const r = await call(
      sc.url,
      "/v1/completions",
      { model: "m", prompt: "x" },
      { "x-prefiller-host-port": target },
    );
    assert.equal(r.status, 403, target);
    const err = JSON.parse(r.text).error;
    assert.deepEqual([err.code, err.type], [403, "PermissionDeniedError"]);
    assert.match(err.message, /not allowed by SSRF protection/);
  }
  assert.equal(generations(p).length + generations(vllm).length, 0);
  assert.equal(sampleValue(await scrapeMetrics(sc.metricsUrl!), "kvgate_pd_ssrf_rejections_total"), 3);
});

test("the header's values as llm-d reads them: one line split on commas, several lines, first unless sampling", async (t) => {
  const { sc, ps } = await setup(t, {}, 2);
  const [a, b] = ps as [FakeServer, FakeServer];
  await call(
    sc.url,
    "/v1/completions",
    { model: "m", prompt: "x" },
    { "x-prefiller-host-port": ` ${b.id} , ${a.id}` },
  );
  await call(
    sc.url,
    "/v1/completions",
    { model: "m", prompt: "x" },
    { "x-prefiller-host-port": [a.id, b.id] },
  );
  assert.deepEqual([generations(a).length, generations(b).length], [1, 1]);

  const s2 = await setup(t, { prefillerSampling: true, seed: 7 }, 2);
  const [c, d] = s2.ps as [FakeServer, FakeServer];
  for (let i = 0; i < 16; i++)
    await call(
      s2.sc.url,
      "/v1/completions",
      { model: "m", prompt: "x" },
      { "x-prefiller-host-port": `${c.id},${d.id}` },
    );
  const counts = [generations(c).length, generations(d).length];
  assert.equal(counts[0]! + counts[1]!, 16);
  assert.ok(counts[0]! > 0 && counts[1]! > 0, `sampling uses both: ${counts}`);
});

test("no header: straight to vLLM, any path and method, vLLM's errors verbatim", async (t) => {
  const { sc, vllm } = await setup(t);
  const models = await call(sc.url, "/v1/models", null);
  assert.equal(models.status, 200);
  assert.equal(JSON.parse(models.text).data[0].id, "m");
  const gen = await call(sc.url, "/v1/completions", { model: "m", prompt: "x", max_tokens: 2 });
  assert.equal(gen.status, 200);
  assert.equal(gen.headers["x-kvgate-pd"], undefined);
  assert.deepEqual(generations(vllm)[0]!.body, { model: "m", prompt: "x", max_tokens: 2 });
  const dead = await call(sc.url, "/v1/embeddings", { model: "m", input: "x" });
  assert.equal(dead.status, 500);
  assert.equal(dead.text, '{"error":{"message":"engine dead"}}');
  assert.equal(dead.headers["x-vllm"], "1");
});

test("a dead prefiller: the local vLLM prefills, x-kvgate-pd says why, the sidecar's /metrics counts it", async (t) => {
  const { sc, vllm, ps, logs } = await setup(t);
  const p = ps[0]!;
  await p.close();
  const r = await call(
    sc.url,
    "/v1/completions",
    { model: "m", prompt: LONG_PROMPT },
    { "x-prefiller-host-port": p.id },
  );
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-prefill-unreachable");
  assert.equal("kv_transfer_params" in generations(vllm)[0]!.body, false);
  const m = await scrapeMetrics(sc.metricsUrl!);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "prefill-unreachable" }), 1);
  assert.ok(logs.some((l) => l.includes("prefill-unreachable")));
});

test("SSRF protection off: any target is used; on without an allowlist: refused at start", async (t) => {
  const { sc, ps } = await setup(t, { ssrfProtection: false, allowlist: null });
  await call(
    sc.url,
    "/v1/completions",
    { model: "m", prompt: "x" },
    { "x-prefiller-host-port": `http://${ps[0]!.id}` },
  );
  assert.equal(generations(ps[0]!).length, 1);
  await assert.rejects(startPdSidecar({ port: 0, host: "127.0.0.1" }), /no allowlist: give --inference-pool/);
});

test("llm-d flags for what kvgate lacks are refused with what to do", () => {
  const ok = {
    host: "0.0.0.0",
    port: 8000,
    vllmHost: "127.0.0.1",
    vllmPort: 8200,
    kvConnector: "nixlv2",
    prefillMaxRetries: 0,
    prefillRetryBackoff: 200,
    prefillTimeout: 60_000,
    prefillFailurePolicy: "recompute" as const,
    enableSsrfProtection: true,
    inferencePool: "ns/pool",
    poolGroup: "inference.networking.k8s.io",
    enablePrefillerSampling: false,
    secureServing: false,
    decodeChunkSize: 0,
    dataParallelSize: 1,
    metricsPort: 0,
    maxBodyBytes: 1 << 20,
    seed: 1,
  };
  assert.equal(checkSidecarFlags(ok), null);
  const cases: Array<[object, RegExp]> = [
    [{ kvConnector: "sglang" }, /sglang is not supported by kvgate pd-sidecar; use nixlv2/],
    [{ kvConnector: "foo" }, /"foo" is unknown; use nixlv2/],
    [{ secureServing: true }, /pass --secure-serving=false/],
    [{ secureProxy: true }, /TLS serving is not supported/],
    [{ certPath: "/tls" }, /--cert-path: TLS is not supported/],
    [{ decodeChunkSize: 256 }, /chunked decode is not supported/],
    [{ inferencePool: undefined }, /no allowlist/],
    [{ endpoints: "1.2.3.4:8000" }, /at most one of --inference-pool, --endpoints/],
  ];
  for (const [change, re] of cases) assert.match(checkSidecarFlags({ ...ok, ...change }) ?? "", re);
  assert.equal(checkSidecarFlags({ ...ok, inferencePool: undefined, enableSsrfProtection: false }), null);
});

test("the local vLLM failing the KV load (500): asked again without the params; with policy fail, its 500 verbatim", async (t) => {
  const kvFails = (f: FakeServer) =>
    f.routes.set("POST /v1/completions", (q, res, raw) => {
      if ("kv_transfer_params" in JSON.parse(raw.toString()))
        return void res
          .writeHead(500, { "content-type": "application/json" })
          .end('{"error":{"message":"NIXL_ERR_BACKEND"}}');
      decodeOk(q, res, raw);
    });
  const a = await setup(t);
  kvFails(a.vllm);
  const r = await call(
    a.sc.url,
    "/v1/completions",
    { model: "m", prompt: LONG_PROMPT },
    { "x-prefiller-host-port": a.ps[0]!.id },
  );
  assert.deepEqual([r.status, r.headers["x-kvgate-pd"]], [200, "fallback-decode-kv-load-failed"]);
  const b = await setup(t, { legs: { failurePolicy: "fail" } });
  kvFails(b.vllm);
  const f = await call(
    b.sc.url,
    "/v1/completions",
    { model: "m", prompt: LONG_PROMPT },
    { "x-prefiller-host-port": b.ps[0]!.id },
  );
  assert.deepEqual([f.status, f.text], [500, '{"error":{"message":"NIXL_ERR_BACKEND"}}']);
  assert.equal(generations(b.vllm).length, 1);
});

test("--inference-pool: the allowlist is the pool's Ready pods × target ports, and follows the pods", async (t) => {
  const api = await FakeKubeApi.start();
  t.after(() => api.close());
  const p = await startFake({ "POST /v1/completions": prefillOk }, 0, "127.0.0.2");
  t.after(() => p.close());
  api.apply(
    crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools"),
    poolV1("pd", { app: "vllm" }, [p.port]),
  );
  api.apply(podsPath(NS), pod("prefill-0", { ip: "127.0.0.2" }));
  const k8s = await startKubernetesDiscovery({
    poolName: "pd",
    poolNamespace: NS,
    poolGroup: "inference.networking.k8s.io",
    leaderElection: false,
    kubeconfig: api.kubeConfig(),
    log: () => {},
  });
  t.after(() => k8s.close());
  const { sc, vllm } = await setup(t, { allowlist: k8s.source });
  await waitFor(() => k8s.source.current().length === 1, "the pool synced");
  const ask = (target: string) =>
    call(sc.url, "/v1/completions", { model: "m", prompt: "x" }, { "x-prefiller-host-port": target });
  assert.equal((await ask(p.id)).status, 200);
  assert.equal(generations(p).length, 1, "the pool's pod on its target port is used");
  assert.equal(
    (await ask(`127.0.0.2:${p.port === 65535 ? 1 : p.port + 1}`)).status,
    403,
    "another port of the pod",
  );
  api.remove(podsPath(NS), "prefill-0");
  await waitFor(() => k8s.source.current().length === 0, "the pod left the pool");
  assert.equal((await ask(p.id)).status, 403, "a pod that left is no longer allowed");
  assert.equal(generations(p).length, 1);
  assert.equal(generations(vllm).length, 1);
});

test("SSRF protection: a decode request naming its own KV source outside the pool's hosts gets 403; a pool prefiller's params pass", async (t) => {
  const { sc, vllm, ps } = await setup(t);
  const forged = {
    do_remote_prefill: true,
    remote_engine_id: "e",
    remote_request_id: "r",
    remote_host: "203.0.113.9",
    remote_port: 5600,
  };
  const bad = await call(sc.url, "/v1/completions", {
    model: "m",
    prompt: "x",
    max_tokens: 2,
    kv_transfer_params: forged,
  });
  assert.equal(bad.status, 403);
  assert.match(JSON.parse(bad.text).error.message, /remote_host "203\.0\.113\.9" is not allowed/);
  assert.equal(generations(vllm).length, 0, "nothing reached vLLM");
  const poolHost = ps[0]!.id.slice(0, ps[0]!.id.lastIndexOf(":"));
  const fromPool = { ...forged, remote_host: poolHost };
  const ok = await call(sc.url, "/v1/completions", {
    model: "m",
    prompt: "x",
    max_tokens: 2,
    kv_transfer_params: fromPool,
  });
  assert.equal(ok.status, 200, "a prefiller of the pool, on its side-channel port");
  assert.deepEqual(generations(vllm)[0]!.body.kv_transfer_params, fromPool, "passed on untouched");
  const m = await scrapeMetrics(sc.metricsUrl!);
  assert.equal(sampleValue(m, "kvgate_pd_ssrf_rejections_total", {}), 1);
});
