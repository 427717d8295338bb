/**
 * Issue 12's Done-when, through `kvgate serve` (in-process, config/examples/pd.yaml) in front of
 * simulated replicas playing vLLM's NixlConnector roles: a long prompt is prefilled on the producer
 * and decoded on the consumer, which pulls the KV over the side channel (both replicas' metrics show
 * it); a short or fully cached prompt skips P/D; the prefiller killed mid-run loses no request; a
 * prefiller without kv_transfer_params is a counted local prefill; a client's x-prefiller-host-port
 * reaches no one; lease expiry frees the prefiller's blocks; a client gone between the legs frees them.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { type TestContext, test } from "node:test";
import { request } from "undici";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../src/gateway/gateway.ts";
import { connectionsGone, waitFor } from "./helpers/gateway-fakes.ts";
import { headerFirstRelay, modelOf, pdMetrics, type Relay, specFor } from "./helpers/pd-e2e.ts";
import { LONG_PROMPT, SHORT_PROMPT, sampleValue } from "./helpers/pd-fakes.ts";
import { startPdReplica } from "./helpers/pd-replicas.ts";
import {
  type Json,
  parseSse,
  scrapeMetrics,
  startTestReplica,
  type TestReplica,
  waitFor as waitUntil,
} from "./helpers/replica.ts";

/**
 * The producers' lease in these tests: 3000 s, 30 s of wall time at the replicas' 100x, so that on a
 * loaded machine the blocks outlive the gap between the legs (the default 30 s is 300 ms of wall
 * time). The lease test sets its own.
 */
const LONG_LEASE = { kv_lease_duration: 3000 };

const PD = readFileSync(new URL("../config/examples/pd.yaml", import.meta.url), "utf8");

/** pd.yaml with an aggregated fallback profile: with the prefill pool gone, requests still run. */
const PD_WITH_FALLBACK = PD.replace(
  "    deciders:\n      prefill: prefix-based-pd-decider",
  "    profiles:\n      fallback: aggregated\n    deciders:\n      prefill: prefix-based-pd-decider",
).concat(
  "- name: aggregated\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: queue-scorer\n",
);

interface Fleet {
  p: TestReplica;
  relay: Relay | null;
  d: TestReplica;
  gw: GatewayHandle;
  model: string;
  logs: string[];
}

async function fleet(
  t: TestContext,
  o: {
    prefiller?: () => Promise<TestReplica>;
    decoderExtra?: Record<string, unknown>;
    prefillerExtra?: Record<string, unknown>;
    /** A holding header-first relay in front of the prefiller (the window between the legs). */
    relay?: boolean;
    gateway?: Partial<GatewayOptions>;
  } = {},
): Promise<Fleet> {
  const p = await (
    o.prefiller ?? (() => startPdReplica("kv_producer", { ...LONG_LEASE, ...o.prefillerExtra }))
  )();
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer", o.decoderExtra);
  t.after(() => d.close());
  const relay = o.relay ? await headerFirstRelay(p, { hold: true }) : null;
  if (relay) t.after(() => relay.close());
  const prefillPort = relay?.port ?? p.port;
  const logs: string[] = [];
  const gw = await startGateway({
    endpoints: [specFor(prefillPort, "prefill"), specFor(d.port, "decode")],
    config: PD,
    scrapeIntervalMs: 20,
    log: (l) => logs.push(l),
    ...o.gateway,
  });
  t.after(() => gw.close());
  await waitFor(() => gw.gateway.data.store.all().every((r) => r.modelIds !== null), "first scrape");
  return { p, relay, d, gw, model: modelOf(p), logs };
}

