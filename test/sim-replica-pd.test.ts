/**
 * Two simulated replicas as a vLLM NixlConnector pair: a prefill request to the producer returns
 * vLLM's kv_transfer_params and holds its blocks; a decode request with them makes the consumer
 * pull the KV over the side channel and decode; both replicas' metrics show it.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { gauge, histogram } from "../src/datalayer/prom-text.ts";
import { kvBytesPerToken } from "../src/engine/profile.ts";
import { decode, ids, prefill, startPdReplica } from "./helpers/pd-replicas.ts";
import { parseSse, postJson, scrapeMetrics, waitFor } from "./helpers/replica.ts";

test("a prefill on the producer and a decode on the consumer complete a P/D request end to end", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const prompt = ids(320);
  const body = { prompt, max_tokens: 6, ignore_eos: true };

  const pre = await prefill(p, body);
  assert.equal(pre.status, 200, pre.text);
  assert.equal(pre.body.choices[0].finish_reason, "length");
  const params = pre.body.kv_transfer_params;
  const nixl = p.server.nixl!;
  assert.deepEqual(Object.keys(params).sort(), [
    "do_remote_decode",
    "do_remote_prefill",
    "remote_block_ids",
    "remote_engine_id",
    "remote_host",
    "remote_num_tokens",
    "remote_port",
    "remote_request_id",
    "tp_size",
  ]);
  assert.equal(params.do_remote_prefill, true);
  assert.equal(params.do_remote_decode, false);
  assert.equal(params.remote_engine_id, nixl.config.engineId);
  assert.match(
    params.remote_engine_id,
    /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
  );
  assert.equal(params.remote_host, "127.0.0.1");
  assert.equal(params.remote_port, nixl.sideChannelPort);
  assert.notEqual(params.remote_port, 0);
  assert.equal(params.tp_size, 1);
  assert.equal(params.remote_num_tokens, 320);
  assert.equal(params.remote_block_ids.length, 1, "one list per KV-cache group");
  assert.equal(params.remote_block_ids[0].length, 20, "320 tokens in blocks of 16");
  assert.deepEqual(p.server.engine.heldRequestIds(), [params.remote_request_id]);
  const held = p.server.engine.stats();
  assert.equal(held.numHeldRequests, 1);
  assert.ok(held.kvCacheUsage > 0, "the held blocks count as used on P");

  const dec = await decode(d, body, params);
  assert.equal(dec.status, 200, dec.text);
  assert.equal(dec.body.choices[0].finish_reason, "length");
  assert.equal(dec.body.usage.completion_tokens, 6);
  assert.equal(dec.body.usage.prompt_tokens_details.cached_tokens, 319, "all but the recomputed last token");
  assert.equal(dec.body.kv_transfer_params, null);

  // P frees the blocks once D's read-complete notification arrives.
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);
  assert.equal(p.server.engine.stats().kvCacheUsage, 0);

  const dm = await scrapeMetrics(d.url);
  const src = (m: typeof dm, source: string) => gauge(m, "vllm:prompt_tokens_by_source_total", { source });
  assert.equal(src(dm, "external_kv_transfer"), 319);
  assert.equal(src(dm, "local_compute"), 1);
  assert.equal(src(dm, "local_cache_hit"), 0);
  assert.equal(gauge(dm, "vllm:prompt_tokens_total"), 320);
  const xfer = histogram(dm, "vllm:nixl_xfer_time_seconds");
  assert.equal(xfer?.count, 1);
  const bytes = histogram(dm, "vllm:nixl_bytes_transferred");
  const expectedBytes = 20 * 16 * kvBytesPerToken(d.server.opts.profile.model);
  assert.equal(bytes?.sum, expectedBytes);
  assert.ok(
    Math.abs((xfer?.sum ?? 0) - (0.005 + expectedBytes / 8e9)) < 1e-9,
    "modelled time on the RDMA link",
  );
  assert.equal(gauge(dm, "vllm:nixl_num_failed_transfers_total"), 0);
  assert.equal(gauge(dm, "vllm:num_requests_waiting_by_reason", { reason: "deferred" }), 0);

  const pm = await scrapeMetrics(p.url);
  assert.equal(src(pm, "local_compute"), 320);
  assert.equal(src(pm, "external_kv_transfer"), 0);
  assert.equal(histogram(pm, "vllm:nixl_xfer_time_seconds")?.count, 0, "transfers are recorded on D");
  assert.equal(gauge(pm, "vllm:nixl_num_kv_expired_reqs_total"), 0);
});

test("kv_both replicas: a streamed decode leg pulls the KV and streams its tokens", async (t) => {
  const p = await startPdReplica("kv_both");
  t.after(() => p.close());
  const d = await startPdReplica("kv_both");
  t.after(() => d.close());
  const body = {
    prompt: ids(200, 7000),
    max_tokens: 5,
    ignore_eos: true,
    stream: true,
    stream_options: { include_usage: true },
  };
  const pre = await prefill(p, body);
  assert.equal(pre.status, 200, pre.text);
  const res = await fetch(`${d.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, kv_transfer_params: pre.body.kv_transfer_params }),
  });
  assert.equal(res.status, 200);
  const events = parseSse(await res.text());
  assert.equal(events.at(-1), "[DONE]");
  const usage = events.at(-2).usage;
  assert.equal(usage.completion_tokens, 5);
  assert.equal(usage.prompt_tokens_details.cached_tokens, 199);
  const text = events
    .slice(0, -2)
    .map((e) => e.choices[0].text)
    .join("");
  assert.ok(text.length > 0);
  assert.equal(
    gauge(await scrapeMetrics(d.url), "vllm:prompt_tokens_by_source_total", {
      source: "external_kv_transfer",
    }),
    199,
  );
  await waitFor(() => p.server.engine.heldRequestIds().length === 0);
});

test("transfers to one decoder share its link: the second of two concurrent pulls waits for the first", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  // 0.01 GB/s: one pull of 320 tokens (~42 MB) takes ~4 simulated seconds on the wire.
  const d = await startPdReplica("kv_consumer", {}, { kvLink: { bandwidth: 1e7 } });
  t.after(() => d.close());
  const bodies = [ids(320, 1000), ids(320, 50000)].map((prompt) => ({
    prompt,
    max_tokens: 2,
    ignore_eos: true,
  }));
  const pres = await Promise.all(bodies.map((b) => prefill(p, b)));
  // Both wait on the one first-contact handshake, then post together.
  const decs = await Promise.all(bodies.map((b, i) => decode(d, b, pres[i]!.body.kv_transfer_params)));
  for (const r of decs) assert.equal(r.status, 200, r.text);
  const m = await scrapeMetrics(d.url);
  const x = histogram(m, "vllm:nixl_xfer_time_seconds")!;
  const one = 0.005 + histogram(m, "vllm:nixl_bytes_transferred")!.sum / 2 / 1e7;
  assert.equal(x.count, 2);
  assert.ok(x.sum > 2.5 * one, `queued: ${x.sum} s for two, ${one} s for one alone`);
});

test("chat completions carry kv_transfer_params on both legs as well", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const messages = [{ role: "user", content: "Summarise this long document. ".repeat(40) }];
  const pre = await postJson(`${p.url}/v1/chat/completions`, {
    messages,
    max_tokens: 1,
    max_completion_tokens: 1,
    min_tokens: 1,
    stream: false,
    kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false },
  });
  assert.equal(pre.status, 200, pre.text);
  const params = pre.body.kv_transfer_params;
  assert.equal(params.do_remote_prefill, true);
  const promptTokens = pre.body.usage.prompt_tokens;
  assert.equal(params.remote_block_ids[0].length, Math.ceil(promptTokens / 16));
  const dec = await postJson(`${d.url}/v1/chat/completions`, {
    messages,
    max_tokens: 4,
    ignore_eos: true,
    kv_transfer_params: params,
  });
  assert.equal(dec.status, 200, dec.text);
  assert.equal(dec.body.usage.prompt_tokens_details.cached_tokens, promptTokens - 1);
  assert.equal(dec.body.kv_transfer_params, null);
});
