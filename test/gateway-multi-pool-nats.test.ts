/**
 * `kvgate serve --pools` with `--nats`: two multi-pool front doors over a real NATS server (Debian's
 * nats-server on a free loopback port) share each pool's routing state, pool by pool — prefixes
 * routed through front door A steer front door B's picks in the same pool, and only there.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { type MultiPoolHandle, startMultiPool } from "../src/gateway/multi-pool/front.ts";
import { parsePoolsFile } from "../src/gateway/multi-pool/pools-file.ts";
import { type NatsServer, natsSkip, startNats } from "./helpers/nats.ts";
import {
  type Json,
  postJson,
  replicaId,
  startTestReplica,
  type TestReplica,
  waitFor,
} from "./helpers/replica.ts";

let nats: NatsServer;
let poolA: TestReplica[] = [];
let poolB: TestReplica[] = [];
const fronts: MultiPoolHandle[] = [];
const prompt = (i: number) =>
  `pool case ${i}: ${"the quick brown fox jumps over the lazy dog ".repeat(40)} end ${i}`;

async function front(seed: number): Promise<MultiPoolHandle> {
  const text = `pools:
  - { name: pool-a, endpoints: [${poolA.map(replicaId).join(", ")}], models: [alpha] }
  - { name: pool-b, endpoints: [${poolB.map(replicaId).join(", ")}], models: [beta] }
`;
  const h = await startMultiPool({
    poolsSpec: parsePoolsFile(text, "pools.yaml", "."),
    scrapeIntervalMs: 25,
    seed,
    nats: nats.url,
    natsSubject: "kvgate.sync.mp",
    log: () => {},
  });
  fronts.push(h);
  return h;
}

before(async () => {
  if (natsSkip) return;
  nats = await startNats();
  poolA = await Promise.all([0, 1, 2].map(() => startTestReplica({ servedModelName: "alpha" })));
  poolB = await Promise.all([0, 1, 2].map(() => startTestReplica({ servedModelName: "beta" })));
});
after(async () => {
  await Promise.all(fronts.map((f) => f.close()));
  await Promise.all([...poolA, ...poolB].map((r) => r.close()));
  await nats?.stop();
});

async function send(h: MultiPoolHandle, model: string, p: string): Promise<string> {
  const r = await fetch(`${h.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: p, max_tokens: 2 }),
  });
  assert.equal(r.status, 200, await r.clone().text());
  await r.arrayBuffer();
  return r.headers.get("x-gateway-destination-endpoint-served") as string;
}

const explain = async (h: MultiPoolHandle, pool: string, model: string, p: string) =>
  ((await postJson(`${h.adminUrl}/pools/${pool}/explain`, { model, prompt: p, max_tokens: 1 })).body as Json)
    .picked as string;

test("two --pools front doors over NATS share each pool's prefixes", {
  skip: natsSkip,
  timeout: 60_000,
}, async () => {
  const a = await front(1);
  const b = await front(2);
  const gateways = [...fronts.flatMap((f) => [...f.front.pools.values()])];
  await waitFor(() => gateways.every((g) => g.sync?.connected === true), 10_000);
  const served: string[] = [];
  for (let i = 0; i < 6; i++) served.push(await send(a, "alpha", prompt(i)));
  assert.ok(new Set(served).size > 1, `front door a spread the prompts: ${served}`);
  const deadline = Date.now() + 10_000;
  for (;;) {
    const picks = await Promise.all(served.map((_, i) => explain(b, "pool-a", "alpha", `${prompt(i)} more`)));
    if (picks.every((p, i) => p === served[i])) break;
    if (Date.now() > deadline) assert.deepEqual(picks, served, "b's pool-a picks where a sent each prefix");
    await new Promise((r) => setTimeout(r, 50));
  }
  // Pools never share routing state: pool-b's gateways learned nothing from pool-a's traffic.
  for (const f of fronts) {
    const sync = f.front.pools.get("pool-b")?.sync;
    assert.ok(sync, "pool-b syncs too");
    assert.equal(sync.sync.stats.blocksIn, 0, "pool-b received no prefix blocks");
  }
});
