/**
 * Precise mode end to end: simulated vLLM replicas with a small KV pool publish real KV events; one
 * gateway runs config/examples/precise-prefix.yaml as shipped (endpoints file with kvEvents and
 * kvEventsReplay addresses, no --tokenizer: the sim tokenizer is the default), another the approximate
 * default (config/examples/default.yaml). A prefix P is routed to replica A through both; then A evicts
 * P under traffic sent straight to A, and P reaches replica B straight, so neither gateway routed any of
 * it. /explain must then pick B in precise mode (B holds P per its events) and A in approximate mode
 * (its index only knows its own routing), each with the scores that say why; and the request really
 * hits B's prefix cache when sent.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { promptTokenIds } from "../src/gateway/tokenize.ts";
import type { PrecisePrefixProducer } from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import type { ChatMessage } from "../src/scheduler/types.ts";
import {
  caughtUp as caughtUpWith,
  fillerPrompt,
  endpointId as id,
  joinEvents,
  startEventReplica,
  writeEventEndpoints,
} from "./helpers/precise-fleet.ts";
import { type Json, postJson, type TestReplica, waitFor } from "./helpers/replica.ts";

const EXAMPLES = fileURLToPath(new URL("../config/examples/", import.meta.url));
const MODEL = "m";
const BLOCK = 16;
const tok = createSimTokenizer();

const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);
const now = () => performance.now() / 1000;

const startReplica = (name: string) => startEventReplica(name, MODEL);

let dir: string;
let A0: TestReplica;
let A1: TestReplica;
let precise: GatewayHandle;
let approx: GatewayHandle;
let producer: PrecisePrefixProducer;
const logs: string[] = [];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "kvgate-precise-e2e-"));
  [A0, A1] = await Promise.all([startReplica("r0"), startReplica("r1")]);
  const epFile = writeEventEndpoints(dir, [A0, A1]);
  precise = await startGateway({
    endpointsFile: epFile,
    configFile: join(EXAMPLES, "precise-prefix.yaml"),
    scrapeIntervalMs: 25,
    seed: 7,
    log: (l) => logs.push(l),
  });
  approx = await startGateway({
    endpoints: [A0, A1].map(id).join(","),
    configFile: join(EXAMPLES, "default.yaml"),
    scrapeIntervalMs: 25,
    seed: 7,
    log: () => {},
  });
  producer = precise.gateway.routing.precise[0]!;
  for (const gw of [precise, approx])
    await waitFor(() =>
      gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
    );
});

after(async () => {
  await precise?.close();
  await approx?.close();
  await Promise.all([A0, A1].filter(Boolean).map((r) => r.close()));
  rmSync(dir, { recursive: true, force: true });
});

const caughtUp = (r: TestReplica) => caughtUpWith(precise, r);

const chat = (messages: ChatMessage[]) => ({ model: MODEL, messages, max_tokens: 2 });
const keysOf = (messages: ChatMessage[]) => {
  const ids = promptTokenIds(tok, { kind: "chat", messages });
  assert.ok(ids);
  return producer.index.keyer.keys(ids, MODEL);
};
/** Consecutive blocks from block 0 the precise index says `r` holds. */
const held = (r: TestReplica, keys: BigUint64Array) =>
  producer.index.longestPrefix(keys, [id(r)], now()).blocks[0];

async function explain(gw: GatewayHandle, body: unknown): Promise<Json> {
  const res = await postJson(`${gw.adminUrl}/explain`, body);
  assert.equal(res.status, 200, res.text);
  return res.body;
}

