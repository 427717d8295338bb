/**
 * Reloading the pools file (`kvgate serve --pools` and `kvgate epp --pools`): POST /reload and the
 * file watch swap in the new pools, an unchanged pool keeps its running Gateway, a bad file (or one
 * kvgate epp cannot honour) keeps the old pools serving and says why.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { startMultiPoolEpp } from "../src/gateway/multi-pool/epp-pools.ts";
import { type MultiPoolHandle, startMultiPool } from "../src/gateway/multi-pool/front.ts";
import { waitFor } from "./helpers/gateway-fakes.ts";
import { LOCAL_EPP } from "./helpers/local-epp.ts";
import { type Json, postJson, startTestReplica, type TestReplica } from "./helpers/replica.ts";

let alpha: TestReplica;
let beta: TestReplica;
let dir: string;
let file: string;
let h: MultiPoolHandle;
const id = (r: TestReplica) => `127.0.0.1:${r.port}`;
const poolA = () => `  - { name: pool-a, endpoints: ${id(alpha)}, models: [alpha] }\n`;
const poolB = () => `  - { name: pool-b, endpoints: ${id(beta)}, models: [beta] }\n`;

before(async () => {
  [alpha, beta] = await Promise.all([
    startTestReplica({ servedModelName: "alpha" }),
    startTestReplica({ servedModelName: "beta" }),
  ]);
  dir = mkdtempSync(join(tmpdir(), "kvgate-reload-"));
  file = join(dir, "pools.yaml");
  writeFileSync(file, `pools:\n${poolA()}`);
  h = await startMultiPool({ poolsFile: file, scrapeIntervalMs: 25, seed: 1, log: () => {} });
});

after(async () => {
  await h.close();
  await Promise.all([alpha.close(), beta.close()]);
  rmSync(dir, { recursive: true, force: true });
});

const complete = (model: string) =>
  postJson(`${h.url}/v1/completions`, { model, prompt: "hi", max_tokens: 1 });
const reload = async () => {
  const r = await fetch(`${h.adminUrl}/reload`, { method: "POST" });
  return { status: r.status, body: (await r.json()) as Json };
};

test("POST /reload adds a pool and keeps the unchanged one's gateway", { timeout: 30_000 }, async () => {
  assert.equal((await complete("beta")).status, 404);
  const gwA = h.front.set.pools.get("pool-a");
  writeFileSync(file, `pools:\n${poolA()}${poolB()}`);
  const r = await reload();
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.deepEqual(r.body, { ok: true, pools: ["pool-a", "pool-b"] });
  assert.equal(h.front.set.pools.get("pool-a"), gwA, "pool-a was reused, not rebuilt");
  const b = await complete("beta");
  assert.equal(b.status, 200, b.text);
  assert.equal((await complete("alpha")).status, 200);
});

test("a bad file keeps the old pools serving and says what is wrong", { timeout: 30_000 }, async () => {
  const before = h.front.set;
  writeFileSync(file, `pools:\n${poolA()}  - { name: pool-c }\n`);
  const r = await reload();
  assert.equal(r.status, 400);
  assert.match(r.body.error.message, /pools file not reloaded: .*give exactly one of endpoints/);
  assert.match(r.body.error.message, /the previous pools \(pool-a, pool-b\) keep serving/);
  assert.equal(h.front.set, before);
  // A pool that cannot be built (its config is missing) is refused the same way.
  writeFileSync(file, `pools:\n${poolA()}  - { name: pool-c, endpoints: 127.0.0.1:1, config: nope.yaml }\n`);
  const r2 = await reload();
  assert.equal(r2.status, 400);
  assert.match(r2.body.error.message, /pool pool-c: .*nope\.yaml/);
  assert.equal(h.front.set, before);
  assert.equal((await complete("beta")).status, 200);
  // Counted: the two POSTs, and the file watch's own reloads of the same writes.
  const metrics = await (await fetch(`${h.adminUrl}/metrics`)).text();
  assert.match(metrics, /kvgate_front_door_pools_reloads_total\{result="rejected"\} [2-9]/);
  assert.match(metrics, /kvgate_front_door_pools_reloads_total\{result="ok"\} [1-9]/);
});

test("a change to the file is picked up without a request", { timeout: 60_000 }, async () => {
  writeFileSync(file, `pools:\n${poolA()}`);
  await waitFor(() => !h.front.set.pools.has("pool-b"), "pool-b removed by the file watch", 30_000);
  const r = await complete("beta");
  assert.equal(r.status, 404);
  assert.match(r.body.error.message, /Served models: alpha;/);
});

test("kvgate epp --pools: a reload it cannot honour keeps the old pools", { timeout: 30_000 }, async () => {
  const eppFile = join(dir, "epp-pools.yaml");
  writeFileSync(eppFile, `pools:\n${poolA()}`);
  const epp = await startMultiPoolEpp({ poolsFile: eppFile, ...LOCAL_EPP, seed: 1 });
  try {
    const before = epp.live.current;
    writeFileSync(
      eppFile,
      `pools:\n${poolA()}trustedHeader: { name: x-model, selects: model, trustedSources: [10.0.0.0/8] }\n`,
    );
    const r = await epp.live.reload();
    assert.equal(r.ok, false);
    assert.match(r.ok ? "" : r.error, /trustedSources: kvgate epp does not see the client's address/);
    assert.equal(epp.live.current, before);
    writeFileSync(eppFile, `pools:\n${poolA()}${poolB()}`);
    const ok = await epp.live.reload();
    assert.deepEqual(ok, { ok: true, pools: ["pool-a", "pool-b"] });
    assert.equal(epp.live.current.pools.get("pool-a"), before.pools.get("pool-a"));
  } finally {
    await epp.close();
  }
});
