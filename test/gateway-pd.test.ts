/**
 * `kvgate serve` running the two P/D legs itself (config/examples/pd.yaml) against scripted vLLM
 * stand-ins: the prefill body as llm-d's sidecar sends it, the decode body with the prefiller's
 * kv_transfer_params verbatim, one x-request-id on both, cached_tokens rewritten in JSON and SSE;
 * a short prompt skips the prefiller; every prefill failure is a counted, marked local prefill (or,
 * with the fail policy, llm-d's verbatim error after its retries); a client gone between the legs
 * gets the blocks released; a client's x-prefiller-host-port never reaches anyone.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { type TestContext, test } from "node:test";
import { request } from "undici";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../src/gateway/gateway.ts";
import { connectionsGone, type FakeServer, type Handler, waitFor } from "./helpers/gateway-fakes.ts";
import {
  DECODER_CACHED,
  decodeOk,
  fakeReplica,
  generations,
  LONG_PROMPT,
  PREFILL_PARAMS,
  PREFILLER_CACHED,
  prefillAnswer,
  prefillOk,
  roleSpec,
  SHORT_PROMPT,
  sampleValue,
} from "./helpers/pd-fakes.ts";
import { type Json, parseSse, scrapeMetrics, waitFor as waitUntil } from "./helpers/replica.ts";

const PD = readFileSync(new URL("../config/examples/pd.yaml", import.meta.url), "utf8");

/** pd.yaml with an aggregated fallback profile: with the prefill pool gone, requests still run. */
const PD_WITH_FALLBACK = PD.replace(
  "    deciders:\n      prefill: prefix-based-pd-decider",
  "    profiles:\n      fallback: aggregated\n    deciders:\n      prefill: prefix-based-pd-decider",
).concat(
  "- name: aggregated\n  plugins:\n  - pluginRef: decode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: queue-scorer\n",
);

interface Setup {
  p: FakeServer;
  d: FakeServer;
  gw: GatewayHandle;
  logs: string[];
}

async function setup(
  t: TestContext,
  prefill: Handler = prefillOk,
  opts: Partial<GatewayOptions> = {},
): Promise<Setup> {
  const p = await fakeReplica(prefill);
  const d = await fakeReplica(decodeOk);
  const logs: string[] = [];
  const gw = await startGateway({
    endpoints: [roleSpec(p, "prefill"), roleSpec(d, "decode")],
    config: PD,
    scrapeIntervalMs: 20,
    log: (l) => logs.push(l),
    ...opts,
  });
  t.after(async () => {
    await gw.close();
    await Promise.all([p.close(), d.close()]);
  });
  await waitFor(() => gw.gateway.data.store.all().every((r) => r.modelIds !== null), "first scrape");
  return { p, d, gw, logs };
}

