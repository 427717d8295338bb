/**
 * The routing-state merge between gateway replicas (src/scheduler/sync.ts) and its wire codec:
 * what one gateway's picks teach it reaches a peer's scheduler (prefix insertions, in-flight load,
 * prefix-home counts, session bindings), stale or foreign batches are not merged, a silent peer's load
 * and counts expire, a late joiner catches up from the replay log, and garbled frames are refused.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import fc from "fast-check";
import { decodeBatch, encodeBatch } from "../src/gateway/sync/codec.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { InflightLoadProducer } from "../src/scheduler/plugins/inflight/producer.ts";
import { PrefixHomeBalanceScorer } from "../src/scheduler/plugins/scorers/prefix-home.ts";
import { createScheduler, type Scheduler } from "../src/scheduler/scheduler.ts";
import { GatewaySync, type SyncBatch } from "../src/scheduler/sync.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import type { RequestFacts } from "../src/scheduler/types.ts";

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

const SESSIONS = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
  parameters: {strategy: session_id}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
  - pluginRef: max-score-picker
`;

const eps = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"].map((id) => endpoint(id));
/** A prompt of ~16 index blocks (64 pseudo-tokens of 4 bytes each per block), distinct per i. */
const prompt = (i: number) => `document ${i}: ${"lorem ipsum dolor sit amet ".repeat(150)} question ${i}`;

async function pair(config: string): Promise<[Scheduler, Scheduler]> {
  const a = (await createScheduler(config, { seed: 1 })).scheduler;
  const b = (await createScheduler(config, { seed: 2 })).scheduler;
  return [a, b];
}

function pick(s: Scheduler, req: RequestFacts, now = 0): string {
  const r = s.schedule(req, eps, now);
  assert.ok(r.target, "a target");
  s.onPicked(req, r, now);
  return r.target.id;
}

function inflight(s: Scheduler): InflightLoadProducer {
  for (const p of s.plugins.values()) if (p instanceof InflightLoadProducer) return p;
  throw new Error("no inflight producer");
}

test("a peer's prefix insertions steer this gateway to the replica that holds the prefix", async () => {
  const [a, b] = await pair(APPROX);
  // A control gateway that never hears from a (its own tie-break seed).
  const c = (await createScheduler(APPROX, { seed: 7 })).scheduler;
  const sa = new GatewaySync(a, { origin: "a", config: "x" });
  const sb = new GatewaySync(b, { origin: "b", config: "x" });
  const fromA: string[] = [];
  // Spread a's picks: each prompt lands where a's scorer ties break.
  for (let i = 0; i < 24; i++) fromA.push(pick(a, completion(`a${i}`, prompt(i))));
  assert.ok(new Set(fromA).size > 1, "a's picks cover several endpoints");
  const batch = sa.take(1);
  assert.equal(batch.prefix.length, 24);
  assert.ok(sb.apply(batch, 1.001));
  let agree = 0;
  let control = 0;
  for (let i = 0; i < 24; i++) {
    if (pick(b, completion(`b${i}`, `${prompt(i)} and a follow-up`)) === fromA[i]) agree++;
    if (pick(c, completion(`c${i}`, `${prompt(i)} and a follow-up`)) === fromA[i]) control++;
  }
  assert.equal(agree, 24, "every follow-up goes where the peer sent its prefix");
  assert.ok(control < 24, `without sync the control gateway agreed on ${control}/24 only by chance`);
  assert.equal(
    sb.stats.blocksIn,
    batch.prefix.reduce((n, p) => n + p.h.length / 2, 0),
  );
});

