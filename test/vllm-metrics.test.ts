/**
 * The replica's /metrics: vLLM V1 names, labels and buckets, parsed back with the project's
 * Prometheus text parser; counters match the traffic sent; histograms are in simulated seconds;
 * legacy names only on request; kvgate's own sim-clock metrics.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { extractMetrics, isExtractedSample } from "../src/datalayer/extract.ts";
import { first, gauge, histogram, type PromFamilies, parsePromText } from "../src/datalayer/prom-text.ts";
import { stepTime } from "../src/engine/profile.ts";
import type { EngineStats } from "../src/engine/types.ts";
import { loadProfile } from "../src/sim/profiles.ts";
import {
  buckets125,
  ITL_BUCKETS,
  REQUEST_LATENCY_BUCKETS,
  TTFT_BUCKETS,
  VllmMetrics,
} from "../src/sim/vllm-metrics.ts";
import { postJson, scrapeMetrics, startTestReplica } from "./helpers/replica.ts";

const ids = (n: number, base = 1000) => Array.from({ length: n }, (_, i) => base + i);
const le = (name: string, m: PromFamilies) =>
  histogram(m, name)!
    .buckets.map(([b]) => b)
    .filter((b) => b !== Infinity);

test("build_1_2_5_buckets", () => {
  assert.deepEqual(buckets125(100), [1, 2, 5, 10, 20, 50, 100]);
  assert.deepEqual(buckets125(4096), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]);
  assert.deepEqual(buckets125(1), [1]);
});

test("VllmMetrics follows the engine's counters by difference and keeps counters monotonic", async () => {
  const stats: EngineStats = {
    numRequestsRunning: 3,
    numRequestsWaiting: 1,
    numRequestsWaitingDeferred: 0,
    kvCacheUsage: 0.25,
    prefixCacheQueries: 100,
    prefixCacheHits: 32,
    numPreemptions: 0,
    promptTokens: 100,
    promptTokensBySource: { local_compute: 68, local_cache_hit: 32, external_kv_transfer: 0 },
    generationTokens: 10,
    requestSuccess: { stop: 1, length: 2, abort: 0, error: 0 },
    numSteps: 5,
    numCachedBlocks: 4,
    numFreeBlocks: 10,
    numHeldRequests: 0,
    numKvExpiredReqs: 0,
  };
  const m = new VllmMetrics({
    modelName: "m",
    maxModelLen: 1000,
    cacheConfig: { block_size: "16", num_gpu_blocks: "11" },
    legacyNames: true,
    timeScale: 10,
    stats: () => stats,
    lag: () => ({ current: 0.5, max: 2 }),
  });
  let f = parsePromText(await m.render()).families;
  assert.equal(gauge(f, "vllm:num_requests_running", { model_name: "m", engine: "0" }), 3);
  assert.equal(gauge(f, "vllm:gpu_cache_usage_perc"), 0.25);
  assert.equal(gauge(f, "vllm:gpu_prefix_cache_hits_total"), 32);
  assert.equal(gauge(f, "vllm:request_success_total", { finished_reason: "length" }), 2);
  assert.equal(gauge(f, "kvgate:sim_lag_seconds"), 0.5);
  assert.equal(gauge(f, "kvgate:sim_lag_max_seconds"), 2);
  stats.prefixCacheQueries = 250;
  stats.requestSuccess = { stop: 1, length: 5, abort: 1, error: 0 };
  f = parsePromText(await m.render()).families;
  assert.equal(gauge(f, "vllm:prefix_cache_queries_total"), 250);
  assert.equal(gauge(f, "vllm:request_success_total", { finished_reason: "length" }), 5);
  assert.equal(gauge(f, "vllm:request_success_total", { finished_reason: "abort" }), 1);
  assert.deepEqual(le("vllm:request_prompt_tokens", f), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]);
});

test("/metrics after traffic: names, labels, buckets, counters and simulated-second histograms", async (t) => {
  const r = await startTestReplica({ servedModelName: "sim-model" });
  t.after(() => r.close());
  const prompts = [ids(4000, 5000), ids(300, 20000), ids(300, 20000)];
  const maxTokens = [5, 8, 3];
  for (let i = 0; i < prompts.length; i++) {
    const res = await postJson(`${r.url}/v1/completions`, {
      prompt: prompts[i],
      max_tokens: maxTokens[i],
      ignore_eos: true,
    });
    assert.equal(res.status, 200);
  }
  await postJson(`${r.url}/v1/completions`, { prompt: "bad", max_tokens: -1 }); // rejected: must not count

  const res = await fetch(`${r.url}/metrics`);
  assert.equal(res.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  const m = parsePromText(await res.text()).families;
  const L = { model_name: "sim-model", engine: "0" };
  const totalPrompt = 4300 + 300;
  assert.equal(gauge(m, "vllm:prompt_tokens_total", L), totalPrompt);
  assert.equal(gauge(m, "vllm:generation_tokens_total", L), 16);
  assert.equal(gauge(m, "vllm:prefix_cache_queries_total", L), totalPrompt);
  assert.equal(
    gauge(m, "vllm:prefix_cache_hits_total", L),
    288,
    "the repeated 300-token prompt hits 18 blocks",
  );
  assert.equal(gauge(m, "vllm:request_success_total", { ...L, finished_reason: "length" }), 3);
  assert.equal(gauge(m, "vllm:request_success_total", { ...L, finished_reason: "stop" }), 0);
  assert.equal(gauge(m, "vllm:num_requests_running", L), 0);
  assert.equal(gauge(m, "vllm:num_requests_waiting", L), 0);
  assert.equal(gauge(m, "vllm:num_preemptions_total", L), 0);
  assert.equal(gauge(m, "vllm:kv_cache_usage_perc", L), 0);
  assert.equal(m.get("vllm:gpu_cache_usage_perc"), undefined, "legacy names are off by default");

  // Every vllm: series carries model_name and engine, except cache_config_info (engine only, like vLLM).
  for (const [name, fam] of m) {
    if (!name.startsWith("vllm:")) continue;
    for (const s of fam.samples) {
      assert.equal(s.labels["engine"], "0", `${s.name} engine label`);
      if (name === "vllm:cache_config_info") assert.equal(s.labels["model_name"], undefined);
      else assert.equal(s.labels["model_name"], "sim-model", `${s.name} model_name label`);
    }
  }
  const info = m.get("vllm:cache_config_info")!.samples[0]!;
  assert.equal(info.value, 1);
  assert.equal(info.labels["block_size"], "16");
  assert.equal(info.labels["num_gpu_blocks"], "2048");
  assert.equal(info.labels["enable_prefix_caching"], "True");
  assert.equal(info.labels["prefix_caching_hash_algo"], "sha256_cbor");

  assert.deepEqual(le("vllm:time_to_first_token_seconds", m), TTFT_BUCKETS);
  assert.deepEqual(le("vllm:inter_token_latency_seconds", m), ITL_BUCKETS);
  for (const h of [
    "e2e_request_latency",
    "request_queue_time",
    "request_prefill_time",
    "request_decode_time",
    "request_inference_time",
  ])
    assert.deepEqual(le(`vllm:${h}_seconds`, m), REQUEST_LATENCY_BUCKETS, h);
  assert.deepEqual(
    le("vllm:iteration_tokens_total", m),
    [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
  );

  const ttft = histogram(m, "vllm:time_to_first_token_seconds", L)!;
  const e2e = histogram(m, "vllm:e2e_request_latency_seconds", L)!;
  const itl = histogram(m, "vllm:inter_token_latency_seconds", L)!;
  assert.equal(ttft.count, 3);
  assert.equal(e2e.count, 3);
  assert.equal(itl.count, 4 + 7 + 2, "one observation per decode step after the first token");
  // Simulated seconds: the 4000-token prefill alone takes at least its modelled step time, whatever
  // the wall clock did (at 100× it took about a millisecond of wall time).
  const profile = loadProfile("llama-3.1-8b-h100");
  const prefill = stepTime(profile, { prefills: [{ tokens: 4000, context: 0 }], decodeContexts: [] }).total;
  assert.ok(ttft.sum >= prefill, `TTFT sum ${ttft.sum} < modelled prefill ${prefill}`);
  assert.ok(e2e.sum > ttft.sum);
  const gen = histogram(m, "vllm:request_generation_tokens", L)!;
  assert.equal(gen.sum, 16);
  assert.equal(histogram(m, "vllm:request_prompt_tokens", L)!.sum, totalPrompt);
  assert.equal(
    histogram(m, "vllm:iteration_tokens_total", L)!.sum,
    totalPrompt - 288 + 16 - 3,
    "prefill + decode tokens",
  );

  assert.equal(first(m, "kvgate:sim_time_scale", L), 100);
  // The largest delivery lag is one of the lags the histogram observed (all ≥ 0): between their
  // mean and their sum.
  const lags = histogram(m, "kvgate:sim_delivery_lag_seconds", L)!;
  assert.ok(lags.count > 0);
  const lagMax = first(m, "kvgate:sim_lag_max_seconds", L);
  assert.equal(typeof lagMax, "number");
  const eps = 1e-9 * (1 + lags.sum);
  assert.ok(
    lagMax! >= lags.sum / lags.count - eps && lagMax! <= lags.sum + eps,
    `max lag ${lagMax} vs ${lags.count} lags summing to ${lags.sum}`,
  );
});

test("--legacy-metric-names adds the pre-0.10 names alongside the current ones", async (t) => {
  const r = await startTestReplica({ legacyMetricNames: true });
  t.after(() => r.close());
  await postJson(`${r.url}/v1/completions`, { prompt: ids(40), max_tokens: 1 });
  await postJson(`${r.url}/v1/completions`, { prompt: ids(40), max_tokens: 1 });
  const m = await scrapeMetrics(r.url);
  assert.equal(gauge(m, "vllm:gpu_prefix_cache_queries_total"), 80);
  assert.equal(gauge(m, "vllm:gpu_prefix_cache_hits_total"), 32);
  assert.equal(gauge(m, "vllm:prefix_cache_hits_total"), 32);
  assert.equal(gauge(m, "vllm:gpu_cache_usage_perc"), gauge(m, "vllm:kv_cache_usage_perc"));
});

test("the gateway's scrape parses only the series it extracts, and extracts the same as a full parse", async (t) => {
  const r = await startTestReplica({ servedModelName: "sim-model", timeScale: 4 });
  t.after(() => r.close());
  for (const n of [900, 40])
    assert.equal((await postJson(`${r.url}/v1/completions`, { prompt: ids(n), max_tokens: 4 })).status, 200);
  const text = await (await fetch(`${r.url}/metrics`)).text();
  const full = parsePromText(text, { lenient: true });
  const kept = parsePromText(text, { lenient: true, keep: isExtractedSample });
  assert.deepEqual(extractMetrics(kept.families), extractMetrics(full.families));
  assert.equal(extractMetrics(kept.families).simTimeScale, 4);
  const count = (f: PromFamilies) => [...f.values()].reduce((a, x) => a + x.samples.length, 0);
  // Histograms are most of a replica's series; none of them is parsed.
  assert.equal(histogram(kept.families, "vllm:time_to_first_token_seconds"), undefined);
  assert.ok(histogram(full.families, "vllm:time_to_first_token_seconds"));
  assert.ok(
    count(kept.families) * 5 < count(full.families),
    `${count(kept.families)} of ${count(full.families)}`,
  );
});