async function post(url: string, body: object, headers: Record<string, string> = {}) {
  const r = await request(`${url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json", ...headers },
  });
  return { status: r.statusCode, headers: r.headers, text: await r.body.text() };
}

const metrics = (s: Setup) => scrapeMetrics(s.gw.adminUrl);

test("a long prompt: prefilled on P as llm-d's sidecar sends it, decoded on D with P's params, cached_tokens rewritten", async (t) => {
  const s = await setup(t);
  const client = {
    model: "m",
    prompt: LONG_PROMPT,
    max_tokens: 40,
    stream: true,
    stream_options: { include_usage: true },
    kv_transfer_params: { remote_host: "203.0.113.9", do_remote_prefill: true },
    x_custom: [1, 2],
  };
  const r = await post(s.gw.url, client, { "x-request-id": "client-id" });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "prefill-decode");
  const [pre] = generations(s.p);
  const [dec] = generations(s.d);
  assert.ok(pre && dec, "one request on each");
  const { kv_transfer_params: _c, ...rest } = client;
  const { stream_options: _o, ...noOptions } = rest;
  assert.deepEqual(pre.body, {
    ...noOptions,
    max_tokens: 1,
    max_completion_tokens: 1,
    min_tokens: 1,
    stream: false,
    kv_transfer_params: {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    },
  });
  assert.deepEqual(
    dec.body,
    { ...rest, kv_transfer_params: PREFILL_PARAMS },
    "original body, P's params verbatim",
  );
  const id = pre.headers["x-request-id"];
  assert.match(String(id), /^[0-9a-f-]{36}$/);
  assert.equal(dec.headers["x-request-id"], id, "one new request id on both legs");
  for (const h of [pre.headers, dec.headers]) assert.equal(h["x-prefiller-host-port"], undefined);
  const events = parseSse(r.text);
  assert.equal(events.at(-1), "[DONE]");
  const usage = events.find((e: Json) => e !== "[DONE]" && e.usage)?.usage;
  assert.equal(
    usage.prompt_tokens_details.cached_tokens,
    PREFILLER_CACHED,
    "the prefiller's count, not the decoder's",
  );

  const m = await metrics(s);
  assert.equal(
    sampleValue(m, "llm_d_epp_disagg_decision_total", {
      decision_type: "prefill-decode",
      plugin_type: "disagg-profile-handler",
    }),
    1,
  );
  assert.equal(sampleValue(m, "kvgate_pd_prefill_legs_total", { outcome: "kv-transfer" }), 1);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total"), 0);
});

test("non-streamed: the JSON answer's cached_tokens is rewritten and Content-Length dropped", async (t) => {
  const s = await setup(t);
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 200);
  const body = JSON.parse(r.text);
  assert.equal(body.usage.prompt_tokens_details.cached_tokens, PREFILLER_CACHED);
  assert.notEqual(PREFILLER_CACHED, DECODER_CACHED);
  assert.equal(r.headers["content-length"], undefined);
  const [dec] = generations(s.d);
  assert.equal("max_tokens" in dec!.body, false, "a limit the client left out stays out");
  assert.equal("stream" in dec!.body, false);
});

test("a short prompt skips P/D: decoded on D alone, counted decode-only, marked decode-only", async (t) => {
  const s = await setup(t);
  const r = await post(s.gw.url, { model: "m", prompt: SHORT_PROMPT, max_tokens: 4 });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "decode-only");
  assert.equal(generations(s.p).length, 0);
  assert.deepEqual(generations(s.d)[0]!.body, { model: "m", prompt: SHORT_PROMPT, max_tokens: 4 });
  const m = await metrics(s);
  assert.equal(sampleValue(m, "llm_d_epp_disagg_decision_total", { decision_type: "decode-only" }), 1);
  assert.equal(sampleValue(m, "llm_d_epp_disagg_decision_total", { decision_type: "prefill-decode" }), 0);
});

test("a prefill answered without kv_transfer_params is a counted local prefill: D gets no params, the header says why", async (t) => {
  const s = await setup(
    t,
    (_q, res) => void res.writeHead(200, { "content-type": "application/json" }).end(prefillAnswer(null)),
  );
  const r = await post(s.gw.url, {
    model: "m",
    prompt: LONG_PROMPT,
    kv_transfer_params: { remote_host: "203.0.113.9" },
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-no-kv-transfer-params");
  assert.equal("kv_transfer_params" in generations(s.d)[0]!.body, false, "nor the client's");
  assert.equal(
    JSON.parse(r.text).usage.prompt_tokens_details.cached_tokens,
    DECODER_CACHED,
    "D's own count: D prefilled",
  );
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "no-kv-transfer-params" }), 1);
  assert.ok(
    s.logs.some((l) => l.includes("P/D fallback (no-kv-transfer-params)")),
    "and logged",
  );
});

test("an unreachable prefiller: local prefill on D, counted, and the prefiller's failure reported to the data layer", async (t) => {
  const s = await setup(t);
  await s.p.close();
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-prefill-unreachable");
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "prefill-unreachable" }), 1);
  assert.equal(sampleValue(m, "kvgate_upstream_failures_total", { endpoint: s.p.id, kind: "connect" }), 1);
});

test("a prefiller that never answers: the prefill timeout ends the wait, D prefills", async (t) => {
  const s = await setup(t, () => {}, { prefillTimeoutMs: 150 });
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-prefill-timeout");
  assert.equal(generations(s.d).length, 1);
});

const unavailable: Handler = (_q, res) =>
  void res
    .writeHead(503, { "content-type": "application/json", "x-from": "prefiller" })
    .end('{"error":{"message":"busy"}}');

test("fail policy (llm-d's): a 503 is retried --prefill-max-retries times, then returned verbatim; D is never asked", async (t) => {
  const s = await setup(t, unavailable, {
    prefillFailurePolicy: "fail",
    prefillMaxRetries: 2,
    prefillRetryBackoffMs: 10,
  });
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 503);
  assert.equal(r.text, '{"error":{"message":"busy"}}');
  assert.equal(r.headers["x-from"], "prefiller");
  assert.equal(r.headers["x-kvgate-pd"], "failed-prefill-error");
  assert.equal(generations(s.p).length, 3);
  assert.equal(generations(s.d).length, 0);
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_prefill_retries_total"), 2);
  assert.equal(sampleValue(m, "kvgate_pd_prefill_failures_total", { reason: "prefill-error" }), 1);
});

test("fail policy: a 400 is not retried; recompute policy: the same 503 becomes a local prefill", async (t) => {
  const bad: Handler = (_q, res) =>
    void res.writeHead(400, { "content-type": "application/json" }).end('{"error":{"message":"bad"}}');
  const f = await setup(t, bad, { prefillFailurePolicy: "fail", prefillMaxRetries: 3 });
  assert.equal((await post(f.gw.url, { model: "m", prompt: LONG_PROMPT })).status, 400);
  assert.equal(generations(f.p).length, 1);
  const s = await setup(t, unavailable, { prefillMaxRetries: 1, prefillRetryBackoffMs: 10 });
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-prefill-error");
  assert.equal(generations(s.p).length, 2);
});

test("a client gone between the legs: the prefilled blocks are released through a one-token decode with P's params", async (t) => {
  let answer: ServerResponse | null = null;
  const s = await setup(t, (_q, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.flushHeaders(); // the answer's headers are out: it is read to the end whatever the client does
    answer = res;
  });
  const ac = new AbortController();
  const pending = request(`${s.gw.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: "m", prompt: LONG_PROMPT, max_tokens: 300, stream: true }),
    headers: { "content-type": "application/json" },
    signal: ac.signal,
  }).catch(() => null);
  await waitFor(() => answer !== null, "prefill in flight");
  ac.abort();
  await pending;
  await connectionsGone(s.gw); // the gateway has seen the client go
  (answer as unknown as ServerResponse).end(prefillAnswer());
  await waitFor(() => generations(s.d).length === 1, "the release decode");
  const [dec] = generations(s.d);
  assert.deepEqual(
    [dec!.body.max_tokens, dec!.body.stream, dec!.body.kv_transfer_params],
    [1, false, PREFILL_PARAMS],
  );
  await waitUntil(
    async () =>
      sampleValue(await metrics(s), "kvgate_pd_disconnect_releases_total", { result: "released" }) === 1,
  );
});

