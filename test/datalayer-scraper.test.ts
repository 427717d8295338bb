/** Metric extraction, the Datastore's health rules, and the Scraper against fake /metrics servers. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { DataLayer } from "../src/datalayer/datalayer.ts";
import { Datastore, type Health } from "../src/datalayer/datastore.ts";
import { EndpointSource, parseEndpointList } from "../src/datalayer/endpoints.ts";
import { ExtractError, extractMetrics } from "../src/datalayer/extract.ts";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { Scraper } from "../src/datalayer/scraper.ts";
import { type FakeServer, modelList, startFake, vllmMetrics, waitFor } from "./helpers/gateway-fakes.ts";

const fams = (t: string) => parsePromText(t, { lenient: true }).families;

test("extract: data-parallel engines are summed, KV usage averaged, cache geometry from cache_config_info", () => {
  const m = extractMetrics(
    fams(
      [
        'vllm:num_requests_running{engine="0",model_name="q"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="q"} 2.0',
        'vllm:num_requests_waiting{engine="0",model_name="q"} 1.0',
        'vllm:num_requests_waiting{engine="1",model_name="q"} 4.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="q"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="q"} 0.6',
        'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1.0',
        'vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="150"} 1.0',
      ].join("\n"),
    ),
  );
  assert.equal(m.engine, "vllm");
  assert.equal(m.runningRequestsSize, 5);
  assert.equal(m.waitingQueueSize, 5);
  assert.ok(Math.abs(m.kvCacheUsagePercent - 0.4) < 1e-12);
  assert.equal(m.cacheBlockSize, 32);
  assert.equal(m.cacheNumBlocks, 250);
  assert.deepEqual(m.modelNames, ["q"]);
});

test("extract: legacy gpu_cache_usage_perc fallback and SGLang names", () => {
  const legacy = extractMetrics(
    fams("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.7\n"),
  );
  assert.equal(legacy.kvCacheUsagePercent, 0.7);
  assert.equal(legacy.cacheBlockSize, undefined);
  const sg = extractMetrics(
    fams(
      'sglang:num_queue_reqs{tp_rank="0"} 6\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n' +
        'sglang:cache_config_info{page_size="64",num_pages="900"} 1\n',
    ),
  );
  assert.deepEqual(
    [sg.engine, sg.waitingQueueSize, sg.runningRequestsSize, sg.kvCacheUsagePercent, sg.cacheBlockSize],
    ["sglang", 6, 2, 0.5, 64],
  );
});

test("extract: a kvgate simulated replica's time scale is read; real servers have none", () => {
  const base = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n";
  assert.equal(extractMetrics(fams(`${base}kvgate:sim_time_scale{model_name="q"} 2.5\n`)).simTimeScale, 2.5);
  assert.equal(extractMetrics(fams(base)).simTimeScale, undefined);
  assert.equal(extractMetrics(fams(`${base}kvgate:sim_time_scale 0\n`)).simTimeScale, undefined);
});

test("extract: vLLM's prefix-cache and generation counters are summed over engines, legacy names accepted", () => {
  const base = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n";
  const m = extractMetrics(
    fams(
      `${base}# TYPE vllm:prefix_cache_queries counter\n` +
        'vllm:prefix_cache_queries_total{engine="0"} 100\nvllm:prefix_cache_queries_total{engine="1"} 50\n' +
        "# TYPE vllm:prefix_cache_hits counter\n" +
        'vllm:prefix_cache_hits_total{engine="0"} 60\nvllm:prefix_cache_hits_total{engine="1"} 15\n' +
        "vllm:generation_tokens_total 42\n",
    ),
  );
  assert.deepEqual(m.counters, { prefixCacheQueries: 150, prefixCacheHits: 75, generationTokens: 42 });
  const legacy = extractMetrics(
    fams(
      `${base}vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 4\nvllm:generation_tokens_total 7\n`,
    ),
  );
  assert.deepEqual(legacy.counters, { prefixCacheQueries: 10, prefixCacheHits: 4, generationTokens: 7 });
  // One counter missing: no counters at all rather than a rate computed from a partial set.
  assert.equal(extractMetrics(fams(`${base}vllm:prefix_cache_queries_total 10\n`)).counters, undefined);
});

test("extract: missing or invalid signals are errors naming the metric", () => {
  assert.throws(() => extractMetrics(fams("foo 1\n")), /no model-server metrics/);
  assert.throws(
    () => extractMetrics(fams("vllm:num_requests_waiting 1\nvllm:num_requests_running 1\n")),
    (e: Error) =>
      e instanceof ExtractError && /vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc/.test(e.message),
  );
  assert.throws(
    () =>
      extractMetrics(
        fams("vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n"),
      ),
    /non-finite/,
  );
});

const spec = (id: string) => parseEndpointList(id)[0];
const metrics = {
  engine: "vllm" as const,
  waitingQueueSize: 1,
  runningRequestsSize: 2,
  kvCacheUsagePercent: 0.3,
  modelNames: [],
};

test("datastore: scrape failures past the threshold exclude an endpoint; a success readmits it", () => {
  const events: Array<[string, Health]> = [];
  const ds = new Datastore({ failureThreshold: 3, onHealthChange: (id, h) => events.push([id, h]) });
  ds.upsert(spec("a:1"));
  ds.upsert(spec("b:1"));
  ds.recordScrapeSuccess("a:1", metrics, 0, 1);
  assert.equal(ds.get("a:1")?.state.metrics?.updateTime, 1);
  for (let i = 0; i < 2; i++) ds.recordScrapeFailure("a:1", "boom");
  assert.equal(ds.get("a:1")?.health, "healthy");
  ds.recordScrapeFailure("a:1", "boom");
  assert.equal(ds.get("a:1")?.health, "unhealthy");
  const c = ds.candidates("m", 2);
  assert.ok(c.ok);
  assert.deepEqual(
    c.candidates.map((e) => e.id),
    ["b:1"],
  );
  ds.recordScrapeSuccess("a:1", metrics, 3, 3);
  assert.equal(ds.get("a:1")?.health, "healthy");
  assert.deepEqual(events, [
    ["a:1", "unhealthy"],
    ["a:1", "healthy"],
  ]);
});

test("datastore: a connect failure excludes at once; only a scrape started afterwards readmits", () => {
  const ds = new Datastore();
  ds.upsert(spec("a:1"));
  ds.reportRequestFailure("a:1", "connect", "ECONNREFUSED", 10);
  assert.equal(ds.get("a:1")?.health, "unhealthy");
  ds.recordScrapeSuccess("a:1", metrics, 9.5, 10.1); // started before the failure
  assert.equal(ds.get("a:1")?.health, "unhealthy");
  ds.recordScrapeSuccess("a:1", metrics, 10.2, 10.3);
  assert.equal(ds.get("a:1")?.health, "healthy");
});

test("datastore: request failures put an endpoint on doubling probation; all on probation → still usable", () => {
  const ds = new Datastore({ probationBaseMs: 1000, probationMaxMs: 3000 });
  ds.upsert(spec("a:1"));
  ds.upsert(spec("b:1"));
  ds.reportRequestFailure("a:1", "status", "HTTP 500", 100);
  let c = ds.candidates(null, 100.5);
  assert.ok(c.ok && c.candidates.length === 1 && c.candidates[0].id === "b:1");
  c = ds.candidates(null, 101.01);
  assert.ok(c.ok && c.candidates.length === 2);
  ds.reportRequestFailure("a:1", "status", "HTTP 500", 101);
  ds.reportRequestFailure("a:1", "status", "HTTP 500", 101);
  ds.reportRequestFailure("a:1", "status", "HTTP 500", 101); // 1, 2, 3 (capped) s
  assert.equal(ds.snapshot(101).find((s) => s.address === "a:1")?.probationRemainingMs, 3000);
  ds.reportRequestFailure("b:1", "timeout", "t", 101);
  c = ds.candidates(null, 101.5);
  assert.ok(c.ok && c.candidates.length === 2, "probationers are used when nothing else is left");
  ds.reportRequestSuccess("a:1");
  c = ds.candidates(null, 101.5);
  assert.ok(c.ok && c.candidates.length === 1 && c.candidates[0].id === "a:1");
});

test("datastore: model lists decide 404 vs candidates; unknown lists count as serving", () => {
  const ds = new Datastore();
  assert.deepEqual(ds.candidates("m", 0), {
    ok: false,
    kind: "no-endpoints",
    message:
      "no endpoints are known: list the replicas with --endpoints or --endpoints-file, or, with Kubernetes discovery, wait until the InferencePool has Ready pods",
  });
  ds.upsert(spec("a:1"));
  ds.upsert(spec("b:1"));
  ds.recordModels("a:1", [{ id: "m" }]);
  let c = ds.candidates("x", 0);
  assert.ok(c.ok && c.candidates.length === 1 && c.candidates[0].id === "b:1", "b's list is unknown");
  ds.recordModels("b:1", [{ id: "n" }]);
  c = ds.candidates("x", 0);
  assert.ok(!c.ok && c.kind === "model-not-found");
  assert.equal(c.message, 'The model `x` does not exist. Served models: m, n; set "model" to one of them.');
  c = ds.candidates("n", 0);
  assert.ok(c.ok && c.candidates.map((e) => e.id).join() === "b:1");
  ds.reportRequestFailure("b:1", "connect", "refused", 0);
  c = ds.candidates("n", 1);
  assert.ok(!c.ok && c.kind === "no-endpoints");
});

test("datastore: the 404 names at most 10 served models, or GET /v1/models when none is listed", () => {
  const ds = new Datastore();
  ds.upsert(spec("a:1"));
  ds.recordModels("a:1", []);
  let c = ds.candidates("x", 0);
  assert.ok(!c.ok);
  assert.match(c.message, /^The model `x` does not exist\. .*GET \/v1\/models lists the served models/);
  ds.recordModels(
    "a:1",
    Array.from({ length: 12 }, (_, i) => ({ id: `m${String(i).padStart(2, "0")}` })),
  );
  c = ds.candidates("x", 0);
  assert.ok(!c.ok);
  assert.equal(
    c.message,
    'The model `x` does not exist. Served models: m00, m01, m02, m03, m04, m05, m06, m07, m08, m09, …; set "model" to one of them.',
  );
});

function metricsServer(mode: { m: "ok" | "stall" | "garbled" | "500" }, waiting = 1): Promise<FakeServer> {
  return startFake({
    "GET /metrics": (_q, res) => {
      if (mode.m === "stall") return; // never answers
      if (mode.m === "500") return void res.writeHead(500).end("oops");
      if (mode.m === "garbled")
        return void res.writeHead(200).end("vllm:num_requests_running{x=\n\u0000 zzz\n");
      res
        .writeHead(200, { "content-type": "text/plain; version=0.0.4" })
        .end(vllmMetrics({ waiting, running: 2 }));
    },
    "GET /v1/models": (_q, res) => void res.writeHead(200).end(modelList("m")),
  });
}

test("scraper: a stalled /metrics does not hold up the other endpoints' polls", {
  timeout: 30_000,
}, async () => {
  const good = await metricsServer({ m: "ok" }, 7);
  const stalled = await metricsServer({ m: "stall" });
  const ds = new Datastore();
  const sc = new Scraper(ds, { intervalMs: 5, timeoutMs: 60_000 }); // the stalled poll stays pending
  try {
    for (const f of [good, stalled]) {
      ds.upsert(spec(f.id));
      sc.add(spec(f.id));
    }
    sc.start();
    await waitFor(() => stalled.hits("/metrics") === 1, "the stalled poll arrived");
    const base = good.hits("/metrics");
    await waitFor(() => good.hits("/metrics") >= base + 5, "good endpoint polled while the other stalls");
    assert.equal(stalled.hits("/metrics"), 1, "no overlapping polls of the stalled endpoint");
    assert.equal(ds.get(stalled.id)?.consecutiveFailures, 0, "its one poll is still pending");
    assert.equal(ds.get(good.id)?.state.metrics?.waitingQueueSize, 7);
    assert.deepEqual([...(ds.get(good.id)?.modelIds ?? [])], ["m"]);
  } finally {
    await sc.close();
    await good.close();
    await stalled.close();
  }
});

test("scraper: stalled, garbled and failing endpoints go unhealthy with the reason", {
  timeout: 30_000,
}, async () => {
  const good = await metricsServer({ m: "ok" }, 7);
  const stalled = await metricsServer({ m: "stall" });
  const garbled = await metricsServer({ m: "garbled" });
  const failing = await metricsServer({ m: "500" });
  const ds = new Datastore({ failureThreshold: 3 });
  const polls: string[] = [];
  const extracts: string[] = [];
  const sc = new Scraper(ds, {
    intervalMs: 10,
    timeoutMs: 1000, // long enough that only the stalled endpoint ever times out
    onPollError: (id) => polls.push(id),
    onExtractError: (id) => extracts.push(id),
  });
  try {
    for (const f of [good, stalled, garbled, failing]) {
      ds.upsert(spec(f.id));
      sc.add(spec(f.id));
    }
    sc.start();
    for (const f of [stalled, garbled, failing])
      await waitFor(() => ds.get(f.id)?.health === "unhealthy", `${f.id} unhealthy`);
    assert.equal(ds.get(good.id)?.health, "healthy");
    assert.match(ds.get(stalled.id)?.lastError ?? "", /timed out after 1000 ms/);
    assert.match(ds.get(failing.id)?.lastError ?? "", /HTTP 500/);
    assert.ok(extracts.includes(garbled.id), "garbled text is an extract error");
    assert.match(ds.get(garbled.id)?.lastError ?? "", /\/metrics: no model-server metrics/);
    assert.ok(polls.includes(stalled.id) && polls.includes(failing.id));
    const c = ds.candidates("m", performance.now() / 1000);
    assert.ok(c.ok);
    assert.deepEqual(
      c.candidates.map((e) => e.id),
      [good.id],
    );
  } finally {
    await sc.close();
    await Promise.all([good, stalled, garbled, failing].map((f) => f.close()));
  }
});

test("scraper: a dying endpoint is marked unhealthy, then readmitted when it answers again", {
  timeout: 20_000,
}, async () => {
  const mode = { m: "ok" as "ok" | "stall" | "garbled" | "500" };
  const srv = await metricsServer(mode);
  const ds = new Datastore({ failureThreshold: 2 });
  const sc = new Scraper(ds, { intervalMs: 10, timeoutMs: 200 });
  try {
    const s = spec(srv.id);
    ds.upsert(s);
    sc.add(s);
    sc.start();
    await waitFor(() => ds.get(srv.id)?.health === "healthy", "first scrape");
    await srv.close();
    await waitFor(() => ds.get(srv.id)?.health === "unhealthy", "unhealthy after death");
    const stale = ds.snapshot(performance.now() / 1000)[0];
    assert.ok((stale.stalenessMs ?? 0) > 0 && stale.consecutiveScrapeFailures >= 2);
    await srv.restart();
    await waitFor(() => ds.get(srv.id)?.health === "healthy", "readmitted");
    assert.equal(ds.get(srv.id)?.consecutiveFailures, 0);
  } finally {
    await sc.close();
    await srv.close();
  }
});

test("data layer: endpoints added to the source are scraped, removed ones are dropped", {
  timeout: 20_000,
}, async () => {
  const a = await metricsServer({ m: "ok" }, 1);
  const b = await metricsServer({ m: "ok" }, 2);
  const src = EndpointSource.fromList(a.id);
  const changes: string[][] = [];
  const dl = new DataLayer(src, {
    scraper: { intervalMs: 10, timeoutMs: 500 },
    onEndpointsChanged: (ids) => changes.push([...ids]),
  });
  try {
    dl.start();
    await waitFor(() => dl.store.get(a.id)?.state.metrics !== null, "a scraped");
    src.replace(parseEndpointList(b.id));
    assert.equal(dl.store.get(a.id), undefined);
    await waitFor(() => dl.store.get(b.id)?.state.metrics?.waitingQueueSize === 2, "b scraped");
    const hitsA = a.hits("/metrics");
    await waitFor(() => b.hits("/metrics") > 5, "b polled repeatedly");
    assert.ok(a.hits("/metrics") <= hitsA + 1, "a is no longer polled");
    assert.deepEqual(changes.at(-1), [b.id]);
  } finally {
    await dl.close();
    await a.close();
    await b.close();
  }
});
