/**
 * The simulated replica with a CPU offload tier (vLLM --kv-offloading-size, native backend): a
 * prompt pushed out of HBM comes back from CPU, counted in cached_tokens and in vLLM's
 * kv_offload / external_prefix_cache metrics; the OffloadingConnector form of --kv-transfer-config
 * works too; bad offload settings get errors that say what to do.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { gauge } from "../src/datalayer/prom-text.ts";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import { resolveReplicaOptions } from "../src/sim/replica-options.ts";
import { postJson, scrapeMetrics, startTestReplica } from "./helpers/replica.ts";

const ids = (n: number, base: number) => Array.from({ length: n }, (_, i) => base + i);

async function evictAndReturn(settings: object) {
  const r = await startTestReplica({ numGpuBlocksOverride: 70, maxModelLen: 1024, ...settings });
  const cmpl = (prompt: number[]) =>
    postJson(`${r.url}/v1/completions`, { prompt, max_tokens: 1, ignore_eos: true });
  const a = ids(512, 1000);
  await cmpl(a);
  await cmpl(ids(960, 50000));
  const again = await cmpl(a);
  return { r, cached: again.body.usage.prompt_tokens_details.cached_tokens as number };
}

test("--kv-offloading-size: a prompt evicted from HBM is served from CPU, in cached_tokens and the metrics", async (t) => {
  const gpuOnly = await evictAndReturn({});
  t.after(() => gpuOnly.r.close());
  assert.ok(gpuOnly.cached < 400, `without the tier most of the prompt is recomputed (${gpuOnly.cached})`);

  const { r, cached } = await evictAndReturn({ kvOffloadingSize: 4, kvOffloadingBackend: "native" });
  t.after(() => r.close());
  assert.equal(cached, 511, "GPU and CPU hits together; the last token is recomputed");
  const m = await scrapeMetrics(r.url);
  const cpuHit = 512 - gpuOnly.cached;
  assert.equal(gauge(m, "vllm:external_prefix_cache_hits_total"), cpuHit);
  assert.equal(gauge(m, "vllm:external_prefix_cache_queries_total"), 512 + 960 + 512);
  const bpt = kvBytesPerToken(r.server.engine.config.profile.model);
  assert.equal(gauge(m, "vllm:kv_offload_load_bytes_total"), cpuHit * bpt);
  assert.equal(gauge(m, "vllm:kv_offload_total_bytes_total", { transfer_type: "CPU_to_GPU" }), cpuHit * bpt);
  assert.equal(
    gauge(m, "vllm:kv_offload_store_bytes_total"),
    (512 + 960) * bpt,
    "a's and b's full blocks were stored as they filled",
  );
  assert.ok((gauge(m, "vllm:kv_offload_load_time_total") ?? 0) > 0);
  assert.equal(
    gauge(m, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }),
    511 - gpuOnly.cached,
  );
});

test("--kv-transfer-config with the OffloadingConnector sets the tier, its chunk and its event form", async () => {
  const o = await resolveReplicaOptions({
    kvTransferConfig: JSON.stringify({
      kv_connector: "OffloadingConnector",
      kv_role: "kv_both",
      kv_connector_extra_config: {
        cpu_bytes_to_use: 107374182400,
        block_size: 64,
        self_describing_kv_events: true,
      },
    }),
  });
  assert.deepEqual(o.kvOffload, { cpuBytes: 107374182400, chunkTokens: 64, selfDescribingEvents: true });
  assert.equal(o.kvTransferConfig, null);
});

test("bad offload settings are refused with what to do", async () => {
  await assert.rejects(resolveReplicaOptions({ kvOffloadingSize: 0 }), /--kv-offloading-size: must be/);
  await assert.rejects(
    resolveReplicaOptions({ kvOffloadingSize: 4, kvOffloadingBackend: "lmcache" }),
    /lmcache is not simulated; use native/,
  );
  await assert.rejects(
    resolveReplicaOptions({
      kvTransferConfig: '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}',
    }),
    /cpu_bytes_to_use must be specified/,
  );
  await assert.rejects(
    resolveReplicaOptions({
      kvTransferConfig:
        '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":1e9,"block_size":24}}',
    }),
    /block_size 24 must be a multiple of --block-size 16/,
  );
  await assert.rejects(
    resolveReplicaOptions({ kvOffloadingSize: 4, enablePrefixCaching: false }),
    /needs prefix caching/,
  );
});