test("in-flight load: a peer's own load counts here until it reports it done or falls silent", async () => {
  const [a, b] = await pair(APPROX);
  const sa = new GatewaySync(a, { origin: "a", config: "x", staleAfterSeconds: 5 });
  const sb = new GatewaySync(b, { origin: "b", config: "x", staleAfterSeconds: 5 });
  const req = completion("r1", prompt(1));
  const target = pick(a, req);
  sb.apply(sa.take(0), 0);
  assert.equal(inflight(b).load(target).requests, 1, "the peer's request is in flight here");
  assert.ok(inflight(b).load(target).tokens > 0);
  // b's own load is not echoed back as its own: its batch reports only b's requests.
  const own = pick(b, completion("r2", prompt(2)));
  const fromB = sb.take(0.01);
  const rows = Object.values(fromB.load ?? {})[0];
  assert.deepEqual(
    rows.map((r) => [r[0], r[1]]),
    [[own, 1]],
  );
  a.onResponseComplete(req, target, 0.5);
  sb.apply(sa.take(0.5), 0.5);
  assert.equal(inflight(b).load(target).requests, target === own ? 1 : 0, "done at the peer, gone here");
  // The peer picks again, then dies without a word: its load stops counting after the bound.
  const t2 = pick(a, completion("r3", prompt(3)));
  sb.apply(sa.take(1), 1);
  const before = inflight(b).load(t2).requests;
  assert.deepEqual(sb.expire(5.9), [], "not stale yet");
  assert.deepEqual(sb.expire(6.1), ["a"]);
  assert.equal(inflight(b).load(t2).requests, before - 1);
  assert.equal(sb.snapshot().peersExpired, 1);
});

const HOMES = `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters: {autoTune: false}
- type: prefix-cache-scorer
- type: prefix-home-balance-scorer
  parameters: {minPromptTokens: 64}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: prefix-home-balance-scorer
  - pluginRef: max-score-picker
`;

function homes(s: Scheduler): PrefixHomeBalanceScorer {
  for (const p of s.plugins.values()) if (p instanceof PrefixHomeBalanceScorer) return p;
  throw new Error("no prefix-home-balance-scorer");
}

test("prefix homes: new prefixes are dealt out over what every synced gateway founded", async () => {
  const [a, b] = await pair(HOMES);
  const sa = new GatewaySync(a, { origin: "a", config: "x", staleAfterSeconds: 5 });
  const sb = new GatewaySync(b, { origin: "b", config: "x", staleAfterSeconds: 5 });
  const ids = eps.map((e) => e.id);
  // a founds a prefix and hits it (reuse seen), then founds two more on endpoints homing none.
  const x = pick(a, completion("w1", prompt(100)));
  assert.equal(pick(a, completion("w2", prompt(100))), x);
  const byA = [x, pick(a, completion("a1", prompt(1))), pick(a, completion("a2", prompt(2)))];
  assert.equal(new Set(byA).size, 3);
  const r = ids.find((id) => !byA.includes(id)) as string;
  assert.ok(sa.hasNews(), "new counts are news");
  const batch = decodeBatch(encodeBatch(sa.take(1)));
  assert.deepEqual(batch.homes, { "prefix-home-balance-scorer": byA.map((id) => [id, 1]) });
  assert.deepEqual(
    ids.map((id) => homes(b).homes(id)),
    [0, 0, 0, 0],
    "before the batch b knows of no home",
  );
  sb.apply(batch, 1);
  // b sees the reused prefix through a's insertions (a hit founds nothing), then founds a new one:
  // it goes to the one endpoint no gateway homed a prefix on.
  assert.equal(pick(b, completion("b0", prompt(100)), 1.1), x);
  assert.equal(pick(b, completion("b1", prompt(50)), 1.2), r);
  assert.deepEqual(
    ids.map((id) => homes(b).homes(id)),
    ids.map(() => 1),
  );
  // b's batch reports only its own found, not a's echoed back.
  assert.deepEqual(sb.take(1.3).homes, { "prefix-home-balance-scorer": [[r, 1]] });
  // a founds again (on r, its fewest): its next batch replaces its counts on b, not adds to them.
  assert.equal(pick(a, completion("a3", prompt(3)), 1.4), r);
  sb.apply(sa.take(2), 2);
  assert.deepEqual(
    ids.map((id) => homes(b).homes(id)),
    ids.map((id) => (id === r ? 2 : 1)),
  );
  // a falls silent: only b's own found counts.
  assert.deepEqual(sb.expire(7.5), ["a"]);
  assert.deepEqual(
    ids.map((id) => homes(b).homes(id)),
    ids.map((id) => (id === r ? 1 : 0)),
  );
});

