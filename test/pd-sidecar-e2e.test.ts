/**
 * Issue 12's Done-when through `kvgate pd-sidecar` in front of a simulated decode replica (vLLM
 * NixlConnector consumer), requests arriving as Envoy sends them after the EPP's pick (with or
 * without x-prefiller-host-port): a long prompt prefilled on the producer and decoded locally with
 * the pulled KV (the command-line sidecar, both replicas' metrics); no header, no P/D; the prefiller
 * killed mid-run loses no request; no kv_transfer_params is a counted local prefill; a prefiller
 * outside the allowlist gets 403 and is never called; lease expiry frees the prefiller's blocks when
 * the decoder is gone; a client gone between the legs gets them freed by kvgate's one-token decode.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { type TestContext, test } from "node:test";
import { request } from "undici";
import { EndpointSource } from "../src/datalayer/endpoints.ts";
import { type PdSidecarHandle, type PdSidecarOptions, startPdSidecar } from "../src/gateway/pd/sidecar.ts";
import { headerFirstRelay, modelOf, pdMetrics, type Relay } from "./helpers/pd-e2e.ts";
import { LONG_PROMPT, SHORT_PROMPT, sampleValue } from "./helpers/pd-fakes.ts";
import { startPdReplica } from "./helpers/pd-replicas.ts";
import {
  KVGATE_BIN,
  parseSse,
  scrapeMetrics,
  startTestReplica,
  type TestReplica,
  waitFor,
} from "./helpers/replica.ts";

/**
 * The producers' lease in these tests: 3000 s, 30 s of wall time at the replicas' 100x, so that on a
 * loaded machine the blocks outlive the gap between the legs (the default 30 s is 300 ms of wall
 * time). The lease test sets its own.
 */
const LONG_LEASE = { kv_lease_duration: 3000 };

interface Pod {
  p: TestReplica;
  d: TestReplica;
  relay: Relay | null;
  /** The prefiller's id as the EPP names it (the relay's when there is one). */
  prefiller: string;
  sc: PdSidecarHandle;
  url: string;
  model: string;
}

async function pod(
  t: TestContext,
  o: {
    prefiller?: () => Promise<TestReplica>;
    prefillerExtra?: Record<string, unknown>;
    relay?: boolean;
    sidecar?: Partial<PdSidecarOptions>;
  } = {},
): Promise<Pod> {
  const p = await (
    o.prefiller ?? (() => startPdReplica("kv_producer", { ...LONG_LEASE, ...o.prefillerExtra }))
  )();
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const relay = o.relay ? await headerFirstRelay(p, { hold: true }) : null;
  if (relay) t.after(() => relay.close());
  const prefiller = relay?.id ?? `127.0.0.1:${p.port}`;
  const sc = await startPdSidecar({
    host: "127.0.0.1",
    port: 0,
    vllmPort: d.port,
    allowlist: EndpointSource.fromList(prefiller),
    metricsPort: 0,
    log: () => {},
    ...o.sidecar,
  });
  t.after(() => sc.close());
  return { p, d, relay, prefiller, sc, url: sc.url, model: modelOf(p) };
}