async function complete(f: Fleet, prompt: string, extra: object = {}, headers: Record<string, string> = {}) {
  const r = await request(`${f.gw.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: f.model, prompt, max_tokens: 8, ...extra }),
    headers: { "content-type": "application/json", ...headers },
  });
  const text = await r.body.text();
  return { status: r.statusCode, pd: r.headers["x-kvgate-pd"], text };
}

const gatewayMetrics = (f: Fleet) => scrapeMetrics(f.gw.adminUrl);

test("a long prompt: prefilled on the producer, decoded on the consumer, which pulled the KV; both replicas' metrics show it", async (t) => {
  const f = await fleet(t);
  const r = await complete(f, LONG_PROMPT, { stream: true, stream_options: { include_usage: true } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.pd, "prefill-decode");
  const events = parseSse(r.text);
  assert.equal(events.at(-1), "[DONE]");
  const usage = events.find((e: Json) => e !== "[DONE]" && e.usage)?.usage;
  assert.equal(
    usage.prompt_tokens_details.cached_tokens,
    0,
    "the prefiller's count (a cold cache), as llm-d reports it",
  );

  const dm = await pdMetrics(f.d);
  const pm = await pdMetrics(f.p);
  assert.equal(pm.localCompute, usage.prompt_tokens, "the producer computed the whole prompt");
  assert.equal(dm.externalKv, usage.prompt_tokens - 1, "the consumer pulled all but the last token");
  assert.equal(dm.localCompute, 1);
  assert.equal(dm.xferCount, 1, "one NIXL transfer on the consumer");
  assert.ok(dm.bytes > 0 && dm.xferSeconds > 0);
  assert.equal(pm.xferCount, 0);
  await waitFor(
    () => f.p.server.engine.heldRequestIds().length === 0,
    "the producer freed the blocks once read",
  );
  assert.equal((await pdMetrics(f.p)).expired, 0, "freed by the read, not the lease");

  const gm = await gatewayMetrics(f);
  assert.equal(sampleValue(gm, "llm_d_epp_disagg_decision_total", { decision_type: "prefill-decode" }), 1);
  assert.equal(sampleValue(gm, "kvgate_pd_prefill_legs_total", { outcome: "kv-transfer" }), 1);
});

test("a short prompt skips P/D; so does a prompt the decoder already holds", async (t) => {
  const f = await fleet(t);
  const short = await complete(f, SHORT_PROMPT);
  assert.equal(short.status, 200, short.text);
  assert.equal(short.pd, "decode-only");
  assert.equal((await pdMetrics(f.p)).promptTokens, 0, "the producer saw nothing");

  const first = await complete(f, LONG_PROMPT);
  assert.equal(first.pd, "prefill-decode");
  const before = await pdMetrics(f.p);
  const again = await complete(f, LONG_PROMPT);
  assert.equal(again.status, 200, again.text);
  assert.equal(again.pd, "decode-only", "the decoder's cache covers the prompt");
  const after = await pdMetrics(f.p);
  assert.equal(after.promptTokens, before.promptTokens, "no second prefill on the producer");
  assert.equal((await pdMetrics(f.d)).xferCount, 1, "and no second transfer");
  const gm = await gatewayMetrics(f);
  assert.equal(sampleValue(gm, "llm_d_epp_disagg_decision_total", { decision_type: "decode-only" }), 2);
});

test("the prefiller killed mid-run: no request is lost (with an aggregated fallback profile once the prefill pool is empty)", async (t) => {
  const f = await fleet(t, { gateway: { config: PD_WITH_FALLBACK } });
  const one = (i: number) =>
    complete(f, `${i} ${LONG_PROMPT}`, { stream: true, max_tokens: 16 }).then((r) => ({
      ...r,
      done: parseSse(r.text).at(-1),
    }));
  const first = await Promise.all([0, 1].map(one));
  const during = [2, 3, 4, 5, 6, 7].map(one);
  const finished = () => Object.values(f.p.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
  await waitFor(() => finished() >= 3, "a prefill of the second wave done");
  f.p.server.crash(); // the others are prefilling, waiting for their KV, or decoding
  const rest = await Promise.all([...during, ...[8, 9].map(one)]);
  const all = [...first, ...rest];
  assert.deepEqual(
    all.map((r) => [r.status, r.done]),
    all.map(() => [200, "[DONE]"]),
    all.map((r) => `${r.status} ${r.pd} ${r.text.slice(0, 120)}`).join("\n"),
  );
  assert.deepEqual(
    first.map((r) => r.pd),
    ["prefill-decode", "prefill-decode"],
  );
  const gm = await gatewayMetrics(f);
  const fallbacks = rest.filter((r) => String(r.pd).startsWith("fallback-")).length;
  assert.equal(sampleValue(gm, "kvgate_pd_fallbacks_total"), fallbacks, "each fallback counted");
});

test("a prefiller that returns no kv_transfer_params (no NixlConnector) is counted and served by a local prefill", async (t) => {
  const f = await fleet(t, { prefiller: () => startTestReplica() });
  const r = await complete(f, LONG_PROMPT);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.pd, "fallback-no-kv-transfer-params");
  const dm = await pdMetrics(f.d);
  assert.equal(dm.externalKv, 0);
  assert.equal(dm.localCompute, JSON.parse(r.text).usage.prompt_tokens, "the decoder prefilled it all");
  const gm = await gatewayMetrics(f);
  assert.equal(sampleValue(gm, "kvgate_pd_fallbacks_total", { reason: "no-kv-transfer-params" }), 1);
});

test("a client-sent x-prefiller-host-port is never used, whether or not P/D runs", async (t) => {
  const f = await fleet(t);
  const x = await startTestReplica();
  t.after(() => x.close());
  const forged = { "x-prefiller-host-port": `127.0.0.1:${x.port}` };
  assert.equal((await complete(f, SHORT_PROMPT, {}, forged)).pd, "decode-only");
  assert.equal((await complete(f, LONG_PROMPT, {}, forged)).pd, "prefill-decode");
  assert.equal((await pdMetrics(x)).promptTokens, 0, "the forged target got nothing");
  assert.ok((await pdMetrics(f.p)).promptTokens > 0, "the scheduler's prefiller did the prefill");
});

test("lease expiry frees the prefiller's blocks when no decoder comes for them", async (t) => {
  // vLLM's default lease; no scrape after the first, so the gateway still thinks the decoder is up
  const f = await fleet(t, {
    prefillerExtra: { kv_lease_duration: 30 },
    gateway: { scrapeIntervalMs: 60_000 },
  });
  await f.d.close(); // the decoder dies between the legs; the gateway still thinks it is up
  const r = await complete(f, LONG_PROMPT);
  assert.equal(r.status, 503, r.text);
  assert.equal(r.pd, "prefill-decode", "the prefill leg ran; the decode leg found no decoder");
  await waitFor(() => f.p.server.engine.heldRequestIds().length === 0, "the lease expired");
  assert.equal((await pdMetrics(f.p)).expired, 1, "vllm:nixl_num_kv_expired_reqs counted it");
});

test("a client gone between the legs: kvgate's one-token decode reads the blocks and the prefiller frees them", async (t) => {
  const f = await fleet(t, { relay: true, prefillerExtra: { kv_lease_duration: 3000 } });
  const ac = new AbortController();
  const pending = request(`${f.gw.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: f.model, prompt: LONG_PROMPT, max_tokens: 200, stream: true }),
    headers: { "content-type": "application/json" },
    signal: ac.signal,
  }).catch(() => null);
  await waitFor(() => f.relay!.posts === 1, "the prefill answer has begun");
  ac.abort();
  await pending;
  await connectionsGone(f.gw);
  f.relay!.open(); // the prefiller computes and answers only now, with the client gone
  await waitUntil(
    async () =>
      sampleValue(await gatewayMetrics(f), "kvgate_pd_disconnect_releases_total", { result: "released" }) ===
      1,
  );
  await waitFor(() => f.p.server.engine.heldRequestIds().length === 0, "freed");
  const pm = await pdMetrics(f.p);
  assert.equal(pm.expired, 0, "not by the lease (3000 s)");
  const dm = await pdMetrics(f.d);
  assert.equal(dm.xferCount, 1, "the decoder read them");
  assert.ok(dm.externalKv > 0);
});
