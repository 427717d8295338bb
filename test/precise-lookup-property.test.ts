/** The precise index's one-walk lookup (match, longestPrefix) against simple references over seeded random
 * event streams: a plain-Map model of the events, and a per-endpoint walk over tiersOf() when speculation,
 * a small entry budget and endpoint resets are mixed in; and the producer's cached candidate resolution. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockKeyer, loadXxh64Hasher, packKeys } from "../src/kv/block-keys.ts";
import { decodeEventBatch, encodeEventBatch } from "../src/kv/event-codec.ts";
import { PreciseIndex } from "../src/kv/precise-index.ts";
import { prefixKey } from "../src/scheduler/plugins/data.ts";
import {
  type PreciseMatchInfo,
  PrecisePrefixProducer,
} from "../src/scheduler/plugins/precise-prefix-cache-producer.ts";
import { createRng, type Mulberry32 } from "../src/scheduler/rng.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import type { EndpointState } from "../src/scheduler/types.ts";
import { type Doc, StreamWorld } from "./helpers/precise-streams.ts";

const xxh = await loadXxh64Hasher();
const B = 16;
const keyer = new BlockKeyer({ hasher: xxh, blockSize: B });

/** A random candidate list: a shuffled subset of `eps`, sometimes with a repeated id or an unknown one. */
function candidates(r: Mulberry32, eps: string[]): string[] {
  const out = eps.filter(() => r.next() < 0.7);
  for (let i = out.length - 1; i > 0; i--) {
    const j = r.int(i + 1);
    [out[i], out[j]] = [out[j], out[i]];
  }
  if (out.length > 0 && r.next() < 0.3) out.splice(r.int(out.length), 0, out[r.int(out.length)]);
  if (r.next() < 0.3) out.splice(r.int(out.length + 1), 0, "nobody:1");
  return out;
}

/** Keys to look up: a whole document, a cut of one, or one diverging part-way (a changed token). */
function queryKeys(r: Mulberry32, docs: Doc[]): BigUint64Array {
  const d = docs[r.int(docs.length)];
  const x = r.next();
  if (x < 0.5) return d.keys;
  if (x < 0.75) return d.keys.subarray(0, r.int(d.keys.length + 1));
  const tokens = d.tokens.slice();
  tokens[r.int(tokens.length)] ^= 1;
  return keyer.keys(tokens, "model-x");
}

/** match() and longestPrefix() must both give `want(id)` for every candidate position. */
function check(
  ix: PreciseIndex,
  keys: BigUint64Array,
  ids: string[],
  now: number,
  want: (id: string) => { blocks: number; score: number },
  what: string,
  eps: Int32Array = ix.resolve(ids),
): number {
  const lp = ix.longestPrefix(keys, ids, now);
  const m = ix.match(packKeys(keys), eps, now);
  const got = new Map<number, [number, number]>();
  for (let i = 0; i < m.count; i++) {
    assert.ok(!got.has(m.pos[i]), `${what}: position ${m.pos[i]} reported twice`);
    assert.ok(m.blocks[i] > 0, `${what}: match() lists only candidates with a match`);
    got.set(m.pos[i], [m.blocks[i], m.scores[i]]);
  }
  let matched = 0;
  ids.forEach((id, j) => {
    const w = want(id);
    const [blocks, score] = got.get(j) ?? [0, 0];
    assert.equal(blocks, w.blocks, `${what}: match() blocks of ${id} at ${j}`);
    assert.ok(Math.abs(score - w.score) < 1e-9, `${what}: match() score of ${id} at ${j}`);
    assert.equal(lp.blocks[j], w.blocks, `${what}: longestPrefix() blocks of ${id} at ${j}`);
    assert.ok(Math.abs(lp.scores[j] - w.score) < 1e-9, `${what}: longestPrefix() score of ${id} at ${j}`);
    if (w.blocks > 0) matched++;
  });
  return matched;
}

/**
 * A candidate list resolved once and passed again (the same array) until the index's endpoints
 * change, as the producer does: match() keeps its marking of the candidates for that array.
 */
function stickyList(r: Mulberry32, eps: string[]) {
  const ids = candidates(r, eps);
  let resolved: Int32Array | null = null;
  let version = -1;
  return {
    ids,
    eps(ix: PreciseIndex): Int32Array {
      if (resolved === null || version !== ix.endpointsVersion) {
        resolved = ix.resolve(ids);
        version = ix.endpointsVersion;
      }
      return resolved;
    },
  };
}