test("a client's x-prefiller-host-port is never used: stripped on every leg, and in sidecar mode only the EPP's pick is sent", async (t) => {
  const forged = { "x-prefiller-host-port": "203.0.113.7:8000" };
  const s = await setup(t);
  await post(s.gw.url, { model: "m", prompt: LONG_PROMPT }, forged);
  await post(s.gw.url, { model: "m", prompt: SHORT_PROMPT }, forged);
  for (const g of [...generations(s.p), ...generations(s.d)])
    assert.equal(g.headers["x-prefiller-host-port"], undefined);

  const side = await setup(t, prefillOk, { pdLegs: "sidecar" });
  await post(side.gw.url, { model: "m", prompt: SHORT_PROMPT }, forged);
  await post(side.gw.url, { model: "m", prompt: LONG_PROMPT }, forged);
  const [short, long] = generations(side.d);
  assert.equal(short!.headers["x-prefiller-host-port"], undefined, "P/D skipped: no header at all");
  assert.equal(long!.headers["x-prefiller-host-port"], side.p.id, "P/D: the scheduler's prefiller");
  assert.equal(generations(side.p).length, 0, "sidecar mode: the gateway sends no prefill leg");
});

test("the prefiller killed mid-run: every request is served (in-flight prefills fall back, later ones too), none lost", async (t) => {
  const s = await setup(
    t,
    (q, res, raw) => {
      setTimeout(() => prefillOk(q, res, raw), 20);
    },
    { config: PD_WITH_FALLBACK }, // once the prefill pool is empty, served aggregated, not 503
  );
  const one = async (i: number) => {
    const r = await post(s.gw.url, {
      model: "m",
      prompt: `${i} ${LONG_PROMPT}`,
      stream: true,
      stream_options: { include_usage: true },
    });
    return { status: r.status, pd: String(r.headers["x-kvgate-pd"]), done: parseSse(r.text).at(-1) };
  };
  const first = await Promise.all([0, 1, 2].map(one));
  const during = [3, 4, 5, 6, 7, 8].map(one);
  await waitFor(() => generations(s.p).length >= 5, "prefills in flight");
  await s.p.close(); // in-flight prefill connections are cut, later ones refused
  const rest = await Promise.all([...during, ...[9, 10, 11].map(one)]);
  const all = [...first, ...rest];
  assert.deepEqual(
    all.map((r) => [r.status, r.done]),
    all.map(() => [200, "[DONE]"]),
    "every request answered in full",
  );
  assert.deepEqual(
    first.map((r) => r.pd),
    ["prefill-decode", "prefill-decode", "prefill-decode"],
  );
  const after = rest.map((r) => r.pd);
  assert.ok(
    after.every(
      (v) => v === "prefill-decode" || v.startsWith("fallback-prefill-") || v === "aggregated-fallback",
    ),
    after.join(),
  );
  const fallbacks = after.filter((v) => v.startsWith("fallback-")).length;
  assert.ok(fallbacks >= 1, "the cut prefills fell back");
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total"), fallbacks, "each one counted");
});

