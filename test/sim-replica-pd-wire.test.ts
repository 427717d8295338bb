/**
 * P/D wire formats of the simulated replica: --kv-transfer-config parsed with vLLM's fields,
 * defaults and errors; the NIXL metrics with vLLM's names, types and bucket lists; the side channel
 * surviving garbage; and two `kvgate sim-replica` processes completing a P/D request over it.
 */
import assert from "node:assert/strict";
import { createConnection } from "node:net";
import { test } from "node:test";
import { gauge, histogram, type PromFamilies } from "../src/datalayer/prom-text.ts";
import { parseKvTransferConfig, sideChannelAddress } from "../src/sim/kv-transfer-config.ts";
import { decode, ids, prefill, startPdReplica } from "./helpers/pd-replicas.ts";
import { postJson, scrapeMetrics, spawnReplica } from "./helpers/replica.ts";

test("--kv-transfer-config: vLLM's fields and defaults, clear errors", () => {
  const c = parseKvTransferConfig('{"kv_connector":"NixlConnector","kv_role":"kv_producer"}');
  assert.equal(c.kvRole, "kv_producer");
  assert.equal(c.kvLoadFailurePolicy, "fail");
  assert.equal(c.kvLeaseDuration, 30);
  assert.match(c.engineId, /^[0-9a-f-]{36}$/);
  const both = parseKvTransferConfig(
    JSON.stringify({
      kv_connector: "NixlConnector",
      kv_role: "kv_both",
      engine_id: "engine-a",
      kv_buffer_device: "cuda",
      kv_connector_extra_config: {
        kv_lease_duration: 12,
        kv_load_failure_policy: "recompute",
        backends: ["UCX"],
      },
    }),
  );
  assert.deepEqual(
    [both.engineId, both.kvLeaseDuration, both.kvLoadFailurePolicy],
    ["engine-a", 12, "recompute"],
  );
  const top = parseKvTransferConfig(
    '{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_load_failure_policy":"fail","kv_connector_extra_config":{"kv_load_failure_policy":"recompute"}}',
  );
  assert.equal(top.kvLoadFailurePolicy, "fail", "vLLM's top-level field wins");
  const bad: [string, RegExp][] = [
    ["{nope", /not valid JSON.*kv_connector/],
    ['{"kv_connector":"NixlConnector"}', /Please specify kv_role when kv_connector is set/],
    [
      '{"kv_connector":"NixlConnector","kv_role":"prefill"}',
      /kv_role: Input should be 'kv_producer', 'kv_consumer' or 'kv_both'/,
    ],
    [
      '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}',
      /MooncakeConnector .* does not simulate; use "NixlConnector"/,
    ],
    ['{"kv_connector":"Bogus","kv_role":"kv_producer"}', /Unsupported connector type: Bogus/],
    ['{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_rol":1}', /unknown field\(s\) kv_rol/],
    ['{"kv_role":"kv_producer"}', /kv_connector is required/],
    [
      '{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_connector_extra_config":{"kv_lease_duration":-1}}',
      /kv_lease_duration must be a number of seconds > 0/,
    ],
  ];
  for (const [json, re] of bad) assert.throws(() => parseKvTransferConfig(json), re, json);
});

test("the side channel address follows vLLM's environment variables and the DP rank", () => {
  assert.deepEqual(sideChannelAddress({}, 0), { host: "localhost", port: 5600 });
  assert.deepEqual(sideChannelAddress({}, 3), { host: "localhost", port: 5603 });
  assert.deepEqual(
    sideChannelAddress({ VLLM_NIXL_SIDE_CHANNEL_HOST: "10.0.0.42", VLLM_NIXL_SIDE_CHANNEL_PORT: "7000" }, 1),
    { host: "10.0.0.42", port: 7001 },
  );
  assert.deepEqual(sideChannelAddress({ VLLM_NIXL_SIDE_CHANNEL_PORT: "7000" }, 1, { port: 0 }), {
    host: "localhost",
    port: 0,
  });
  assert.throws(
    () => sideChannelAddress({ VLLM_NIXL_SIDE_CHANNEL_PORT: "x" }, 0),
    /VLLM_NIXL_SIDE_CHANNEL_PORT/,
  );
});

const le = (m: PromFamilies, name: string) =>
  histogram(m, name)!
    .buckets.map(([b]) => b)
    .filter((b) => b !== Infinity);