test("precise: a peer's speculative entry steers a new prefix's next request before any KV event", async () => {
  const hasher = await createXxHasher();
  const config = readFileSync(new URL("../config/examples/precise-sim.yaml", import.meta.url), "utf8");
  const mk = async (seed: number) => (await createScheduler(config, { seed, hasher })).scheduler;
  const [a, b, control] = [await mk(1), await mk(2), await mk(3)];
  const sa = new GatewaySync(a, { origin: "a", config: "x" });
  const sb = new GatewaySync(b, { origin: "b", config: "x" });
  /** A prompt of 80 16-token blocks, distinct per g. */
  const tokens = (g: number) => Array.from({ length: 16 * 80 + 3 }, (_, i) => g * 100_000 + i);
  const req = (id: string, g: number) => completion(id, "", { tokenIds: tokens(g) });
  const byA = [1, 2, 3, 4, 5, 6, 7, 8].map((g) => pick(a, req(`a${g}`, g), g / 100));
  const batch = decodeBatch(encodeBatch(sa.take(0.1)));
  assert.deepEqual(
    batch.speculative?.map((x) => [x.p, x.e, x.t, x.h.length]),
    byA.map((e) => ["precise-prefix-cache-producer", e, 2, 160]),
  );
  sb.apply(batch, 0.1);
  let agree = 0;
  let chance = 0;
  for (let g = 1; g <= 8; g++) {
    if (pick(b, req(`b${g}`, g), 0.2) === byA[g - 1]) agree++;
    if (pick(control, req(`c${g}`, g), 0.2) === byA[g - 1]) chance++;
  }
  assert.equal(agree, 8, "each second request follows its prefix to the peer's pick");
  assert.ok(chance < 8, `without sync the control agreed on ${chance}/8 only by chance`);
  // Entries are sent within what the insertions leave of maxBlocks; the rest wait.
  for (let g = 11; g <= 13; g++) pick(a, req(`a${g}`, g), 1);
  assert.equal(sa.take(1, 100).speculative?.length, 1);
  assert.equal(sa.take(1, 200).speculative?.length, 2);
  assert.equal(sa.take(1).speculative, undefined, "nothing left");
});

test("stale, duplicate and foreign batches are not merged; gaps are counted; a restarted peer is heard again", async () => {
  const [a, b] = await pair(APPROX);
  const sa = new GatewaySync(a, { origin: "a", config: "x" });
  const sb = new GatewaySync(b, { origin: "b", config: "x" });
  const b1 = sa.take(0);
  const b2 = sa.take(0);
  const b3 = sa.take(0);
  assert.ok(sb.apply(b1, 0));
  assert.ok(sb.apply(b3, 0));
  assert.equal(sb.stats.gaps, 1, "b2 missed");
  assert.equal(sb.apply(b2, 0), false, "older than the last merged");
  assert.equal(sb.apply(b3, 0), false, "duplicate");
  assert.equal(sb.apply({ ...b3, seq: 9, config: "other" }, 0), false, "another routing config");
  assert.equal(sb.apply({ ...b3, origin: "b", seq: 10 }, 0), false, "its own echo");
  assert.equal(sb.stats.batchesDropped, 3, "the echo is ignored, not counted");
  // The peer restarts: its sequence begins again at 1 and is merged.
  const restarted = new GatewaySync((await pair(APPROX))[0], { origin: "a", config: "x" });
  assert.ok(sb.apply(restarted.take(0), 0));
});

