/**
 * Precise mode's subscriptions follow the gateway's life: an endpoint removed from the endpoints file is
 * unsubscribed and its index entries are dropped at once; a replica restarted on the same ports (seq back
 * to 0) has its entries reset; /reload keeps an unchanged precise producer (and what its index knows) and
 * replaces a changed one, closing the old subscriber; shutdown closes them all.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { type AddressInfo, connect, createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { diffEndpoints, parseEndpointsFile } from "../src/datalayer/endpoints.ts";
import { parsePromText } from "../src/datalayer/prom-text.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { type GatewayHandle, startGateway } from "../src/gateway/gateway.ts";
import type { PrecisePrefixProducer } from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { type Json, postJson, startTestReplica, type TestReplica, waitFor } from "./helpers/replica.ts";

const PRECISE_CONFIG = fileURLToPath(new URL("../config/examples/precise-prefix.yaml", import.meta.url));
const DEFAULT_CONFIG = fileURLToPath(new URL("../config/examples/default.yaml", import.meta.url));
const MODEL = "m";
const tok = createSimTokenizer();
const id = (r: TestReplica) => `127.0.0.1:${r.port}`;
const now = () => performance.now() / 1000;

interface Ports {
  port?: number;
  replay?: string;
}

/**
 * A replica publishing KV events (PUB on an ephemeral loopback port); with `at`, its HTTP API and replay
 * socket on those exact ports (retrying while the old ones are released).
 */
