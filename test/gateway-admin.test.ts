/**
 * The admin API (its own port only): /endpoints, /explain errors, /reload of the endpoints file and
 * the config file (a bad config is rejected and the old one stays), and /metrics under llm-d names.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { startGateway } from "../src/gateway/gateway.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";

function replica(waiting: number): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => void res.writeHead(200).end(vllmMetrics({ waiting, running: 1, kv: 0.25 })),
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
    "POST /v1/completions": (_q, res) =>
      void res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}'),
  });
}

const QUEUE_ONLY =
  "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n";
const KV_ONLY =
  "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: kv-cache-utilization-scorer\n";

async function json(url: string, init?: RequestInit) {
  const r = await fetch(url, init);
  return {
    status: r.status,
    body: (await r.json()) as Record<string, unknown> & { error?: { message: string } },
  };
}

test("admin: /endpoints, /reload of endpoints and config files, /explain errors", {
  timeout: 30_000,
}, async () => {
  const a = await replica(2);
  const b = await replica(0);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-admin-"));
  const epFile = join(dir, "endpoints.yaml");
  const cfgFile = join(dir, "epp.yaml");
  writeFileSync(epFile, `- address: ${a.id}\n  labels: {zone: west}\n`);
  writeFileSync(cfgFile, QUEUE_ONLY);
  const gw = await startGateway({
    endpointsFile: epFile,
    configFile: cfgFile,
    scrapeIntervalMs: 20,
    log: () => {},
  });
  try {
    await waitFor(() => gw.gateway.data.store.get(a.id)?.state.metrics !== null, "scraped");
    const eps = await json(`${gw.adminUrl}/endpoints`);
    assert.equal(eps.status, 200);
    const [e] = eps.body.endpoints as Array<Record<string, unknown>>;
    assert.equal(e.address, a.id);
    assert.deepEqual(e.labels, { zone: "west" });
    assert.equal(e.health, "healthy");
    assert.equal((e.metrics as { waitingQueueSize: number }).waitingQueueSize, 2);
    assert.equal(typeof e.stalenessMs, "number");
    assert.equal(e.consecutiveScrapeFailures, 0);
    assert.deepEqual(e.models, ["m"]);

    // A bad config is rejected with its error; the old one keeps running.
    writeFileSync(
      cfgFile,
      "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: no-such-scorer\n",
    );
    const bad = await json(`${gw.adminUrl}/reload`, { method: "POST" });
    assert.equal(bad.status, 400);
    assert.match(
      (bad.body.config as { error: string }).error,
      /^--config .*: .*no-such-scorer.*; the running config is kept: fix the file and POST \/reload again$/s,
    );
    assert.match(await (await fetch(`${gw.adminUrl}/config`)).text(), /queue-scorer/);

    // A good config and a new endpoint take effect on /reload.
    writeFileSync(cfgFile, KV_ONLY);
    writeFileSync(epFile, `- address: ${a.id}\n  labels: {zone: west}\n- ${b.id}\n`);
    const ok = await json(`${gw.adminUrl}/reload`, { method: "POST" });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    const cfg = await (await fetch(`${gw.adminUrl}/config`)).text();
    assert.match(cfg, /kv-cache-utilization-scorer/);
    assert.doesNotMatch(cfg, /queue-scorer/);
    const eps2 = await json(`${gw.adminUrl}/endpoints`);
    assert.deepEqual(
      (eps2.body.endpoints as Array<{ address: string }>).map((x) => x.address).sort(),
      [a.id, b.id].sort(),
    );

    // /explain input errors are OpenAI errors; unknown admin routes are 404; the API is not proxied.
    const badJson = await json(`${gw.adminUrl}/explain`, { method: "POST", body: "{" });
    assert.equal(badJson.status, 400);
    await waitFor(() => gw.gateway.data.store.get(b.id)?.modelIds !== null, "b's models");
    const unknown = await json(`${gw.adminUrl}/explain`, {
      method: "POST",
      body: '{"model":"zz","prompt":"x"}',
    });
    assert.equal(unknown.status, 404);
    const badPath = await json(`${gw.adminUrl}/explain?path=/v1/x`, {
      method: "POST",
      body: '{"model":"m","prompt":"x"}',
    });
    assert.equal(badPath.status, 400);
    const proxied = await fetch(`${gw.adminUrl}/v1/completions`, {
      method: "POST",
      body: '{"model":"m","prompt":"x"}',
    });
    assert.equal(proxied.status, 404);
    assert.match(
      ((await proxied.json()) as { error: { message: string } }).error.message,
      /^No admin route for POST \/v1\/completions; use GET \/, .*\/endpoints.*, or POST \/reload or \/explain$/,
    );
    assert.equal(
      a.requests.filter((q) => q.method === "POST").length +
        b.requests.filter((q) => q.method === "POST").length,
      0,
    );
  } finally {
    await gw.close();
    await a.close();
    await b.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("admin: /metrics exposes llm-d's metric names, parseable, with request and pool data", {
  timeout: 30_000,
}, async () => {
  const a = await replica(3);
  const gw = await startGateway({ endpoints: a.id, scrapeIntervalMs: 20, log: () => {} });
  try {
    await waitFor(() => gw.gateway.data.store.get(a.id)?.modelIds !== null, "scraped");
    for (let i = 0; i < 3; i++) {
      const r = await fetch(`${gw.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt: "shared prefix ".repeat(50) }),
      });
      assert.equal(r.status, 200);
      await r.text();
    }
    await fetch(`${gw.url}/v1/completions`, { method: "POST", body: "{" }).then((r) => r.text());
    const res = await fetch(`${gw.adminUrl}/metrics`);
    assert.match(String(res.headers.get("content-type")), /^text\/plain/);
    const text = await res.text();
    const blank = text.split("\n").flatMap((l, i) => (l.trim() === "" ? [i + 1] : []));
    assert.deepEqual(blank, [text.split("\n").length], "no blank lines: only the final newline's empty tail");
    const fams = parsePromText(text).families; // strict: malformed text fails
    const value = (name: string) => fams.get(name)?.samples[0]?.value;
    assert.equal(value("llm_d_epp_request_total"), 3);
    assert.equal(fams.get("llm_d_epp_request_duration_seconds")?.type, "histogram");
    assert.equal(fams.get("llm_d_epp_scheduler_e2e_duration_seconds")?.type, "histogram");
    assert.equal(value("llm_d_epp_ready_endpoints"), 1);
    assert.equal(value("llm_d_epp_average_queue_size"), 3);
    assert.equal(value("llm_d_epp_per_endpoint_queue_size"), 3);
    const picks = fams.get("llm_d_epp_scheduler_attempts_total")?.samples ?? [];
    assert.deepEqual(
      picks.map((s) => [s.labels.status, `${s.labels.endpoint_name}:${s.labels.port}`, s.value]),
      [["success", a.id, 3]],
    );
    assert.ok(
      (value("llm_d_epp_prefix_indexer_size") ?? 0) > 0,
      "the default config's prefix index has entries",
    );
    const hit = fams
      .get("llm_d_epp_prefix_indexer_hit_ratio")
      ?.samples.find((s) => s.name.endsWith("_count"));
    assert.equal(hit?.value, 3);
    const http = fams.get("kvgate_http_requests_total")?.samples ?? [];
    assert.ok(
      http.some((s) => s.labels.outcome === "bad-request" && s.labels.status === "400" && s.value === 1),
    );
    assert.ok(fams.has("llm_d_epp_datalayer_poll_errors_total"));
  } finally {
    await gw.close();
    await a.close();
  }
});

test("admin: /endpoints shows the default config's learned prefill rate beside the hand-set one", {
  timeout: 30_000,
}, async () => {
  const a = await replica(0);
  const gw = await startGateway({ endpoints: a.id, scrapeIntervalMs: 20, log: () => {} });
  try {
    await waitFor(() => gw.gateway.data.store.get(a.id)?.modelIds !== null, "scraped");
    for (let i = 0; i < 3; i++) {
      const r = await fetch(`${gw.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt: `${i} ${"distinct prompt words ".repeat(40)}` }),
      });
      await r.text();
    }
    const eps = await json(`${gw.adminUrl}/endpoints`);
    const [e] = eps.body.endpoints as Array<{ routing: Record<string, Record<string, unknown>> }>;
    const gate = e.routing["prefix-cache-affinity-filter"];
    assert.equal(gate.peakPrefillThroughput, 15928);
    assert.equal(gate.learnPrefillThroughput, true);
    const load = e.routing["inflight-load-producer"];
    // Three first tokens seen, three samples; too few tokens yet to trust a rate.
    assert.equal(load.prefillSamples, 3);
    assert.equal(load.learnedPrefillThroughput, null);
    assert.equal(load.inFlightRequests, 0);
  } finally {
    await gw.close();
    await a.close();
  }
});

test("admin: /explain shows the P/D decision and both picks", { timeout: 30_000 }, async () => {
  const p = await replica(0);
  const d = await replica(0);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-admin-pd-"));
  const epFile = join(dir, "endpoints.yaml");
  writeFileSync(
    epFile,
    `- address: ${p.id}\n  labels: {llm-d.ai/role: prefill}\n- address: ${d.id}\n  labels: {llm-d.ai/role: decode}\n`,
  );
  const gw = await startGateway({
    endpointsFile: epFile,
    configFile: "config/examples/pd.yaml",
    scrapeIntervalMs: 20,
    log: () => {},
  });
  try {
    await waitFor(() => gw.gateway.data.store.get(d.id)?.state.metrics !== null, "scraped");
    const body = JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: "summarise this: ".repeat(200) }],
    });
    const r = await json(`${gw.adminUrl}/explain`, { method: "POST", body });
    assert.equal(r.status, 200);
    assert.equal(r.body.picked, d.id);
    assert.deepEqual(r.body.profilesRun, ["decode", "prefill"]);
    assert.deepEqual(r.body.decision, {
      decision: "prefill-decode",
      reason: 'decider "prefix-based-pd-decider" approved',
      prefillTarget: p.id,
    });
    const profiles = r.body.profiles as Record<string, { candidates: { id: string }[] }>;
    assert.deepEqual(
      profiles.prefill.candidates.map((c) => c.id),
      [p.id, d.id],
      "the prefill profile's explanation lists its candidates (d removed by prefill-filter)",
    );
  } finally {
    await gw.close();
    await p.close();
    await d.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
