/**
 * End to end, LoRA: a gateway running config/examples/lora.yaml in front of three simulated replicas
 * that all serve the adapters sql-lora and chat-lora with --max-loras 1. Replica A runs a sql-lora
 * request, B a chat-lora one (its only slot taken), C has served only the base model. Every
 * sql-lora request through the gateway lands on A — the replica with the adapter loaded — although
 * no-hit-lru alone would spread these cold prompts over all three.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import { postJson, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const EXAMPLES = fileURLToPath(new URL("../config/examples/", import.meta.url));
const id = (r: TestReplica) => `127.0.0.1:${r.port}`;
const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);

let replicas: TestReplica[] = [];
let gw: GatewayHandle;
const background: Promise<unknown>[] = [];

before(async () => {
  replicas = await Promise.all(
    [0, 1, 2].map(() =>
      startTestReplica({
        servedModelName: "base",
        // Real time: the two holding requests (7,000 tokens) then outlast the test by far even on a
        // loaded machine; at 10× they could finish mid-test and free A's slot (a flake in CI).
        timeScale: 1,
        lora: {
          enableLora: true,
          maxLoras: 1,
          loraModules: ["sql-lora=/adapters/sql", "chat-lora=/adapters/chat"],
        },
      }),
    ),
  );
  const [a, b, c] = replicas as [TestReplica, TestReplica, TestReplica];
  // Long requests straight to A and B hold their adapter slots for the whole test; C serves one
  // base-model request so it too has reported its (empty) LoRA state.
  const long = (r: TestReplica, model: string) =>
    background.push(
      postJson(`${r.url}/v1/completions`, {
        model,
        prompt: "hold",
        max_tokens: 7000,
        ignore_eos: true,
      }).catch(() => {}),
    );
  long(a, "sql-lora");
  long(b, "chat-lora");
  assert.equal(
    (await postJson(`${c.url}/v1/completions`, { model: "base", prompt: "hi", max_tokens: 1 })).status,
    200,
  );
  gw = await startGateway({
    endpoints: replicas.map(id).join(","),
    configFile: join(EXAMPLES, "lora.yaml"),
    scrapeIntervalMs: 25,
    seed: 3,
    log: () => {},
  });
  const metricsOf = (r: TestReplica) =>
    gw.gateway.data.store.all().find((e) => e.spec.id === id(r))?.state.metrics;
  await waitFor(
    () =>
      (metricsOf(a)?.activeModels ?? []).includes("sql-lora") &&
      (metricsOf(b)?.activeModels ?? []).includes("chat-lora") &&
      metricsOf(c)?.maxActiveModels === 1 &&
      gw.gateway.data.store.all().every((e) => e.modelIds?.has("sql-lora")),
    20_000,
  );
});

after(async () => {
  await gw?.close();
  await Promise.all(replicas.map((r) => r.close()));
  await Promise.all(background);
});

test("a LoRA request lands on the replica with the adapter loaded", { timeout: 60_000 }, async () => {
  const before = replicas.map(served);
  for (let i = 0; i < 8; i++) {
    // A scrape that caught the previous request queued on A would show A with a waiting request
    // until the next scrape, and queue-scorer (weight 2) outweighs the adapter's edge over a free
    // slot (4 × 0.2): this test is about adapters, so each request waits for a view without that.
    await waitFor(
      () => gw.gateway.data.store.all().every((e) => (e.state.metrics?.waitingQueueSize ?? 1) === 0),
      10_000,
    );
    const res = await postJson(`${gw.url}/v1/completions`, {
      model: "sql-lora",
      prompt: `Question ${i}: ${"list the tables of schema s".repeat(1 + i)} ${i * 7919}`,
      max_tokens: 2,
    });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.model, "sql-lora");
  }
  assert.deepEqual(
    replicas.map((r, i) => served(r) - before[i]!),
    [8, 0, 0],
    "every sql-lora request served by A",
  );
  // The adapter was never loaded anywhere else.
  assert.deepEqual(replicas[1]!.server.engine.loraState()?.resident, ["chat-lora"]);
  assert.deepEqual(replicas[2]!.server.engine.loraState()?.resident, []);
});