async function startReplica(name: string, at: Ports = {}): Promise<TestReplica> {
  const settings = {
    servedModelName: MODEL,
    port: at.port ?? 0,
    kvEventsConfig: JSON.stringify({
      enable_kv_cache_events: true,
      publisher: "zmq",
      endpoint: "tcp://127.0.0.1:*",
      replay_endpoint: at.replay ?? "tcp://127.0.0.1:*",
      topic: `kv@${name}@${MODEL}`,
    }),
  };
  for (let attempt = 0; ; attempt++) {
    try {
      return await startTestReplica(settings);
    } catch (err) {
      if (attempt >= 50 || !/in use|EADDRINUSE/i.test(String((err as Error).message))) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * A fixed loopback address in front of a replica's PUB socket. vLLM's rule, which the sim follows,
 * binds the PUB socket only for an address with a wildcard (`tcp://*:5557`, all interfaces); a fixed
 * loopback port would make it connect out instead. So a restarted replica keeps its KV-events address
 * through this TCP relay: the gateway dials the relay, the relay dials whichever PUB port is current.
 */
async function relay(): Promise<{
  address: string;
  target: (addr: string) => void;
  close: () => Promise<void>;
}> {
  let port = 0;
  const sockets = new Set<Socket>();
  const server = createServer((down) => {
    const up = connect(port, "127.0.0.1");
    for (const s of [down, up]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => {
        sockets.delete(s);
        down.destroy();
        up.destroy();
      });
    }
    down.pipe(up);
    up.pipe(down);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    address: `tcp://127.0.0.1:${(server.address() as AddressInfo).port}`,
    target: (addr) => {
      port = Number(new URL(addr).port);
    },
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

const entry = (r: TestReplica) =>
  `- address: ${id(r)}\n  kvEvents: ${r.server.publisher!.endpoint}\n  kvEventsReplay: ${r.server.publisher!.replayEndpoint}\n`;

function setup(t: { after: (fn: () => Promise<void> | void) => void }) {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-precise-life-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return {
    epFile: join(dir, "endpoints.yaml"),
    cfgFile: join(dir, "epp.yaml"),
  };
}

const producerOf = (gw: GatewayHandle): PrecisePrefixProducer => gw.gateway.routing.precise[0]!;
const subscriberOf = (gw: GatewayHandle) => gw.gateway.kvEvents.feeds()[0]!.subscriber;
const subStats = (gw: GatewayHandle, r: TestReplica) => subscriberOf(gw).stats().endpoints[id(r)];
const keysOf = (gw: GatewayHandle, prompt: string) =>
  producerOf(gw).index.keyer.keys(tok.encode(prompt, true), MODEL);
const held = (gw: GatewayHandle, r: TestReplica, keys: BigUint64Array) =>
  producerOf(gw).index.longestPrefix(keys, [id(r)], now()).blocks[0];

async function complete(r: TestReplica | GatewayHandle, prompt: string): Promise<void> {
  const res = await postJson(`${r.url}/v1/completions`, { model: MODEL, prompt, max_tokens: 1 });
  assert.equal(res.status, 200, res.text);
}

/** Sends small prompts straight to `r` until the gateway's subscriber has seen one of its batches. */
async function joined(gw: GatewayHandle, r: TestReplica, since: number | null = null): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const s = subStats(gw, r);
    if (s && s.lastSeq !== null && s.lastSeq !== since) return;
    await complete(r, `join ${i} `.repeat(20));
    await new Promise((res) => setTimeout(res, 20));
  }
  assert.fail(`no KV events from ${id(r)}`);
}

/** Until the subscriber has applied every batch `r` has published so far. */
async function caughtUp(gw: GatewayHandle, r: TestReplica): Promise<void> {
  await waitFor(() => subStats(gw, r)?.lastSeq === r.server.publisher!.stats().nextSeq - 1);
}

async function getJson(url: string): Promise<Json> {
  const res = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  assert.equal(res.status, 200);
  return res.json();
}

const doc = (words: string) => `${words} `.repeat(40);

test("an endpoint removed from the endpoints file is unsubscribed and its entries dropped at once", {
  timeout: 60_000,
}, async (t) => {
  const { epFile } = setup(t);
  const r0 = await startReplica("r0");
  t.after(() => r0.close());
  const r1 = await startReplica("r1");
  t.after(() => r1.close());
  writeFileSync(epFile, entry(r0) + entry(r1));
  const gw = await startGateway({ endpointsFile: epFile, configFile: PRECISE_CONFIG, log: () => {} });
  t.after(() => gw.close());
  await joined(gw, r0);
  await joined(gw, r1);

  const P = doc("only the second replica has read this document");
  await complete(r1, P);
  const keysP = keysOf(gw, P);
  await waitFor(() => held(gw, r1, keysP) === keysP.length);
  const index = producerOf(gw).index;
  assert.ok(index.endpointEntries(id(r1)) >= keysP.length);

  writeFileSync(epFile, entry(r0));
  const reload = await postJson(`${gw.adminUrl}/reload`, {});
  assert.equal(reload.status, 200, reload.text);
  // At once: no entry left for it, no subscription, not in the admin API or metrics.
  assert.equal(index.endpointEntries(id(r1)), 0);
  assert.equal(held(gw, r1, keysP), 0);
  assert.deepEqual(Object.keys(subscriberOf(gw).stats().endpoints), [id(r0)]);
  const eps = await getJson(`${gw.adminUrl}/endpoints`);
  assert.deepEqual(
    eps.endpoints.map((e: Json) => e.address),
    [id(r0)],
  );
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  const fams = parsePromText(metrics).families;
  assert.deepEqual(
    fams.get("kvgate_kv_events_index_entries")?.samples.map((s) => s.labels.endpoint),
    [id(r0)],
  );
  // Its events no longer reach the index: traffic to both, r0's applied, r1's ignored.
  const Q = doc("a later document for both replicas");
  await complete(r1, Q);
  await complete(r0, Q);
  await caughtUp(gw, r0);
  const keysQ = keysOf(gw, Q);
  assert.equal(held(gw, r0, keysQ), keysQ.length);
  assert.equal(index.endpointEntries(id(r1)), 0);

  // Back in the file: subscribed again from scratch; new blocks are learnt (blocks r1 cached while it
  // was out are not: vLLM announces a block once, when stored).
  writeFileSync(epFile, entry(r0) + entry(r1));
  assert.equal((await postJson(`${gw.adminUrl}/reload`, {})).status, 200);
  await joined(gw, r1);
  const Z = doc("yet another document after the return");
  await complete(r1, Z);
  const keysZ = keysOf(gw, Z);
  await waitFor(() => held(gw, r1, keysZ) === keysZ.length);
  assert.equal(subStats(gw, r1)?.resets, 0);

  // An entry whose addresses change is resubscribed from scratch (its entries dropped, then relearnt).
  writeFileSync(epFile, `${entry(r0)}- address: ${id(r1)}\n  kvEvents: ${r1.server.publisher!.endpoint}\n`);
  assert.equal((await postJson(`${gw.adminUrl}/reload`, {})).status, 200);
  const view = gw.gateway.kvEvents.views()[0]!.endpoints[id(r1)]!;
  assert.equal(view.address, r1.server.publisher!.endpoint);
  assert.equal(view.replayAddress, "tcp://127.0.0.1:5558", "host + the example's replaySocketPort");
  assert.equal(view.lastSeq, null);
  assert.equal(index.endpointEntries(id(r1)), 0);
  await joined(gw, r1);
  const Y = doc("and one after the address change");
  await complete(r1, Y);
  const keysY = keysOf(gw, Y);
  await waitFor(() => held(gw, r1, keysY) === keysY.length);
});

test("endpoints file: kvEventsReplay is parsed, checked and part of an entry's identity", () => {
  const [a, b] = parseEndpointsFile(
    "- address: h:1\n  kvEvents: tcp://h:5557\n  kvEventsReplay: tcp://H:5558\n- h:2\n",
    "eps.yaml",
  );
  assert.equal(a!.kvEventsReplay, "tcp://h:5558");
  assert.equal("kvEventsReplay" in b!, false);
  assert.throws(
    () => parseEndpointsFile("- address: h:1\n  kvEventsReplay: h:5558\n", "eps.yaml"),
    /endpoints\[0\]\.kvEventsReplay: expected "tcp:\/\/host:port"/,
  );
  const d = diffEndpoints([a!], [{ ...a!, kvEventsReplay: "tcp://h:6000" }]);
  assert.deepEqual([d.added.length, d.removed.length, d.updated.length], [0, 0, 1]);
});

test("a replica restarted on the same ports (seq back to 0) has its entries reset", {
  timeout: 60_000,
}, async (t) => {
  const { epFile } = setup(t);
  let r = await startReplica("r0");
  t.after(() => r.close());
  const ports: Ports = { port: r.port, replay: r.server.publisher!.replayEndpoint! };
  const pub = await relay();
  t.after(() => pub.close());
  pub.target(r.server.publisher!.endpoint);
  writeFileSync(
    epFile,
    `- address: ${id(r)}\n  kvEvents: ${pub.address}\n  kvEventsReplay: ${ports.replay}\n`,
  );
  const gw = await startGateway({ endpointsFile: epFile, configFile: PRECISE_CONFIG, log: () => {} });
  t.after(() => gw.close());
  await joined(gw, r);
  const P = doc("the first engine cached this prompt");
  await complete(r, P);
  // Enough batches that the new engine's first seq cannot pass for the next one of the old engine.
  for (let i = 0; i < 40; i++) await complete(r, `old engine ${i} `.repeat(20));
  await caughtUp(gw, r);
  const keysP = keysOf(gw, P);
  assert.equal(held(gw, r, keysP), keysP.length);
  const before = { ...subStats(gw, r)! };
  assert.ok(before.lastSeq !== null && before.lastSeq >= 40, `lastSeq ${before.lastSeq}`);

  await r.close();
  r = await startReplica("r0", ports);
  pub.target(r.server.publisher!.endpoint);
  assert.equal(id(r), `127.0.0.1:${ports.port}`);
  assert.equal(r.server.publisher!.replayEndpoint, ports.replay);
  // Slowly: the SUB socket reconnects within ~100 ms; until then the new engine's batches are lost.
  for (let i = 0; i < 100 && subStats(gw, r)!.resets === before.resets; i++) {
    await complete(r, `new engine ${i} `.repeat(20));
    await new Promise((res) => setTimeout(res, 50));
  }
  const after = subStats(gw, r)!;
  assert.ok(after.resets > before.resets, JSON.stringify(after));
  assert.ok(after.restarts + after.reconnectResets > before.restarts + before.reconnectResets);
  assert.ok(after.lastSeq !== null && after.lastSeq < before.lastSeq!, "following the new engine's seq");
  assert.equal(held(gw, r, keysP), 0, "the old engine's blocks are gone");
  // The new engine's first batches went out before the SUB socket reconnected; the replay socket
  // (kvEventsReplay) gave them back, so even the first prompt it served is known.
  await caughtUp(gw, r);
  const first = keysOf(gw, "new engine 0 ".repeat(20));
  assert.equal(held(gw, r, first), first.length);
  const Q = doc("the second engine cached this one");
  await complete(r, Q);
  const keysQ = keysOf(gw, Q);
  await waitFor(() => held(gw, r, keysQ) === keysQ.length);
  assert.equal(held(gw, r, keysP), 0);
  const eps = await getJson(`${gw.adminUrl}/endpoints`);
  assert.ok(eps.endpoints[0].kvEventsStats.precise.resets > 0);
});

test("/reload keeps an unchanged precise producer with its index, replaces a changed one, and shutdown closes", {
  timeout: 60_000,
}, async (t) => {
  const { epFile, cfgFile } = setup(t);
  const r = await startReplica("r0");
  t.after(() => r.close());
  writeFileSync(epFile, entry(r));
  const text = readFileSync(PRECISE_CONFIG, "utf8");
  writeFileSync(cfgFile, text);
  const logs: string[] = [];
  const gw = await startGateway({ endpointsFile: epFile, configFile: cfgFile, log: (l) => logs.push(l) });
  let closed = false;
  t.after(() => (closed ? undefined : gw.close()));
  await joined(gw, r);
  const P = doc("cached before the reload");
  await complete(r, P);
  const keysP = keysOf(gw, P);
  await waitFor(() => held(gw, r, keysP) === keysP.length);

  // Unchanged: the same producer, index and subscriber; what it knew is still known.
  const [p0, s0] = [producerOf(gw), subscriberOf(gw)];
  const ok = await postJson(`${gw.adminUrl}/reload`, {});
  assert.equal(ok.status, 200, ok.text);
  assert.equal(producerOf(gw), p0);
  assert.equal(subscriberOf(gw), s0);
  assert.equal(held(gw, r, keysP), keysP.length);

  // Changed parameters: a new producer and subscriber; the old subscriber is closed.
  writeFileSync(cfgFile, text.replace("speculativeIndexing: true", "speculativeIndexing: false"));
  assert.equal((await postJson(`${gw.adminUrl}/reload`, {})).status, 200);
  const [p1, s1] = [producerOf(gw), subscriberOf(gw)];
  assert.notEqual(p1, p0);
  assert.notEqual(s1, s0);
  assert.equal(p1.params.speculativeIndexing, false);
  assert.deepEqual(s0.stats().endpoints, {}, "old subscriber closed");
  assert.deepEqual(Object.keys(s1.stats().endpoints), [id(r)]);
  assert.equal(gw.gateway.kvEvents.feeds().length, 1);
  await joined(gw, r);
  const Q = doc("cached after the reload");
  await complete(r, Q);
  const keysQ = keysOf(gw, Q);
  await waitFor(() => held(gw, r, keysQ) === keysQ.length);

  // No precise producer: no subscriber, no default tokenizer, no kvEventsStats.
  writeFileSync(cfgFile, readFileSync(DEFAULT_CONFIG, "utf8"));
  assert.equal((await postJson(`${gw.adminUrl}/reload`, {})).status, 200);
  assert.equal(gw.gateway.kvEvents.feeds().length, 0);
  assert.deepEqual(s1.stats().endpoints, {});
  assert.equal(gw.gateway.tokenizer, null);
  assert.equal((await getJson(`${gw.adminUrl}/endpoints`)).endpoints[0].kvEventsStats, undefined);

  // And back: subscribed and tokenizing again.
  writeFileSync(cfgFile, text);
  assert.equal((await postJson(`${gw.adminUrl}/reload`, {})).status, 200);
  assert.equal(gw.gateway.tokenizerName, "sim");
  assert.match(logs.join("\n"), /precise mode: tokenizing prompts with the sim tokenizer/);
  const s2 = subscriberOf(gw);
  assert.deepEqual(Object.keys(s2.stats().endpoints), [id(r)]);

  closed = true;
  await gw.close();
  assert.deepEqual(s2.stats().endpoints, {}, "closed on shutdown");
  assert.equal(gw.gateway.kvEvents.feeds().length, 0);
});