test("a late joiner catches up from its peers' replay logs", async () => {
  const [a, b] = await pair(APPROX);
  const sa = new GatewaySync(a, { origin: "a", config: "x" });
  const targets: string[] = [];
  for (let i = 0; i < 10; i++) {
    targets.push(pick(a, completion(`a${i}`, prompt(i))));
    sa.take(i); // published while b did not exist yet
  }
  const sb = new GatewaySync(b, { origin: "b", config: "x" });
  for (const batch of sa.replay()) {
    assert.equal(batch.load, undefined, "load is never replayed");
    assert.ok(sb.apply(decodeBatch(encodeBatch(batch)), 20, true));
  }
  for (let i = 0; i < 10; i++) assert.equal(pick(b, completion(`b${i}`, prompt(i))), targets[i]);
});

test("session_id bindings made by one gateway pin the session on its peer", async () => {
  const [a, b] = await pair(SESSIONS);
  const sa = new GatewaySync(a, { origin: "a", config: "x" });
  const sb = new GatewaySync(b, { origin: "b", config: "x" });
  const bound = new Map<string, string>();
  for (let i = 0; i < 8; i++) bound.set(`s${i}`, pick(a, completion(`a${i}`, "hi", { sessionId: `s${i}` })));
  assert.equal(new Set(bound.values()).size, 4, "a spreads new sessions over the four endpoints");
  assert.ok(sb.apply(sa.take(0), 0));
  for (const [sid, ep] of bound)
    assert.equal(pick(b, completion(`b-${sid}`, "again", { sessionId: sid })), ep);
});

test("the outgoing buffer is bounded: the oldest insertions go first and are counted", async () => {
  const [a] = await pair(APPROX);
  const sa = new GatewaySync(a, { origin: "a", config: "x", maxPendingBlocks: 40 });
  for (let i = 0; i < 10; i++) pick(a, completion(`a${i}`, prompt(i)));
  assert.ok(sa.stats.blocksDroppedOut > 0, "some insertions were dropped");
  assert.ok(sa.pendingBlocks <= 40);
  const first = sa.take(0, 20);
  assert.equal(first.prefix.length >= 1, true);
  assert.ok(sa.pendingBlocks <= 40 - first.prefix.reduce((n, p) => n + p.h.length / 2, 0));
});

const arbBatch: fc.Arbitrary<SyncBatch> = fc.record({
  origin: fc.stringMatching(/^[\w.-]{1,20}$/),
  seq: fc.integer({ min: 1, max: 1e9 }),
  at: fc.double({ min: 0, max: 2e9, noNaN: true }),
  config: fc.stringMatching(/^[0-9a-f]{16}$/),
  prefix: fc.array(
    fc.record({
      p: fc.constantFrom("approx-prefix-cache-producer", "gpu"),
      e: fc.constantFrom("10.0.0.1:8000", "[::1]:8001"),
      c: fc.integer({ min: 1, max: 1e6 }),
      h: fc
        .array(fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }), { maxLength: 40 })
        .map((a) => (a.length % 2 === 0 ? a : a.slice(1))),
    }),
    { maxLength: 5 },
  ),
  sessions: fc.array(
    fc.record({ p: fc.constant("s"), s: fc.string({ minLength: 1, maxLength: 8 }), e: fc.constant("e:1") }),
    {
      maxLength: 3,
    },
  ),
  load: fc.dictionary(
    fc.constantFrom("inflight-load-producer"),
    fc.array(fc.tuple(fc.constant("e:1"), fc.nat(100), fc.nat(1e6))),
  ),
  speculative: fc.array(
    fc.record({
      p: fc.constant("precise-prefix-cache-producer"),
      e: fc.constantFrom("10.0.0.1:8000", "[::1]:8001"),
      t: fc.double({ min: 0, max: 60, noNaN: true }),
      h: fc
        .array(fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }), { maxLength: 40 })
        .map((a) => (a.length % 2 === 0 ? a : a.slice(1))),
    }),
    { maxLength: 3 },
  ),
  homes: fc.dictionary(
    fc.constantFrom("prefix-home-balance-scorer"),
    fc.array(fc.tuple(fc.constantFrom("e:1", "10.0.0.2:8000"), fc.nat(1e5))),
  ),
});