async function complete(
  url: string,
  model: string,
  prompt: string,
  prefiller: string | null,
  extra: object = {},
) {
  const r = await request(`${url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model, prompt, max_tokens: 8, ...extra }),
    headers: {
      "content-type": "application/json",
      ...(prefiller ? { "x-prefiller-host-port": prefiller } : {}),
    },
  });
  return { status: r.statusCode, pd: r.headers["x-kvgate-pd"], text: await r.body.text() };
}

/** Resolves once the sidecar holds no client connection (their close events ran). */
async function connectionsGone(sc: PdSidecarHandle): Promise<void> {
  const count = () => new Promise<number>((r) => sc.server.getConnections((_e, n) => r(n)));
  for (let i = 0; i < 1000 && (await count()) > 0; i++) await new Promise((r) => setTimeout(r, 5));
  await new Promise((r) => setImmediate(r));
}

/** `kvgate pd-sidecar` as a child process; resolves with its URL once it printed its startup line. */
async function spawnSidecar(t: TestContext, args: string[]): Promise<{ url: string; banner: string }> {
  const child = spawn(
    process.execPath,
    [KVGATE_BIN, "pd-sidecar", "--host", "127.0.0.1", "--port", "0", ...args],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGTERM");
  });
  let out = "";
  let err = "";
  child.stderr!.setEncoding("utf8").on("data", (s: string) => (err += s));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`pd-sidecar did not start; stderr: ${err}`)), 20_000);
    child.stdout!.setEncoding("utf8").on("data", (s: string) => {
      out += s;
      const m = /listening on (http:\/\/\S+),/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ url: m[1]!, banner: out.trim() });
      }
    });
    child.once("exit", (code) => reject(new Error(`pd-sidecar exited ${code}: ${err}`)));
  });
}

test("kvgate pd-sidecar (the command): the EPP's prefiller prefills, the local decoder pulls the KV and decodes; no header, no P/D", async (t) => {
  const p = await startPdReplica("kv_producer", LONG_LEASE);
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const prefiller = `127.0.0.1:${p.port}`;
  const sc = await spawnSidecar(t, [
    "--vllm-port",
    String(d.port),
    "--endpoints",
    prefiller,
    "--kv-connector",
    "nixlv2",
    "--prefill-max-retries",
    "0",
  ]);
  assert.match(sc.banner, /SSRF protection on \(1 endpoint\(s\)\), prefill failure policy recompute/);
  const model = modelOf(p);

  const r = await complete(sc.url, model, LONG_PROMPT, prefiller, {
    stream: true,
    stream_options: { include_usage: true },
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.pd, "prefill-decode");
  const events = parseSse(r.text);
  assert.equal(events.at(-1), "[DONE]");
  const usage = events.findLast((e) => e !== "[DONE]" && e.usage)?.usage;
  assert.equal(usage.prompt_tokens_details.cached_tokens, 0, "the prefiller's count");
  const dm = await pdMetrics(d);
  const pm = await pdMetrics(p);
  assert.equal(pm.localCompute, usage.prompt_tokens);
  assert.equal(dm.externalKv, usage.prompt_tokens - 1);
  assert.equal(dm.xferCount, 1);
  assert.ok(dm.bytes > 0);
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);

  const plain = await complete(sc.url, model, SHORT_PROMPT, null);
  assert.equal(plain.status, 200, plain.text);
  assert.equal(plain.pd, undefined);
  assert.equal((await pdMetrics(p)).promptTokens, pm.promptTokens, "no header: the prefiller is not called");
  const through = await scrapeMetrics(sc.url); // any other path goes to vLLM: its own /metrics
  assert.equal(
    sampleValue(through, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
    dm.externalKv,
  );
});

test("the prefiller killed mid-run: every request through the sidecar is served", async (t) => {
  const f = await pod(t);
  const one = (i: number) =>
    complete(f.url, f.model, `${i} ${LONG_PROMPT}`, f.prefiller, { stream: true, max_tokens: 16 }).then(
      (r) => ({
        ...r,
        done: parseSse(r.text).at(-1),
      }),
    );
  const first = await Promise.all([0, 1].map(one));
  const during = [2, 3, 4, 5, 6].map(one);
  const finished = () => Object.values(f.p.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
  await waitFor(() => finished() >= 3);
  f.p.server.crash();
  const rest = await Promise.all([...during, ...[7, 8].map(one)]);
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
  const after = rest.map((r) => String(r.pd));
  assert.ok(
    after.slice(-2).every((v) => v === "fallback-prefill-unreachable"),
    after.join(),
  );
  const m = await scrapeMetrics(f.sc.metricsUrl!);
  assert.equal(
    sampleValue(m, "kvgate_pd_fallbacks_total"),
    after.filter((v) => v.startsWith("fallback-")).length,
  );
});

test("a prefiller that returns no kv_transfer_params: counted on the sidecar's /metrics, prefilled by the local vLLM", async (t) => {
  const f = await pod(t, { prefiller: () => startTestReplica() });
  const r = await complete(f.url, f.model, LONG_PROMPT, f.prefiller);
  assert.equal(r.status, 200, r.text);
  assert.equal(r.pd, "fallback-no-kv-transfer-params");
  const dm = await pdMetrics(f.d);
  assert.equal(dm.externalKv, 0);
  assert.equal(dm.localCompute, JSON.parse(r.text).usage.prompt_tokens);
  const m = await scrapeMetrics(f.sc.metricsUrl!);
  assert.equal(sampleValue(m, "kvgate_pd_fallbacks_total", { reason: "no-kv-transfer-params" }), 1);
});

test("SSRF protection: a client-sent prefiller outside the pool (the pool's host on another port, another name of the pool's pod) gets 403 and is never called", async (t) => {
  const f = await pod(t);
  const x = await startTestReplica();
  t.after(() => x.close());
  for (const target of [`127.0.0.1:${x.port}`, `localhost:${f.p.port}`]) {
    const r = await complete(f.url, f.model, LONG_PROMPT, target);
    assert.equal(r.status, 403, `${target}: ${r.text}`);
    assert.match(JSON.parse(r.text).error.message, /not allowed by SSRF protection/);
  }
  assert.equal((await pdMetrics(x)).promptTokens, 0);
  assert.equal((await pdMetrics(f.p)).promptTokens, 0);
  assert.equal((await pdMetrics(f.d)).promptTokens, 0, "nor the decoder");
});

test("lease expiry frees the prefiller's blocks when the decoder is gone after the prefill", async (t) => {
  const f = await pod(t, { prefillerExtra: { kv_lease_duration: 30 } }); // vLLM's default lease
  await f.d.close();
  const r = await complete(f.url, f.model, LONG_PROMPT, f.prefiller);
  assert.equal(r.status, 502, r.text);
  assert.match(JSON.parse(r.text).error.message, /local vLLM .* did not answer/);
  await waitFor(() => f.p.server.engine.heldRequestIds().length === 0);
  assert.equal((await pdMetrics(f.p)).expired, 1);
});

test("a client gone between the legs: the sidecar's one-token decode reads the blocks and the prefiller frees them", async (t) => {
  const f = await pod(t, { relay: true, prefillerExtra: { kv_lease_duration: 3000 } });
  const ac = new AbortController();
  const pending = request(`${f.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: f.model, prompt: LONG_PROMPT, max_tokens: 200, stream: true }),
    headers: { "content-type": "application/json", "x-prefiller-host-port": f.prefiller },
    signal: ac.signal,
  }).catch(() => null);
  await waitFor(() => f.relay!.posts === 1);
  ac.abort();
  await pending;
  await connectionsGone(f.sc); // the sidecar has seen the client go
  f.relay!.open();
  await waitFor(
    async () =>
      sampleValue(await scrapeMetrics(f.sc.metricsUrl!), "kvgate_pd_disconnect_releases_total", {
        result: "released",
      }) === 1,
  );
  await waitFor(() => f.p.server.engine.heldRequestIds().length === 0);
  assert.equal((await pdMetrics(f.p)).expired, 0);
  assert.equal((await pdMetrics(f.d)).xferCount, 1);
});
