/**
 * Precise mode before any KV event has arrived: with speculativeIndexing (on in the example config) the
 * gateway's pick is recorded at once (the producer's PreRequest hook, run by the gateway after each
 * pick), so a burst of same-prefix requests lands on one replica; without it the index knows nothing.
 * Also `kvgate serve`'s startup line in precise mode, naming the default tokenizer.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { startGateway } from "../src/gateway/gateway.ts";
import { promptTokenIds } from "../src/gateway/tokenize.ts";
import type { PrecisePrefixProducer } from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { KVGATE_BIN, postJson, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const PRECISE_CONFIG = fileURLToPath(new URL("../config/examples/precise-prefix.yaml", import.meta.url));
const MODEL = "m";
const id = (r: TestReplica) => `127.0.0.1:${r.port}`;
const served = (r: TestReplica) =>
  Object.values(r.server.engine.stats().requestSuccess).reduce((a, b) => a + b, 0);

for (const speculative of [true, false]) {
  test(`speculativeIndexing ${speculative}: a same-prefix burst before any KV event`, {
    timeout: 60_000,
  }, async (t) => {
    // Replicas without KV events, and an endpoints file pointing at addresses where nothing publishes:
    // whatever the index knows comes from the gateway's own picks.
    const replicas = await Promise.all([0, 1, 2].map(() => startTestReplica({ servedModelName: MODEL })));
    for (const r of replicas) t.after(() => r.close());
    const dir = mkdtempSync(join(tmpdir(), "kvgate-precise-spec-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const epFile = join(dir, "endpoints.yaml");
    writeFileSync(
      epFile,
      replicas.map((r) => `- address: ${id(r)}\n  kvEvents: tcp://127.0.0.1:9\n`).join(""),
    );
    const cfgFile = join(dir, "epp.yaml");
    let cfg = readFileSync(PRECISE_CONFIG, "utf8").replace("speculativeTTL: 2s", "speculativeTTL: 10m");
    if (!speculative) cfg = cfg.replace("speculativeIndexing: true", "speculativeIndexing: false");
    writeFileSync(cfgFile, cfg);
    const gw = await startGateway({
      endpointsFile: epFile,
      configFile: cfgFile,
      scrapeIntervalMs: 25,
      log: () => {},
    });
    t.after(() => gw.close());
    await waitFor(() => gw.gateway.data.store.all().every((r) => r.modelIds !== null));
    const producer = gw.gateway.routing.precise[0] as PrecisePrefixProducer;
    assert.equal(producer.params.speculativeIndexing, speculative);

    const system = `Shared system prompt of the burst. ${"Follow the house style and be brief. ".repeat(30)}`;
    const body = (i: number) => ({
      model: MODEL,
      messages: [
        { role: "system", content: system },
        { role: "user", content: `burst question ${i}` },
      ],
      max_tokens: 2,
    });
    const before = replicas.map(served);
    const res = await Promise.all(
      [0, 1, 2, 3, 4, 5].map((i) => postJson(`${gw.url}/v1/chat/completions`, body(i))),
    );
    for (const r of res) assert.equal(r.status, 200, r.text);
    const counts = replicas.map((r, i) => served(r) - before[i]!);
    const ex = (await postJson(`${gw.adminUrl}/explain`, body(99))).body;
    const pm = ex.prefixMatch.precise;
    assert.ok(pm.totalBlocks > 10);
    const stats = producer.stats();
    assert.equal(stats.requests, 7);
    assert.equal(stats.requestsWithoutTokens, 0, "the gateway tokenized every request");
    if (speculative) {
      assert.deepEqual(
        counts.filter((c) => c > 0),
        [6],
        `the burst landed together: ${counts}`,
      );
      const hot = replicas[counts.indexOf(6)]!;
      assert.equal(ex.picked, id(hot));
      // What the burst recorded: the blocks request 99 shares with them (the system prompt's).
      const tok = createSimTokenizer();
      const keys = (i: number) =>
        producer.index.keyer.keys(promptTokenIds(tok, { kind: "chat", messages: body(i).messages })!, MODEL);
      const [k0, k99] = [keys(0), keys(99)];
      let shared = 0;
      while (shared < k99.length && k99[shared] === k0[shared]) shared++;
      assert.ok(shared > 10, `${shared} shared blocks`);
      assert.deepEqual(
        pm.heldBlocks,
        Object.fromEntries(replicas.map((r) => [id(r), r === hot ? shared : 0])),
      );
      assert.ok(Number(stats.speculativeAdded) > 0);
      assert.equal(stats.speculativeConfirmed, 0, "no event confirmed anything");
    } else {
      assert.deepEqual(Object.values(pm.heldBlocks), [0, 0, 0], "nothing is known without events");
      assert.equal(stats.speculativeAdded, 0);
    }
  });
}

test("kvgate serve in precise mode says which tokenizer it uses", { timeout: 60_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-precise-serve-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const epFile = join(dir, "endpoints.yaml");
  writeFileSync(epFile, "- address: 127.0.0.1:9\n  kvEvents: tcp://127.0.0.1:9\n");
  for (const [extra, re] of [
    [[], /, precise mode \(KV events for precise\), tokenizer sim \(default: no --tokenizer given;/],
    [["--tokenizer", "sim"], /, precise mode \(KV events for precise\), tokenizer sim\n$/],
  ] as const) {
    const args = ["serve", "--host", "127.0.0.1", "--port", "0", "--admin-port", "0"];
    args.push("--config", PRECISE_CONFIG, "--endpoints-file", epFile, ...extra);
    const child = spawn(process.execPath, [KVGATE_BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    t.after(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    });
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (err += d));
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    await waitFor(() => out.includes("\n") || child.exitCode !== null, 30_000);
    assert.match(out, /^kvgate serve: listening on http:\/\/127\.0\.0\.1:\d+, /, err);
    assert.match(out, re);
    child.kill("SIGTERM");
    assert.equal(await exited, 0, err);
  }
});