test("codec: a batch survives the wire unchanged; garbled frames are refused with an Error", () => {
  fc.assert(
    fc.property(arbBatch, (b) => {
      assert.deepEqual(decodeBatch(encodeBatch(b)), JSON.parse(JSON.stringify(b)));
    }),
    { seed: 16, numRuns: 200 },
  );
  // decodeBatch's own refusals (src/gateway/sync/codec.ts), each a plain Error: anything else (a
  // TypeError from an unchecked field, say) is a crash the checks missed.
  const REFUSAL = new RegExp(
    `^(${[
      "not JSON",
      "not an object",
      "wire version .*, expected 1",
      "origin and config must be strings",
      "bad seq or at",
      "prefix and sessions must be arrays",
      "bad prefix insert",
      "hash chain is not a whole number of 64-bit blocks",
      "bad session binding",
      "bad load",
      "bad load rows",
      "bad load row",
      "speculative must be an array",
      "bad speculative entry",
      "bad homes",
      "bad homes rows",
      "bad homes row",
    ].join("|")})$`,
  );
  let refused = 0;
  fc.assert(
    fc.property(arbBatch, fc.nat(), fc.integer({ min: 0, max: 255 }), (b, at, byte) => {
      const bytes = Buffer.from(encodeBatch(b));
      bytes[at % bytes.length] = byte;
      let decoded: SyncBatch;
      try {
        decoded = decodeBatch(bytes);
      } catch (err) {
        assert.ok(err instanceof Error && Object.getPrototypeOf(err) === Error.prototype, String(err));
        assert.match(err.message, REFUSAL);
        refused++;
        return;
      }
      // Accepted (the byte was left as it was, or changed a value to another valid one): what was
      // accepted is a well-formed batch, so it survives the wire as the unchanged ones above do.
      assert.deepEqual(decodeBatch(encodeBatch(decoded)), JSON.parse(JSON.stringify(decoded)));
    }),
    { seed: 17, numRuns: 300 },
  );
  // Most single-byte changes break the JSON or a checked field; if none were refused, the check
  // above never ran.
  assert.ok(refused > 0, "no garbled frame was refused");
  assert.throws(() => decodeBatch(Buffer.from("{}")), /wire version/);
  assert.throws(() => decodeBatch(Buffer.from("\u0000garbage")), /not JSON/);
  const wire = (homes: unknown) =>
    Buffer.from(
      JSON.stringify({ v: 1, origin: "a", seq: 1, at: 0, config: "x", prefix: [], sessions: [], homes }),
    );
  assert.throws(() => decodeBatch(wire({ h: [["e:1", 1.5]] })), /bad homes row/);
  assert.throws(() => decodeBatch(wire({ h: [["e:1", -1]] })), /bad homes row/);
  assert.throws(() => decodeBatch(wire({ h: "x" })), /bad homes rows/);
  assert.throws(() => decodeBatch(wire(null)), /bad homes/);
  assert.equal(decodeBatch(wire(undefined)).homes, undefined, "a peer without the scorer sends none");
  const spec = (speculative: unknown) =>
    Buffer.from(
      JSON.stringify({
        v: 1,
        origin: "a",
        seq: 1,
        at: 0,
        config: "x",
        prefix: [],
        sessions: [],
        speculative,
      }),
    );
  assert.throws(() => decodeBatch(spec({})), /speculative must be an array/);
  assert.throws(() => decodeBatch(spec([{ p: "x", e: "e:1", t: -1, h: "" }])), /bad speculative entry/);
  assert.throws(() => decodeBatch(spec([{ p: "x", e: "e:1", t: 2, h: "AAAA" }])), /whole number/);
});