describe("property: one-walk lookup = per-endpoint reference", () => {
  for (const seed of [1, 2, 3, 4]) {
    it(`plain-Map model of the events, 24 endpoints, random candidate lists (seed ${seed})`, () => {
      const r = createRng(seed);
      const world = new StreamWorld(keyer, () => r.next(), "model-x", { docs: 20, blocks: 24 });
      const eps = Array.from({ length: 24 }, (_, i) => `10.0.0.${i}:8000`);
      const ix = new PreciseIndex({ keyer });
      for (const ep of eps) ix.setEndpointModel(ep, "model-x");
      const sticky = stickyList(r, eps);
      let matched = 0;
      for (let i = 0; i < 400; i++) {
        const ep = eps[r.int(eps.length)];
        const bytes = encodeEventBatch(world.batch(ep, 6), i % 2 ? "map" : "array");
        for (const ev of decodeEventBatch(bytes).events) ix.applyEvent(ep, ev);
        if (i % 10 !== 9) continue;
        for (let q = 0; q < 12; q++) {
          const keys = queryKeys(r, world.docs);
          const ids = candidates(r, eps);
          matched += check(ix, keys, ids, 0, (id) => world.refLongest(id, keys), `batch ${i}`);
          const ref = (id: string) => world.refLongest(id, keys);
          check(ix, keys, sticky.ids, 0, ref, `batch ${i}, the same candidate array`, sticky.eps(ix));
        }
      }
      assert.ok(matched > 200, `the streams must produce matches to compare (${matched})`);
    });
  }

  for (const seed of [5, 6, 7]) {
    it(`with speculation, expiry, a small budget and endpoint resets: = walk over tiersOf (seed ${seed})`, () => {
      const r = createRng(seed);
      const world = new StreamWorld(keyer, () => r.next(), "model-x", { docs: 16, blocks: 20 });
      const eps = Array.from({ length: 12 }, (_, i) => `e${i}`);
      const ix = new PreciseIndex({ keyer, maxEntries: 250, tierWeights: { gpu: 1, cpu: 0.5, disk: 0 } });
      for (const ep of eps) ix.setEndpointModel(ep, "model-x");
      const weight = (tiers: string[] | null) =>
        tiers === null
          ? 0
          : Math.max(0, ...tiers.map((t) => (t === "speculative" ? 1 : ({ gpu: 1, cpu: 0.5 }[t] ?? 0))));
      const sticky = stickyList(r, eps);
      let now = 100;
      let matched = 0;
      for (let i = 0; i < 500; i++) {
        now += 0.1 + r.next() * 0.4;
        const ep = eps[r.int(eps.length)];
        const x = r.next();
        if (x < 0.2) ix.addSpeculative(ep, queryKeys(r, world.docs), now, 0.5 + r.next() * 2);
        else if (x < 0.22) {
          ix.resetEndpoint(ep);
          world.resetRef(ep);
        } else if (x < 0.23) {
          ix.removeEndpoint(ep);
          world.resetRef(ep);
          ix.setEndpointModel(ep, "model-x");
        } else {
          const bytes = encodeEventBatch(world.batch(ep, 4), "array");
          for (const ev of decodeEventBatch(bytes).events) ix.applyEvent(ep, ev);
        }
        if (i % 10 !== 9) continue;
        for (let q = 0; q < 10; q++) {
          const keys = queryKeys(r, world.docs);
          const ids = candidates(r, eps);
          const at = now + (r.next() < 0.3 ? r.next() * 2 : 0);
          const ref = (id: string) => {
            let blocks = 0;
            let score = 0;
            for (const k of keys) {
              const w = weight(ix.tiersOf(id, k, at));
              if (w <= 0) break;
              blocks++;
              score += w;
            }
            return { blocks, score };
          };
          matched += check(ix, keys, ids, at, ref, `step ${i}`);
          check(ix, keys, sticky.ids, at, ref, `step ${i}, the same candidate array`, sticky.eps(ix));
        }
      }
      const s = ix.stats();
      assert.ok(s.evictions > 0 && s.speculativeAdded > 0 && s.speculativeExpired > 0, JSON.stringify(s));
      assert.ok(matched > 100, `the streams must produce matches to compare (${matched})`);
    });
  }
});

describe("producer: cached candidate resolution", () => {
  it("sees endpoints that appear, disappear or return while the candidate list stays the same", async () => {
    const config = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  name: precise
- type: prefix-cache-scorer
  parameters: { prefixMatchInfoProducerName: precise }
- type: max-score-picker
`;
    const { scheduler } = await createScheduler(config);
    const producer = [...scheduler.plugins.values()].find(
      (p): p is PrecisePrefixProducer => p instanceof PrecisePrefixProducer,
    );
    assert.ok(producer);
    const r = createRng(9);
    const world = new StreamWorld(producer.index.keyer, () => r.next(), "m", { docs: 4, blocks: 8 });
    const doc = world.docs[0];
    const list: EndpointState[] = ["a:1", "b:1", "c:1"].map((id) => ({
      id,
      address: id.split(":")[0],
      labels: {},
      metrics: null,
    }));
    const req = {
      requestId: "q",
      model: "m",
      prompt: { kind: "completion" as const, prompt: "" },
      stream: false,
      priority: 0,
    };
    const held = (now: number) => {
      const res = scheduler.schedule({ ...req, tokenIds: doc.tokens }, list, now);
      const info = res.cycle.get(prefixKey("precise")) as PreciseMatchInfo;
      return list.map((e) => info.heldBlocks(e.id));
    };
    const full = doc.keys.length;
    const store = (id: string, blocks: number) => {
      producer.index.setEndpointModel(id, "m");
      producer.index.applyEvent(id, world.storedRun(id, doc, 0, blocks));
    };
    assert.deepEqual(held(1), [0, 0, 0], "no endpoint known yet");
    store("b:1", full);
    assert.deepEqual(held(2), [0, full, 0], "an endpoint the index learns after the first lookup");
    store("a:1", 3);
    assert.deepEqual(held(3), [3, full, 0]);
    producer.index.removeEndpoint("b:1");
    store("c:1", 2);
    assert.deepEqual(held(4), [3, 0, 2], "a removed endpoint's number is reused by another");
    store("b:1", 1);
    assert.deepEqual(held(5), [3, 1, 2], "and the removed one comes back under a new number");
    list.reverse();
    assert.deepEqual(held(6), [2, 1, 3], "a reordered list of the same endpoints");
  });
});