test("a client gone during the prefill leg aborts it before the prefiller answers; the decoder is never asked", async (t) => {
  let closed = false;
  const s = await setup(t, (_q, res) => {
    res.on("close", () => (closed = true)); // vLLM aborts a request whose connection closes
  });
  const ac = new AbortController();
  const pending = request(`${s.gw.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: "m", prompt: LONG_PROMPT }),
    headers: { "content-type": "application/json" },
    signal: ac.signal,
  }).catch(() => null);
  await waitFor(() => generations(s.p).length === 1, "prefill in flight");
  ac.abort();
  await pending;
  await waitFor(() => closed, "the prefill request aborted");
  await waitUntil(
    async () =>
      sampleValue(await metrics(s), "kvgate_pd_prefill_legs_total", { outcome: "client-gone" }) === 1,
  );
  assert.equal(generations(s.d).length, 0);
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_disconnect_releases_total"), 0, "nothing to release");
});

test("a decoder whose KV load fails (500 before any byte) is asked again without the params: served by a local prefill", async (t) => {
  const s = await setup(t);
  s.d.routes.set("POST /v1/completions", (q, res, raw) => {
    if ("kv_transfer_params" in JSON.parse(raw.toString()))
      return void res
        .writeHead(500, { "content-type": "application/json" })
        .end('{"error":{"message":"NIXL_ERR_BACKEND"}}');
    decodeOk(q, res, raw);
  });
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "fallback-decode-kv-load-failed");
  assert.deepEqual(
    generations(s.d).map((g) => "kv_transfer_params" in g.body),
    [true, false],
  );
  const m = await metrics(s);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "decode-kv-load-failed" }), 1);
  assert.equal(sampleValue(m, "kvgate_pd_prefill_legs_total", { outcome: "fallback" }), 1);
  assert.equal(sampleValue(m, "kvgate_pd_prefill_legs_total", { outcome: "kv-transfer" }), 0);
});

/** A P/D gateway whose pool has a decoder and no prefill endpoint at all. */
async function decoderOnly(t: TestContext, opts: Partial<GatewayOptions> = {}) {
  const d = await fakeReplica(decodeOk);
  const gw = await startGateway({
    endpoints: [roleSpec(d, "decode")],
    config: PD,
    scrapeIntervalMs: 20,
    log: () => {},
    ...opts,
  });
  t.after(async () => {
    await gw.close();
    await d.close();
  });
  await waitFor(() => gw.gateway.data.store.all().every((r) => r.modelIds !== null), "first scrape");
  return { d, gw };
}

test("no prefill endpoint for a prompt the decider wants split: a counted, marked local prefill, or llm-d's 503 under the fail policy", async (t) => {
  const s = await decoderOnly(t);
  const r = await post(s.gw.url, { model: "m", prompt: LONG_PROMPT, max_tokens: 4 });
  assert.equal(r.status, 200, "recompute (default): served by the decoder");
  assert.equal(r.headers["x-kvgate-pd"], "fallback-no-prefill-endpoint");
  assert.equal("kv_transfer_params" in generations(s.d)[0]!.body, false);
  const m = await scrapeMetrics(s.gw.adminUrl);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "no-prefill-endpoint" }), 1);
  assert.equal(sampleValue(m, "llm_d_epp_disagg_decision_total", { decision_type: "decode-only" }), 1);

  const f = await decoderOnly(t, { prefillFailurePolicy: "fail" });
  const r2 = await post(f.gw.url, { model: "m", prompt: LONG_PROMPT, max_tokens: 4 });
  assert.equal(r2.status, 503);
  assert.equal(r2.headers["x-llm-d-request-dropped-reason"], "rejected-no-endpoints");
  assert.match(JSON.parse(r2.text).error.message, /no Ready prefill endpoint.*profiles\.fallback/);
  assert.equal(generations(f.d).length, 0, "the decoder is never asked");
});

test("a client's kv_transfer_params never reaches a replica, on a decode-only request either", async (t) => {
  const s = await setup(t);
  const forged = { do_remote_prefill: true, remote_host: "203.0.113.9", remote_port: 5600 };
  const r = await post(s.gw.url, {
    model: "m",
    prompt: SHORT_PROMPT,
    max_tokens: 4,
    kv_transfer_params: forged,
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers["x-kvgate-pd"], "decode-only");
  assert.deepEqual(generations(s.d)[0]!.body, { model: "m", prompt: SHORT_PROMPT, max_tokens: 4 });
});
