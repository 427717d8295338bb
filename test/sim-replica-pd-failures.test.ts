/**
 * The simulated NixlConnector pair when things go wrong, as vLLM behaves: a prefill that ends on
 * EOS returns no kv_transfer_params; invalid params mean a local prefill on the decoder; a dead
 * prefiller or an expired lease fail the decode by kv_load_failure_policy (fail → 500, recompute →
 * a local prefill), counted in vllm:nixl_num_failed_transfers; a lease runs out on the prefiller
 * (blocks freed, vllm:nixl_num_kv_expired_reqs) unless the decoder's heartbeats renew it; a
 * decoder aborted while it waits for the KV releases the prefiller's blocks at once.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { gauge } from "../src/datalayer/prom-text.ts";
import { decode, ids, prefill, startPdReplica } from "./helpers/pd-replicas.ts";
import { postJson, scrapeMetrics, waitFor } from "./helpers/replica.ts";

const bySource = async (url: string) => {
  const m = await scrapeMetrics(url);
  const g = (source: string) => gauge(m, "vllm:prompt_tokens_by_source_total", { source });
  return {
    local_compute: g("local_compute"),
    local_cache_hit: g("local_cache_hit"),
    external: g("external_kv_transfer"),
  };
};

test("a do_remote_decode request that stops on EOS frees its blocks and returns no kv_transfer_params", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  let stopped = 0;
  for (let seed = 1; seed <= 30 && stopped === 0; seed++) {
    const res = await postJson(`${p.url}/v1/completions`, {
      prompt: ids(64, seed * 100),
      max_tokens: 100,
      seed,
      kv_transfer_params: { do_remote_decode: true, some_future_key: { nested: 1 } },
    });
    assert.equal(res.status, 200, res.text);
    if (res.body.choices[0].finish_reason !== "stop") {
      assert.notEqual(res.body.kv_transfer_params, null, "length-capped: params returned");
      continue;
    }
    stopped++;
    assert.equal(res.body.kv_transfer_params, null);
  }
  assert.equal(stopped, 1, "a seed ends on EOS");
  // Only the length-capped ones hold blocks until a decoder reads them or the lease runs out.
  for (const id of p.server.engine.heldRequestIds()) p.server.engine.releaseHeld(id, 0);
  assert.equal(p.server.engine.stats().kvCacheUsage, 0);
});

test("invalid kv_transfer_params on the decoder mean a local prefill, logged as vLLM does", async (t) => {
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const res = await decode(
    d,
    { prompt: ids(100), max_tokens: 3, ignore_eos: true },
    {
      do_remote_prefill: true,
      remote_engine_id: "e1101616-0000-4000-8000-000000000000",
      remote_block_ids: [[1, 2, 3]],
    },
  );
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(
    d.logs.some((l) => l.includes("Got invalid KVTransferParams")),
    d.logs.join("\n"),
  );
  assert.deepEqual(await bySource(d.url), { local_compute: 100, local_cache_hit: 0, external: 0 });
});

for (const policy of ["fail", "recompute"] as const) {
  test(`the prefiller gone before the decoder pulls: kv_load_failure_policy ${policy}`, async (t) => {
    const p = await startPdReplica("kv_producer");
    t.after(() => p.close());
    const d = await startPdReplica("kv_consumer", { kv_load_failure_policy: policy });
    t.after(() => d.close());
    const body = { prompt: ids(200), max_tokens: 4, ignore_eos: true };
    const pre = await prefill(p, body);
    assert.equal(pre.status, 200);
    await p.close();
    const res = await decode(d, body, pre.body.kv_transfer_params);
    if (policy === "fail") {
      assert.equal(res.status, 500, res.text);
      assert.equal(res.body.error.type, "InternalServerError");
      assert.equal(res.body.error.code, 500);
      assert.match(res.body.error.message, /kv_load_failure_policy/);
    } else {
      assert.equal(res.status, 200, res.text);
      assert.equal(res.body.usage.completion_tokens, 4);
      assert.deepEqual(await bySource(d.url), { local_compute: 200, local_cache_hit: 0, external: 0 });
    }
    const m = await scrapeMetrics(d.url);
    assert.equal(gauge(m, "vllm:nixl_num_failed_transfers_total"), 1);
    assert.equal(
      gauge(m, "vllm:request_success_total", { finished_reason: "error" }),
      policy === "fail" ? 1 : 0,
    );
    assert.equal(d.server.engine.stats().kvCacheUsage, 0);
  });
}

test("a lease runs out on the prefiller: blocks freed, counted, and a late decode fails", async (t) => {
  const p = await startPdReplica("kv_producer", { kv_lease_duration: 10 });
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const body = { prompt: ids(160), max_tokens: 2, ignore_eos: true };
  const pre = await prefill(p, body);
  assert.ok(p.server.engine.stats().kvCacheUsage > 0);
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);
  assert.equal(p.server.engine.stats().kvCacheUsage, 0);
  const pm = await scrapeMetrics(p.url);
  assert.equal(gauge(pm, "vllm:nixl_num_kv_expired_reqs_total"), 1);
  const res = await decode(d, body, pre.body.kv_transfer_params);
  assert.equal(res.status, 500, res.text);
  assert.ok(
    d.logs.some((l) => l.includes("answered expired")),
    d.logs.join("\n"),
  );
});

test("the decoder's heartbeats keep the lease alive through a slow first handshake", async (t) => {
  // Lease 6 s (heartbeat every 1 s, +4 s each), handshake 12 s: without heartbeats it would expire.
  const slow = { timeScale: 10, kvLink: { handshake: 12 } };
  const p = await startPdReplica("kv_producer", { kv_lease_duration: 6 }, { timeScale: 10 });
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer", { kv_lease_duration: 6 }, slow);
  t.after(() => d.close());
  const body = { prompt: ids(96), max_tokens: 2, ignore_eos: true };
  const pre = await prefill(p, body);
  const res = await decode(d, body, pre.body.kv_transfer_params);
  assert.equal(res.status, 200, res.text);
  assert.equal(res.body.usage.prompt_tokens_details.cached_tokens, 95);
  assert.equal(gauge(await scrapeMetrics(p.url), "vllm:nixl_num_kv_expired_reqs_total"), 0);
});

test("aborting a decode that waits for remote KV releases the prefiller's blocks at once", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer", {}, { kvLink: { handshake: 3600 } });
  t.after(() => d.close());
  const body = { prompt: ids(240), max_tokens: 8, ignore_eos: true };
  const pre = await prefill(p, body);
  assert.equal(p.server.engine.heldRequestIds().length, 1);
  const ac = new AbortController();
  const pending = fetch(`${d.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, kv_transfer_params: pre.body.kv_transfer_params }),
    signal: ac.signal,
  }).catch((err: Error) => err);
  await waitFor(() => d.server.engine.stats().numRequestsWaitingDeferred === 1);
  const dm = await scrapeMetrics(d.url);
  assert.equal(gauge(dm, "vllm:num_requests_waiting_by_reason", { reason: "deferred" }), 1);
  assert.equal(gauge(dm, "vllm:num_requests_waiting_by_reason", { reason: "capacity" }), 0);
  assert.equal(gauge(dm, "vllm:num_requests_waiting"), 1);
  assert.equal(gauge(dm, "vllm:num_requests_running"), 0);
  assert.ok((gauge(dm, "vllm:kv_cache_usage_perc") ?? 0) > 0, "blocks allocated before the transfer");
  ac.abort();
  assert.ok((await pending) instanceof Error);
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);
  assert.equal(p.server.engine.stats().kvCacheUsage, 0);
  await waitFor(() => d.server.engine.stats().numRequestsWaiting === 0);
  assert.equal(d.server.engine.stats().kvCacheUsage, 0);
  assert.equal(gauge(await scrapeMetrics(p.url), "vllm:nixl_num_kv_expired_reqs_total"), 0);
});

test("a decode request rejected before admission frees the prefiller's blocks (vLLM PR #41269)", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const body = { prompt: ids(128), max_tokens: 2 };
  const pre = await prefill(p, body);
  assert.equal(p.server.engine.heldRequestIds().length, 1);
  const res = await decode(d, { ...body, model: "no-such-model" }, pre.body.kv_transfer_params);
  assert.equal(res.status, 404, res.text);
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);
  assert.equal(
    gauge(await scrapeMetrics(p.url), "vllm:nixl_num_kv_expired_reqs_total"),
    0,
    "released, not expired",
  );
});