test("precise mode picks the replica that holds the prefix now; the approximate index still says the old one", {
  timeout: 120_000,
}, async () => {
  assert.ok(precise.gateway.tokenizerDefaulted, "no --tokenizer: precise mode defaults to the sim tokenizer");
  assert.equal(precise.gateway.tokenizerName, "sim");
  assert.equal(approx.gateway.tokenizer, null, "approximate mode does not tokenize unless asked");

  await joinEvents(precise, [A0, A1], MODEL);

  const system = `You are the support agent of the kvgate project. ${"Answer with care, cite the relevant source file, and keep every reply short. ".repeat(22)}`;
  const P: ChatMessage[] = [
    { role: "system", content: system },
    { role: "user", content: "Why did my request land on this replica?" },
  ];
  const keysP = keysOf(P);
  assert.ok(keysP.length >= 24, `P has ${keysP.length} full blocks`);

  // 1. P through the approximate gateway: it lands on some replica, A, and that index learns A.
  const before1 = [A0, A1].map(served);
  assert.equal((await postJson(`${approx.url}/v1/chat/completions`, chat(P))).status, 200);
  const d1 = [A0, A1].map((r, i) => served(r) - before1[i]);
  assert.deepEqual([...d1].sort(), [0, 1], `requests served: ${d1}`);
  const ai = d1.indexOf(1);
  const [A, B] = ai === 0 ? [A0, A1] : [A1, A0];

  // 2. The precise index learns it from A's events, and the precise gateway sends P to A as well.
  await waitFor(() => held(A, keysP) === keysP.length);
  assert.equal(held(B, keysP), 0);
  const servedA = served(A);
  assert.equal((await postJson(`${precise.url}/v1/chat/completions`, chat(P))).status, 200);
  assert.equal(served(A), servedA + 1, "precise mode routed P to A, which holds it");

  // 3. A evicts P under traffic sent straight to A (no gateway sees it).
  for (let i = 0; i < 30 && held(A, keysP) > 0; i++) {
    const res = await postJson(`${A.url}/v1/completions`, {
      model: MODEL,
      prompt: fillerPrompt(i),
      max_tokens: 1,
    });
    assert.equal(res.status, 200, res.text);
    await caughtUp(A);
  }
  assert.equal(held(A, keysP), 0, "A's BlockRemoved events evicted P from the precise index");

  // 4. P reaches B straight (no gateway sees it either).
  assert.equal((await postJson(`${B.url}/v1/chat/completions`, chat(P))).status, 200);
  await waitFor(() => held(B, keysP) === keysP.length);

  // A request starting with P: the same system prompt, another question.
  const Q: ChatMessage[] = [P[0]!, { role: "user", content: "And which replica holds my prefix now?" }];
  const keysQ = keysOf(Q);
  let shared = 0;
  while (shared < keysQ.length && keysQ[shared] === keysP[shared]) shared++;
  assert.ok(shared >= 20 && shared < keysQ.length, `shared ${shared} of ${keysQ.length} blocks`);

  // 5. Precise: B, because B holds the shared blocks per its events and A holds none.
  const ex = await explain(precise, chat(Q));
  assert.equal(ex.picked, id(B));
  const pm = ex.prefixMatch.precise;
  assert.equal(pm.type, "precise-prefix-cache-producer");
  assert.equal(pm.totalBlocks, keysQ.length);
  assert.equal(pm.blockSizeTokens, BLOCK);
  assert.deepEqual(pm.heldBlocks, { [id(A)]: 0, [id(B)]: shared });
  assert.deepEqual(pm.matchBlocks, { [id(A)]: 0, [id(B)]: shared }, "gpu tier: weight 1 per block");
  const byId = (e: Json) => Object.fromEntries(e.candidates.map((c: Json) => [c.address, c]));
  const cand = byId(ex);
  const prefixScore = (c: Json) => c.scores["prefix-cache-scorer"];
  assert.equal(prefixScore(cand[id(B)]).raw, shared / keysQ.length);
  assert.equal(prefixScore(cand[id(B)]).weight, 2);
  assert.equal(prefixScore(cand[id(A)]).raw, 0);
  // Nothing in flight: only this request's own uncached prompt tokens differ (token-load-scorer's
  // lookahead, per the same precise match), which favours B as well.
  const qTokens = promptTokenIds(tok, { kind: "chat", messages: Q })!.length;
  assert.equal(
    cand[id(A)].scores["active-request-scorer"].raw,
    cand[id(B)].scores["active-request-scorer"].raw,
  );
  assert.equal(cand[id(A)].scores["token-load-scorer"].raw, 1 - qTokens / 262144);
  assert.equal(cand[id(B)].scores["token-load-scorer"].raw, 1 - (qTokens - shared * BLOCK) / 262144);
  assert.ok(cand[id(B)].total > cand[id(A)].total);

  // 6. Approximate (default.yaml): still A. Its index learned A when it routed P and never saw the rest.
  const exA = await explain(approx, chat(Q));
  assert.equal(exA.picked, id(A));
  const candA = byId(exA);
  assert.equal(candA[id(B)].removedBy, "prefix-cache-affinity-filter", "B holds < 80% of Q per approx");
  assert.equal(candA[id(A)].removedBy, null);
  const am = exA.prefixMatch["approx-prefix-cache-producer"];
  assert.equal(am.type, "approx-prefix-cache-producer");
  assert.equal(am.matchBlocks[id(B)], 0);
  assert.ok(am.matchBlocks[id(A)] / am.totalBlocks >= 0.8, JSON.stringify(am));

  // 7. Sent for real through the precise gateway, Q runs on B and hits its cache for the shared blocks.
  const [servedB, hitsB] = [served(B), B.server.engine.stats().prefixCacheHits];
  assert.equal((await postJson(`${precise.url}/v1/chat/completions`, chat(Q))).status, 200);
  assert.equal(served(B), servedB + 1);
  assert.equal(B.server.engine.stats().prefixCacheHits - hitsB, shared * BLOCK);

  // Subscriber health on the admin API and in /metrics.
  const eps: Json = await (await fetch(`${precise.adminUrl}/endpoints`)).json();
  for (const r of [A, B]) {
    const e = eps.endpoints.find((x: Json) => x.address === id(r));
    const k = e.kvEventsStats.precise;
    assert.equal(k.address, r.server.publisher!.endpoint);
    assert.equal(k.replayAddress, r.server.publisher!.replayEndpoint);
    assert.equal(typeof k.lastSeq, "number");
    assert.ok(k.batches > 0 && k.events > 0);
    assert.equal(k.garbage, 0);
    assert.equal(k.gaps, 0);
    assert.equal(k.resets, 0);
    assert.equal(k.indexEntries, producer.index.endpointEntries(id(r)));
  }
  const fams = parsePromText(await (await fetch(`${precise.adminUrl}/metrics`)).text()).families;
  const sample = (name: string, endpoint?: string) =>
    fams
      .get(name)
      ?.samples.find(
        (s) =>
          s.labels.plugin_name === "precise" && (endpoint === undefined || s.labels.endpoint === endpoint),
      )?.value;
  assert.ok((sample("kvgate_kv_events_events_total", id(A)) ?? 0) > 0);
  assert.ok((sample("kvgate_kv_events_batches_total", id(B)) ?? 0) > 0);
  assert.equal(sample("kvgate_kv_events_gaps_total", id(A)), 0);
  assert.equal(sample("kvgate_kv_events_resets_total", id(B)), 0);
  assert.equal(sample("kvgate_kv_events_index_entries", id(B)), producer.index.endpointEntries(id(B)));
  assert.ok((sample("kvgate_kv_events_index_bytes_per_entry") ?? 0) > 0);
  assert.ok((sample("llm_d_epp_prefix_indexer_size") ?? 0) > 0);
  assert.deepEqual(
    logs.filter((l) => /kv-events|subscriber/.test(l)),
    [],
  );
});
