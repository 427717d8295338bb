/**
 * Active-active `kvgate serve` replicas over a real NATS server (Debian's nats-server on a free
 * loopback port): prefixes routed through gateway A steer gateway B's picks; a gateway started
 * later catches up from its peers' replay logs; when NATS dies every gateway keeps serving on its
 * own view and says so in kvgate_sync_connected, and after NATS returns the state flows again.
 * Precise mode needs none of it: two precise gateways without NATS agree (last test).
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type GatewayHandle, type GatewayOptions, startGateway } from "../src/gateway/gateway.ts";
import { type NatsServer, natsSkip, startNats } from "./helpers/nats.ts";
import {
  caughtUp,
  endpointId,
  joinEvents,
  startEventReplica,
  writeEventEndpoints,
} from "./helpers/precise-fleet.ts";
import { type Json, postJson, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const EXAMPLES = fileURLToPath(new URL("../config/examples/", import.meta.url));
const APPROX = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {autoTune: false}
- type: inflight-load-producer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
`;
const prompt = (i: number) =>
  `case ${i}: ${"the quick brown fox jumps over the lazy dog ".repeat(40)} end ${i}`;

let nats: NatsServer;
let replicas: TestReplica[] = [];
const gateways: GatewayHandle[] = [];

async function gateway(seed: number, extra: Partial<GatewayOptions> = {}): Promise<GatewayHandle> {
  const g = await startGateway({
    endpoints: replicas.map(endpointId).join(","),
    config: APPROX,
    scrapeIntervalMs: 25,
    seed,
    nats: nats.url,
    natsSubject: "kvgate.sync.test",
    log: () => {},
    ...extra,
  });
  gateways.push(g);
  await waitFor(() =>
    g.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
  );
  return g;
}

const explain = async (g: GatewayHandle, p: string): Promise<string> =>
  ((await postJson(`${g.adminUrl}/explain`, { model: "m", prompt: p, max_tokens: 1 })).body as Json).picked;

async function metric(g: GatewayHandle, name: string): Promise<string> {
  const text = await (await fetch(`${g.adminUrl}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith(name))
    .join("\n");
}

/** Until every prompt's follow-up is picked on `g` where it was served (bounded staleness). */
async function agrees(g: GatewayHandle, served: string[], what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const picks = await Promise.all(served.map((_, i) => explain(g, `${prompt(i)} follow-up`)));
    if (picks.every((p, i) => p === served[i])) return;
    if (Date.now() > deadline) assert.deepEqual(picks, served, what);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function send(g: GatewayHandle, p: string): Promise<string> {
  const r = await fetch(`${g.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt: p, max_tokens: 2 }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  await r.arrayBuffer();
  return r.headers.get("x-gateway-destination-endpoint-served") as string;
}

before(async () => {
  if (natsSkip) return;
  nats = await startNats();
  replicas = await Promise.all([0, 1, 2, 3].map(() => startTestReplica({ servedModelName: "m" })));
});

after(async () => {
  await Promise.all(gateways.map((g) => g.close()));
  await Promise.all(replicas.map((r) => r.close()));
  await nats?.stop();
});

test("gateway replicas over NATS: shared picks, a late joiner catches up, NATS lost and back", {
  skip: natsSkip,
  timeout: 90_000,
}, async () => {
  const a = await gateway(1);
  const b = await gateway(2);
  await waitFor(() => a.gateway.sync!.connected && b.gateway.sync!.connected, 10_000);
  const served: string[] = [];
  for (let i = 0; i < 8; i++) served.push(await send(a, prompt(i)));
  assert.ok(new Set(served).size > 1, `a spread the prompts: ${served}`);
  await agrees(b, served, "b picks where a sent each prefix");
  assert.match(await metric(b, "kvgate_sync_connected"), /kvgate_sync_connected 1/);
  assert.match(await metric(b, "kvgate_sync_peers"), /kvgate_sync_peers 1/);
  assert.match(await metric(b, "kvgate_sync_blocks_total"), /direction="in"} [1-9]/);

  // Started after a's picks: the replay from a (and b) warms it.
  const c = await gateway(3);
  await waitFor(() => c.gateway.sync!.connected, 10_000);
  await agrees(c, served, "the late joiner picks where a sent each prefix");

  // NATS dies: requests are still served on each gateway's own view, and the metrics say so.
  await nats.stop();
  await waitFor(() => !a.gateway.sync!.connected, 15_000);
  assert.match(await metric(a, "kvgate_sync_connected"), /kvgate_sync_connected 0/);
  const during = await send(a, prompt(100));
  assert.ok(replicas.some((r) => endpointId(r) === during));
  assert.equal(await explain(a, `${prompt(100)} follow-up`), during, "a keeps learning on its own");

  // Back: a's news from the outage (buffered) and later picks reach b.
  await nats.start();
  await waitFor(() => a.gateway.sync!.connected && b.gateway.sync!.connected, 20_000);
  assert.match(await metric(a, "kvgate_sync_connected"), /kvgate_sync_connected 1/);
  const next = await send(a, prompt(200));
  const deadline = Date.now() + 10_000;
  while ((await explain(b, `${prompt(200)} follow-up`)) !== next && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 50));
  assert.equal(await explain(b, `${prompt(200)} follow-up`), next);
  assert.equal(await explain(b, `${prompt(100)} follow-up`), during, "the outage's pick arrived too");
});

test("precise mode needs no NATS: two gateways on the replicas' KV events agree", {
  timeout: 60_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-precise-pair-"));
  const rs = await Promise.all(["p0", "p1", "p2"].map((n) => startEventReplica(n, "m")));
  const file = writeEventEndpoints(dir, rs);
  const pair: GatewayHandle[] = [];
  try {
    for (const seed of [1, 2])
      pair.push(
        await startGateway({
          endpointsFile: file,
          configFile: join(EXAMPLES, "precise-prefix.yaml"),
          scrapeIntervalMs: 25,
          seed,
          log: () => {},
        }),
      );
    for (const g of pair) {
      assert.equal(g.gateway.sync, null, "no sync without --nats");
      await waitFor(() =>
        g.gateway.data.store.all().every((r) => r.state.metrics !== null && r.modelIds !== null),
      );
      await joinEvents(g, rs, "m");
    }
    // Each prompt straight to one replica: no gateway routed any of them.
    const short = (i: number) => `precise ${i}: ${"a shared system prompt for the pair test ".repeat(8)}`;
    for (let i = 0; i < 6; i++) {
      const r = rs[i % 3];
      await postJson(`${r.url}/v1/completions`, { model: "m", prompt: short(i), max_tokens: 1 });
    }
    for (const g of pair) for (const r of rs) await caughtUp(g, r);
    for (let i = 0; i < 6; i++) {
      const want = endpointId(rs[i % 3]);
      const picks = await Promise.all(
        pair.map(
          async (g) =>
            (
              (
                await postJson(`${g.adminUrl}/explain`, {
                  model: "m",
                  prompt: `${short(i)} more`,
                  max_tokens: 1,
                })
              ).body as Json
            ).picked,
        ),
      );
      assert.deepEqual(picks, [want, want], `prompt ${i}: both gateways pick the replica that holds it`);
    }
  } finally {
    await Promise.all(pair.map((g) => g.close()));
    await Promise.all(rs.map((r) => r.close()));
    rmSync(dir, { recursive: true, force: true });
  }
});
