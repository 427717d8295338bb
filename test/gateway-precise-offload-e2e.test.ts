/**
 * Tiered KV end to end: two simulated vLLM replicas with a CPU offload tier (--kv-offloading-size)
 * and a small HBM pool publish real KV events, GPU and CPU; a gateway runs
 * config/examples/precise-prefix.yaml as shipped (kvCacheBackendConfigs gpu 1.0, cpu 0.8). A prefix
 * P is routed to replica A; then HBM pressure on A (traffic sent straight to A) evicts P from A's GPU
 * pool, and A's events say it is still in A's CPU tier. /explain must still pick A, with P's blocks
 * matched at the CPU weight, and the request sent through the gateway must be served by A with the
 * prefix counted in cached_tokens (loaded back from CPU, not recomputed).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { gauge } from "../src/datalayer/prom-text.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { promptTokenIds } from "../src/gateway/tokenize.ts";
import type { PrecisePrefixProducer } from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import type { ChatMessage } from "../src/scheduler/types.ts";
import {
  caughtUp,
  fillerPrompt,
  endpointId as id,
  joinEvents,
  startEventReplica,
  writeEventEndpoints,
} from "./helpers/precise-fleet.ts";
import { type Json, postJson, scrapeMetrics, type TestReplica, waitFor } from "./helpers/replica.ts";

const EXAMPLES = fileURLToPath(new URL("../config/examples/", import.meta.url));
const MODEL = "m";
const tok = createSimTokenizer();
const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);

/** The 4 GiB CPU tier keeps everything the 47-block HBM pool evicts. */
const startReplica = (name: string) =>
  startEventReplica(name, MODEL, { kvOffloadingSize: 4, kvOffloadingBackend: "native" });

let dir: string;
let R0: TestReplica;
let R1: TestReplica;
let gw: GatewayHandle;
let producer: PrecisePrefixProducer;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "kvgate-offload-e2e-"));
  [R0, R1] = await Promise.all([startReplica("r0"), startReplica("r1")]);
  gw = await startGateway({
    endpointsFile: writeEventEndpoints(dir, [R0, R1]),
    configFile: join(EXAMPLES, "precise-prefix.yaml"),
    scrapeIntervalMs: 25,
    seed: 7,
    log: () => {},
  });
  producer = gw.gateway.routing.precise[0]!;
  await waitFor(() =>
    gw.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
});

after(async () => {
  await gw?.close();
  await Promise.all([R0, R1].filter(Boolean).map((r) => r.close()));
  rmSync(dir, { recursive: true, force: true });
});

const chat = (messages: ChatMessage[]) => ({ model: MODEL, messages, max_tokens: 2 });
async function explain(body: unknown): Promise<Json> {
  const res = await postJson(`${gw.adminUrl}/explain`, body);
  assert.equal(res.status, 200, res.text);
  return res.body;
}

test("after HBM pressure evicts a prefix to CPU, precise mode still sends it to the replica that holds it in CPU", {
  timeout: 120_000,
}, async () => {
  await joinEvents(gw, [R0, R1], MODEL);

  const system = `You are the support agent of the kvgate project. ${"Answer with care, cite the relevant source file, and keep every reply short. ".repeat(22)}`;
  const P: ChatMessage[] = [
    { role: "system", content: system },
    { role: "user", content: "Why did my request land on this replica?" },
  ];
  const ids = promptTokenIds(tok, { kind: "chat", messages: P });
  assert.ok(ids);
  const keysP = producer.index.keyer.keys(ids, MODEL);

  // 1. P through the gateway lands on one replica, A; A's GPU events tell the index.
  const before1 = [R0, R1].map(served);
  assert.equal((await postJson(`${gw.url}/v1/chat/completions`, chat(P))).status, 200);
  const a = [R0, R1].findIndex((r, i) => served(r) === before1[i]! + 1);
  const [A, B] = a === 0 ? [R0, R1] : [R1, R0];
  await caughtUp(gw, A);

  // The question that shares P's system prompt, and what the index says of it per replica.
  const Q: ChatMessage[] = [P[0]!, { role: "user", content: "And which replica holds my prefix now?" }];
  const match = async () => (await explain(chat(Q))).prefixMatch.precise as Json;
  const m0 = await match();
  const shared = m0.heldBlocks[id(A)] as number;
  assert.ok(shared >= 20 && shared < keysP.length + 2, `A holds ${shared} of Q's blocks`);
  assert.equal(m0.matchBlocks[id(A)], shared, "all in HBM: weight 1 per block");
  assert.equal(m0.heldBlocks[id(B)], 0);

  // 2. HBM pressure on A, sent straight to A: P leaves A's GPU pool and stays in its CPU tier.
  let m = m0;
  for (let i = 0; i < 30 && (m.matchBlocks[id(A)] as number) > 0.8 * shared + 1e-9; i++) {
    const res = await postJson(`${A.url}/v1/completions`, {
      model: MODEL,
      prompt: fillerPrompt(i),
      max_tokens: 1,
    });
    assert.equal(res.status, 200, res.text);
    await caughtUp(gw, A);
    m = await match();
  }
  assert.equal(m.heldBlocks[id(A)], shared, "still held: the CPU copy");
  assert.ok(
    Math.abs((m.matchBlocks[id(A)] as number) - 0.8 * shared) < 1e-9,
    `every shared block now counts at the CPU weight 0.8: matched ${m.matchBlocks[id(A)]} of ${shared}`,
  );

  // 3. The pick is still A, and A serves the prefix from CPU rather than recomputing it.
  const ex = await explain(chat(Q));
  assert.equal(ex.picked, id(A));
  const hitsBefore = gauge(await scrapeMetrics(A.url), "vllm:external_prefix_cache_hits_total") ?? 0;
  const servedA = served(A);
  const res = await postJson(`${gw.url}/v1/chat/completions`, chat(Q));
  assert.equal(res.status, 200, res.text);
  assert.equal(served(A), servedA + 1, "the gateway routed Q to A");
  const cached = res.body.usage.prompt_tokens_details.cached_tokens as number;
  assert.ok(cached >= shared * 16 - 16, `cached_tokens ${cached} covers the ${shared} shared blocks`);
  const hitsAfter = gauge(await scrapeMetrics(A.url), "vllm:external_prefix_cache_hits_total") ?? 0;
  assert.ok(
    hitsAfter - hitsBefore >= shared * 16 - 16,
    `${hitsAfter - hitsBefore} tokens came from the CPU tier`,
  );
});