test("NIXL metrics carry vLLM's names, types, labels and buckets", async (t) => {
  const d = await startPdReplica("kv_consumer");
  t.after(() => d.close());
  const m = await scrapeMetrics(d.url);
  const xfer = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0];
  assert.deepEqual(le(m, "vllm:nixl_xfer_time_seconds"), xfer);
  assert.deepEqual(le(m, "vllm:nixl_post_time_seconds"), [0.001, ...xfer]);
  assert.deepEqual(
    le(m, "vllm:nixl_bytes_transferred"),
    [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23].map((i) => 2 ** (10 + i)),
  );
  const types: [string, string][] = [
    ["vllm:nixl_xfer_time_seconds", "histogram"],
    ["vllm:nixl_post_time_seconds", "histogram"],
    ["vllm:nixl_bytes_transferred", "histogram"],
    ["vllm:nixl_num_failed_transfers_total", "counter"],
    ["vllm:nixl_num_failed_notifications_total", "counter"],
    ["vllm:nixl_num_kv_expired_reqs_total", "counter"],
    ["vllm:prompt_tokens_by_source_total", "counter"],
    ["vllm:num_requests_waiting_by_reason", "gauge"],
  ];
  for (const [name, type] of types) assert.equal(m.get(name)?.type, type, name);
  for (const s of m.get("vllm:nixl_num_failed_transfers_total")!.samples)
    assert.deepEqual(Object.keys(s.labels).sort(), ["engine", "model_name"]);
  assert.deepEqual(
    m
      .get("vllm:prompt_tokens_by_source_total")!
      .samples.map((s) => s.labels.source)
      .sort(),
    ["external_kv_transfer", "local_cache_hit", "local_compute"],
  );
  assert.deepEqual(
    m
      .get("vllm:num_requests_waiting_by_reason")!
      .samples.map((s) => s.labels.reason)
      .sort(),
    ["capacity", "deferred"],
  );
  assert.equal(gauge(m, "vllm:request_success_total", { finished_reason: "error" }), 0);
});

test("a replica without --kv-transfer-config ignores kv_transfer_params and exports no NIXL metrics", async (t) => {
  const { startTestReplica } = await import("./helpers/replica.ts");
  const r = await startTestReplica();
  t.after(() => r.close());
  const res = await postJson(`${r.url}/v1/completions`, {
    prompt: ids(64),
    max_tokens: 1,
    kv_transfer_params: { do_remote_decode: true },
  });
  assert.equal(res.status, 200);
  assert.equal(res.body.kv_transfer_params, null);
  assert.deepEqual(r.server.engine.heldRequestIds(), []);
  const m = await scrapeMetrics(r.url);
  assert.equal(m.get("vllm:nixl_xfer_time_seconds"), undefined);
  assert.ok(m.get("vllm:prompt_tokens_by_source_total"), "by-source prompt tokens are always exported");
});

test("garbage on the side channel is answered with an error line and the replica keeps serving", async (t) => {
  const p = await startPdReplica("kv_producer");
  t.after(() => p.close());
  const reply = await new Promise<string>((resolve, reject) => {
    const s = createConnection({ host: "127.0.0.1", port: p.server.nixl!.sideChannelPort });
    let got = "";
    s.setEncoding("utf8");
    s.on("data", (d: string) => (got += d));
    s.on("end", () => resolve(got));
    s.on("error", reject);
    s.write('{"type":"read","seq":1,"remote_request_id":"x","block_ids":[1]}\nnot json\n');
  });
  const lines = reply
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  assert.deepEqual(lines[0], { type: "read", seq: 1, status: "wrong_engine" });
  assert.equal(lines[1].type, "error");
  assert.match(lines[1].message, /one JSON object per line/);
  const res = await prefill(p, { prompt: ids(32) });
  assert.equal(res.status, 200);
  assert.equal(res.body.kv_transfer_params.do_remote_prefill, true);
});

test("two kvgate sim-replica processes complete a P/D request over the side channel", async (t) => {
  const kv = (role: string) => JSON.stringify({ kv_connector: "NixlConnector", kv_role: role });
  const pd = ["--nixl-side-channel-host", "127.0.0.1", "--nixl-side-channel-port", "0"];
  const small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096"];
  const p = await spawnReplica(["--kv-transfer-config", kv("kv_producer"), ...pd, ...small]);
  t.after(() => p.close());
  const d = await spawnReplica([
    "--kv-transfer-config",
    kv("kv_consumer"),
    ...pd,
    ...small,
    "--kv-transport",
    "tcp",
  ]);
  t.after(() => d.close());
  assert.match(
    p.banner,
    /kv_transfer=NixlConnector\(kv_producer\) engine_id=\S+ side_channel=127\.0\.0\.1:\d+/,
  );
  const sideChannel = Number(/side_channel=127\.0\.0\.1:(\d+)/.exec(p.banner)![1]);
  const P = { url: p.url } as Parameters<typeof prefill>[0];
  const D = { url: d.url } as Parameters<typeof decode>[0];
  const body = { prompt: ids(480), max_tokens: 3, ignore_eos: true };
  const pre = await prefill(P, body);
  assert.equal(pre.status, 200, pre.text);
  assert.equal(pre.body.kv_transfer_params.remote_port, sideChannel);
  const dec = await decode(D, body, pre.body.kv_transfer_params);
  assert.equal(dec.status, 200, dec.text);
  assert.equal(dec.body.usage.prompt_tokens_details.cached_tokens, 479);
  const dm = await scrapeMetrics(d.url);
  assert.equal(gauge(dm, "vllm:prompt_tokens_by_source_total", { source: "external_kv_transfer" }), 479);
  const x = histogram(dm, "vllm:nixl_xfer_time_seconds")!;
  const bytes = histogram(dm, "vllm:nixl_bytes_transferred")!;
  assert.equal(x.count, 1);
  assert.ok(Math.abs(x.sum - (0.005 + bytes.sum / 0.5e9)) < 1e-9, "the TCP-fallback link's time");
});
