// The behaviours kvgate's default config (config/examples/default.yaml) is built on, pinned one by
// one: KV pressure breaks a tie between replicas that both hold the prefix, a cold idle replica does
// not steal a warm request, the affinity gate's release uses each replica's learned prefill rate,
// and a new document is not founded on a replica decoding past twice the mean. Plus the estimator
// behind that rate.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import fc from "fast-check";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import type { InFlightInfo } from "../src/scheduler/plugins/data.ts";
import { PrefillRateEstimator } from "../src/scheduler/plugins/inflight/prefill-rate.ts";
import { SlotCap, SlotCaps, stalledAt } from "../src/scheduler/plugins/scorers/slot-cap.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";
import type { EndpointState, RequestFacts } from "../src/scheduler/types.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

const DEFAULT = readFileSync("config/examples/default.yaml", "utf8");
/** A long shared document: its blocks dominate every prompt below (affinity ≥ 0.8). */
const DOC = "the quarterly report says revenue grew while costs held steady. ".repeat(200);

/** Routes `req` to `only` (the sole candidate) and completes it, so the prefix index learns it. */
async function warm(
  s: Awaited<ReturnType<typeof createScheduler>>["scheduler"],
  req: RequestFacts,
  only: EndpointState,
  t: number,
  firstToken = 0.1,
) {
  const r = s.schedule(req, [only], t);
  assert.equal(r.target?.id, only.id);
  s.onPicked(req, r, t);
  s.onResponseStarted(req, only.id, t + firstToken);
  s.onResponseComplete(req, only.id, t + 2 * firstToken);
}

describe("default config", () => {
  it("a replica under KV pressure loses a tie it would have won on affinity", async () => {
    for (const [busy, calm] of [
      ["a:1", "b:1"],
      ["b:1", "a:1"],
    ]) {
      // Several seeds: without the KV signal the two warm replicas tie and the pick is a coin flip.
      for (let seed = 1; seed <= 8; seed++) {
        const { scheduler } = await createScheduler(DEFAULT, { hasher: h, seed });
        await warm(scheduler, completion("w1", `${DOC} first question?`), endpoint("a:1"), 0);
        await warm(scheduler, completion("w2", `${DOC} second question?`), endpoint("b:1"), 1);
        const pool = [
          endpoint(busy, { kvCacheUsagePercent: 0.95, updateTime: 2 }),
          endpoint(calm, { kvCacheUsagePercent: 0.3, updateTime: 2 }),
          endpoint("c:1", { kvCacheUsagePercent: 0, updateTime: 2 }),
        ];
        const r = scheduler.schedule(completion("q", `${DOC} third question?`), pool, 2);
        assert.equal(r.target?.id, calm, `seed ${seed}: busy ${busy}`);
      }
    }
  });

  it("an idle cold replica does not take a request a warm one can serve", async () => {
    const { scheduler } = await createScheduler(DEFAULT, { hasher: h, seed: 3 });
    await warm(scheduler, completion("w", `${DOC} first question?`), endpoint("a:1"), 0);
    const pool = [
      endpoint("a:1", { kvCacheUsagePercent: 0.6, runningRequestsSize: 12, updateTime: 1 }),
      endpoint("b:1", { updateTime: 1 }),
    ];
    const r = scheduler.schedule(completion("q", `${DOC} another question?`), pool, 1, { explain: true });
    assert.equal(r.target?.id, "a:1");
    const removed = r.explanation?.profiles.default.candidates.find((c) => c.id === "b:1")?.removedBy;
    assert.equal(removed, "prefix-cache-affinity-filter");
  });
});

/** Puts `req` on `on` (its only candidate) and starts its response: prefilled, now decoding. */
async function decoding(
  s: Awaited<ReturnType<typeof createScheduler>>["scheduler"],
  req: RequestFacts,
  on: EndpointState,
  t: number,
) {
  const r = s.schedule(req, [on], t);
  s.onPicked(req, r, t);
  s.onResponseStarted(req, on.id, t + 0.1);
}

describe("default config: decode load in context tokens", () => {
  /** A 50,000-character document (thousands of tokens) decoding on a, five short chats on b. */
  async function pickShort(config: string) {
    const { scheduler } = await createScheduler(config, { hasher: h, seed: 5 });
    await decoding(
      scheduler,
      completion("doc", `${"a long contract clause. ".repeat(2000)}summary?`),
      endpoint("a:1"),
      0,
    );
    for (let i = 0; i < 5; i++)
      await decoding(scheduler, completion(`s${i}`, `hello ${i}?`), endpoint("b:1"), 0);
    // Same scraped KV on both, scraped after the picks: only the gateway's in-flight view differs.
    const m = { kvCacheUsagePercent: 0.2, cacheNumBlocks: 1000, cacheBlockSize: 16, updateTime: 1 };
    const pool = [endpoint("a:1", m), endpoint("b:1", m)];
    return scheduler.schedule(completion("q", "what time is it?"), pool, 1).target?.id;
  }

  it("a short question goes to the replica with five short chats, not the one decoding a document", async () => {
    // Each decode step reads every running sequence's context: one document outweighs many chats.
    assert.equal(await pickShort(DEFAULT), "b:1");
    // Counting requests, as llm-d's active-request-scorer does, the document's replica looks idler.
    assert.equal(await pickShort(DEFAULT.replaceAll("decode-load-scorer", "active-request-scorer")), "a:1");
  });

  it("a replica's context is released when its request ends, not at the first token", async () => {
    const cfg = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: inflight-load-producer
- type: decode-load-scorer
`;
    const { scheduler } = await createScheduler(cfg, { hasher: h, seed: 1 });
    const doc = completion("doc", "x ".repeat(4000));
    await decoding(scheduler, doc, endpoint("a:1"), 0);
    const pool = [endpoint("a:1"), endpoint("b:1")];
    const before = scheduler.schedule(completion("q1", "hi"), pool, 1, { explain: true });
    assert.equal(before.target?.id, "b:1", "after its first token the document still weighs on a");
    scheduler.onResponseComplete(doc, "a:1", 2);
    // Both idle again: a tie, which either replica may win; a must win it for some seed.
    const winners = new Set<string>();
    for (let seed = 1; seed <= 8; seed++) {
      const { scheduler: s } = await createScheduler(cfg, { hasher: h, seed });
      const d = completion("doc", "x ".repeat(4000));
      await decoding(s, d, endpoint("a:1"), 0);
      s.onResponseComplete(d, "a:1", 2);
      winners.add(s.schedule(completion("q", "hi"), pool, 3).target?.id ?? "none");
    }
    assert.ok(winners.has("a:1"), `winners ${[...winners]}`);
  });
});

describe("default config: new documents are not founded on a replica decoding far above the rest", () => {
  /** A document of a few thousand tokens, distinct from its first block on. */
  const doc = (i: number, q = "summary?") => `document ${i}: ${"a long contract clause. ".repeat(400)}${q}`;
  /** Homes a 2, b 2, c 1 (c homes the fewest); c decodes one of its document's requests. */
  async function founder(config: string) {
    const { scheduler } = await createScheduler(config, { hasher: h, seed: 3 });
    const [a, b, c] = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")];
    await warm(scheduler, completion("d1", doc(1)), a, 0);
    await warm(scheduler, completion("d1b", doc(1, "risks?")), a, 1); // a hit: prompts are reused
    await warm(scheduler, completion("d2", doc(2)), a, 2);
    await warm(scheduler, completion("d3", doc(3)), b, 3);
    await warm(scheduler, completion("d4", doc(4)), b, 4);
    await warm(scheduler, completion("d5", doc(5)), c, 5);
    await decoding(scheduler, completion("d5b", doc(5, "risks?")), c, 6);
    const m = { kvCacheUsagePercent: 0.2, cacheNumBlocks: 100_000, cacheBlockSize: 16, updateTime: 7 };
    const pool = [endpoint("a:1", m), endpoint("b:1", m), endpoint("c:1", m)];
    return scheduler.schedule(completion("d6", doc(6)), pool, 7).target?.id;
  }

  it("goes to a replica homing more, when the one homing the fewest decodes past twice the mean", async () => {
    // c's decode load is all of the fleet's: three times the mean.
    assert.notEqual(await founder(DEFAULT), "c:1");
    // Without maxDecodeLoadRatio the count wins over load (prefix-home-balance-scorer weighs 12).
    const plain = DEFAULT.replace(/\n {4}maxDecodeLoadRatio: 2/, "");
    assert.notEqual(plain, DEFAULT);
    assert.equal(await founder(plain), "c:1");
  });
});

describe("default config: a prefix most requests share gets as many homes as its traffic needs", () => {
  /** `n` requests 0.1 s apart, each ending 1 s after it starts; the endpoints that served each prompt. */
  async function serve(config: string, prompt: (k: number) => string, n: number) {
    const { scheduler } = await createScheduler(config, { hasher: h, seed: 5 });
    const m = { kvCacheUsagePercent: 0.1, cacheNumBlocks: 100_000, cacheBlockSize: 16 };
    const ending: { req: RequestFacts; id: string; t: number }[] = [];
    const served = new Map<string, Set<string>>();
    for (let k = 0; k < n; k++) {
      const t = k / 10;
      while (ending.length > 0 && ending[0].t <= t) {
        const e = ending.shift() as (typeof ending)[number];
        scheduler.onResponseComplete(e.req, e.id, e.t);
      }
      const pool = ["a:1", "b:1", "c:1", "d:1"].map((id) => endpoint(id, { ...m, updateTime: t }));
      const req = completion(`q${k}`, prompt(k));
      const r = scheduler.schedule(req, pool, t);
      const id = r.target?.id as string;
      scheduler.onPicked(req, r, t);
      scheduler.onResponseStarted(req, id, t + 0.05);
      ending.push({ req, id, t: t + 1 });
      const key = prompt(k).slice(0, 40);
      served.set(key, (served.get(key) ?? new Set()).add(id));
    }
    return served;
  }
  const off = DEFAULT.replace(/\n {4}spreadHotPrefixes:\n {6}margin: 0\.5/, "");

  it("one system prompt behind every request is served by every replica, not by its first", async () => {
    const one = (k: number) => `${DOC} question ${k}: what changed in quarter ${k % 7}?`;
    assert.notEqual(off, DEFAULT);
    assert.deepEqual(
      [...(await serve(off, one, 200)).values()].map((s) => s.size),
      [1],
    );
    assert.deepEqual(
      [...(await serve(DEFAULT, one, 200)).values()].map((s) => s.size),
      [4],
    );
  });

  it("eight system prompts sharing the traffic evenly keep one home each", async () => {
    const eight = (k: number) => `system prompt ${k % 8}. ${DOC} question ${k}?`;
    const homes = await serve(DEFAULT, eight, 400);
    assert.equal(homes.size, 8);
    for (const [key, s] of homes) assert.equal(s.size, 1, key);
  });
});

describe("default config: one prefill rate for the pool in prefill-wait-scorer", () => {
  /**
   * a:1 has served only 1,000-token prompts, each first token 1 s after its pick (latency-bound: it
   * "learns" 1,000 tok/s); b:1 two 20,000-token documents at 0.5 s each (40,000 tok/s). Both are idle
   * when a new document arrives. Returns the winners over eight seeds.
   */
  async function newDocWinners(config: string) {
    const winners = new Set<string>();
    for (let seed = 1; seed <= 8; seed++) {
      const { scheduler } = await createScheduler(config, { hasher: h, seed });
      let t = 0;
      for (let i = 0; i < 40; i++) {
        const q = completion(`a${i}`, `${i} ${"abcd".repeat(1000)}`);
        scheduler.onPicked(q, scheduler.schedule(q, [endpoint("a:1")], t), t);
        scheduler.onResponseStarted(q, "a:1", (t += 1));
        scheduler.onResponseComplete(q, "a:1", t);
      }
      for (let i = 0; i < 2; i++) {
        const d = completion(`b${i}`, `${i} ${"wxyz".repeat(20000)}`);
        scheduler.onPicked(d, scheduler.schedule(d, [endpoint("b:1")], t), t);
        scheduler.onResponseStarted(d, "b:1", (t += 0.5));
        scheduler.onResponseComplete(d, "b:1", t);
      }
      const pool = [endpoint("a:1", { updateTime: t }), endpoint("b:1", { updateTime: t })];
      winners.add(
        scheduler.schedule(completion("new", `new ${"efgh".repeat(20000)}`), pool, t).target?.id ?? "none",
      );
    }
    return winners;
  }

  it("a new document may go to a replica that has only served short prompts", async () => {
    // Shared rate: both idle, equal waits, a tie either replica can win.
    assert.ok((await newDocWinners(DEFAULT)).has("a:1"));
    // Per-replica learned rates: a's latency-bound 1,000 tok/s makes it look 40× slower, every time.
    const learned = DEFAULT.replace(
      "\n    learnPrefillThroughput: false\n",
      "\n    learnPrefillThroughput: true\n",
    );
    assert.notEqual(learned, DEFAULT);
    assert.deepEqual([...(await newDocWinners(learned))], ["b:1"]);
  });
});

/** A gate config: release when the warm replica is > 1 s of prefill behind the best cold one. */
function gate(learn: boolean) {
  return `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-affinity-filter
  parameters: { maxTTFTPenaltyMs: 1000, peakPrefillThroughput: 10000, learnPrefillThroughput: ${learn} }
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
`;
}

describe("affinity gate with a learned prefill rate", () => {
  /**
   * Teaches a:1 that it prefills ~4× faster than the configured 10,000 tok/s (each cold 8k-token
   * prompt's first token comes 0.05 s after its pick), then leaves ~15k uncached tokens queued on
   * it: 1.5 s at the configured rate (release), 0.4 s at the learned one (stay).
   */
  async function run(learn: boolean, o: { wallPerSimSecond?: number; announced?: number } = {}) {
    const { scheduler } = await createScheduler(gate(learn), { hasher: h, seed: 1 });
    // A replica at --time-scale N answers in 1/N of the wall time; it announces N unless told not to.
    const a = endpoint("a:1", o.announced === undefined ? {} : { simTimeScale: o.announced });
    const firstToken = 0.2 * (o.wallPerSimSecond ?? 1);
    let t = 0;
    for (let i = 0; i < 8; i++) {
      const req = completion(`cold${i}`, `${"x".repeat(4)}${i} ${"unique words here ".repeat(1800)}`);
      const r = scheduler.schedule(req, [a], t);
      scheduler.onPicked(req, r, t);
      scheduler.onResponseStarted(req, "a:1", t + firstToken);
      scheduler.onResponseComplete(req, "a:1", t + 0.3);
      t += 1;
    }
    await warm(scheduler, completion("w", `${DOC} first question?`), a, t, firstToken / 2);
    // Two long prompts queued on a:1, no first token yet.
    for (let i = 0; i < 2; i++) {
      const req = completion(`q${i}`, `${i} ${"queued prompt text ".repeat(1500)}`);
      scheduler.onPicked(req, scheduler.schedule(req, [a], t + 1), t + 1);
    }
    const view = scheduler.endpointViews("a:1");
    const r = scheduler.schedule(completion("x", `${DOC} another question?`), [a, endpoint("b:1")], t + 1.01);
    return { target: r.target?.id, view };
  }

  it("stays sticky when the replica's learned rate says it will catch up", async () => {
    const { target, view } = await run(true);
    assert.equal(target, "a:1");
    const learned = view["inflight-load-producer"]?.learnedPrefillThroughput as number;
    assert.ok(learned > 30000 && learned < 60000, `learned ${learned}`);
    assert.equal(view["prefix-cache-affinity-filter"]?.peakPrefillThroughput, 10000);
  });

  it("learns a time-scaled simulated replica's rate in its simulated seconds", async () => {
    const rate = (v: Record<string, Record<string, unknown>>) =>
      v["inflight-load-producer"]?.learnedPrefillThroughput as number;
    const real = rate((await run(true)).view);
    // At 4x, first tokens come after 0.05 wall s: the same 0.2 simulated s, so the same rate.
    const scaled = await run(true, { wallPerSimSecond: 0.25, announced: 4 });
    assert.ok(Math.abs(rate(scaled.view) - real) / real < 1e-3, `${rate(scaled.view)} vs ${real}`);
    assert.equal(scaled.target, "a:1");
    // Read in wall seconds instead, the replica would look 4x faster than the hardware it models.
    const unannounced = await run(true, { wallPerSimSecond: 0.25 });
    assert.ok(Math.abs(rate(unannounced.view) / real - 4) < 1e-3, `${rate(unannounced.view)} vs ${real}`);
  });

  it("releases on the hand-set rate when learning is off (llm-d's behaviour)", async () => {
    const { target } = await run(false);
    assert.equal(target, "b:1");
  });
});

describe("PrefillRateEstimator", () => {
  it("divides tokens by the time each prefill had the engine to itself", () => {
    const e = new PrefillRateEstimator(1e12, 1000);
    // Two prompts picked together: the second's prefill starts when the first's ends.
    e.observe("a", 0, 0.5, 10000);
    e.observe("a", 0, 1.0, 10000);
    assert.ok(Math.abs((e.rate("a") as number) - 20000) < 1e-6);
    // An idle gap is not counted: the next prompt is picked at 5 and starts at 5.25.
    e.observe("a", 5, 5.25, 5000);
    assert.ok(Math.abs((e.rate("a") as number) - 25000 / 1.25) < 1e-6);
  });

  it("says nothing until enough tokens were seen, and forgets endpoints that left", () => {
    const e = new PrefillRateEstimator(1e6, 20000);
    e.observe("a", 0, 1, 15000);
    assert.equal(e.rate("a"), undefined);
    e.observe("a", 1, 2, 15000);
    assert.equal(e.rate("a"), 15000);
    e.retain(new Set(["b"]));
    assert.equal(e.rate("a"), undefined);
    assert.equal(e.view("a").samples, 0);
  });

  it("follows a replica that slows down, weighting recent tokens more", () => {
    const e = new PrefillRateEstimator(50000, 1000);
    let t = 0;
    for (let i = 0; i < 20; i++) e.observe("a", t, (t += 0.25), 10000); // 40k tok/s
    for (let i = 0; i < 20; i++) e.observe("a", t, (t += 1), 10000); // then 10k tok/s
    const r = e.rate("a") as number;
    assert.ok(r < 12000 && r > 10000, `rate ${r}`);
  });
});

describe("kv-pressure-scorer", () => {
  const cfg = (scorer: string) => `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: inflight-load-producer
- type: ${scorer}
`;
  /** Four ~2,000-token prompts in one scrape interval; both endpoints hold 16,000 KV tokens. */
  async function picks(scorer: string, rescrapeAt?: number) {
    const { scheduler } = await createScheduler(cfg(scorer), { hasher: h, seed: 1 });
    const out: string[] = [];
    for (let i = 0; i < 4; i++) {
      const t = 0.01 * (i + 1);
      const at = rescrapeAt !== undefined && t > rescrapeAt ? rescrapeAt : 0;
      const m = { cacheNumBlocks: 1000, cacheBlockSize: 16, updateTime: at };
      const pool = [
        endpoint("a:1", { ...m, kvCacheUsagePercent: 0.3 }),
        endpoint("b:1", { ...m, kvCacheUsagePercent: 0.32 }),
      ];
      const req = completion(`r${i}`, `${i} ${"abcd".repeat(2000)}`);
      const r = scheduler.schedule(req, pool, t);
      scheduler.onPicked(req, r, t);
      out.push(r.target?.id ?? "none");
    }
    return out;
  }

  it("counts what was sent since the scrape, so one interval's requests do not herd to its argmin", async () => {
    assert.deepEqual(await picks("kv-cache-utilization-scorer"), ["a:1", "a:1", "a:1", "a:1"]);
    assert.deepEqual(await picks("kv-pressure-scorer"), ["a:1", "b:1", "a:1", "b:1"]);
  });

  it("drops what a newer scrape already shows", async () => {
    // A scrape at 0.015 (still 0.30 / 0.32) covers the first pick: the second sees a as fresh again.
    assert.deepEqual(await picks("kv-pressure-scorer", 0.015), ["a:1", "a:1", "b:1", "a:1"]);
  });
});

describe("default config: a replica with every sequence slot taken", () => {
  /**
   * a:1 decodes four short chats, b:1 one long document (more context than a's four). a's scrapes
   * say `aRunning` running with `aWaiting` waiting; `scrapes` of them are read (one request each,
   * never picked) before the question that is checked. Returns its winners over several seeds.
   */
  async function winners(config: string, aRunning: number[], aWaiting: number) {
    const out = new Set<string>();
    for (let seed = 1; seed <= 6; seed++) {
      const { scheduler } = await createScheduler(config, { hasher: h, seed });
      await decoding(
        scheduler,
        completion("doc", `${"a long contract clause. ".repeat(400)}summary?`),
        endpoint("b:1"),
        0,
      );
      for (let i = 0; i < 4; i++)
        await decoding(scheduler, completion(`s${i}`, `hello ${i}?`), endpoint("a:1"), 0);
      const m = { cacheNumBlocks: 1000, cacheBlockSize: 16 };
      // A stepping engine's KV moves between scrapes (a frozen scrape is one long step, no evidence).
      const pool = (t: number, running: number) => [
        endpoint("a:1", {
          ...m,
          kvCacheUsagePercent: 0.2 + t / 1000,
          runningRequestsSize: running,
          waitingQueueSize: aWaiting,
          updateTime: t,
        }),
        endpoint("b:1", { ...m, kvCacheUsagePercent: 0.2, runningRequestsSize: 1, updateTime: t }),
      ];
      for (const [k, r] of aRunning.entries())
        scheduler.schedule(completion(`p${k}`, "ping?"), pool(1 + k, r), 1 + k);
      const t = 1 + aRunning.length;
      out.add(scheduler.schedule(completion("q", "what time is it?"), pool(t, 4), t).target?.id ?? "none");
    }
    return out;
  }

  it("loses to a replica with a free slot, though that one holds more context", async () => {
    // Without a sign of a full batch, the document's context makes b the busier replica.
    assert.deepEqual([...(await winners(DEFAULT, [4, 4, 4, 4, 4, 4], 0))], ["a:1"]);
    // a's scrapes show four running and two waiting, scrape after scrape: four is its cap (vLLM's
    // --max-num-seqs, which no metric exports), and a's four requests in flight fill it.
    assert.deepEqual([...(await winners(DEFAULT, [4, 4, 4, 4, 4, 4], 2))], ["b:1"]);
    // Set by hand, the cap needs no scrapes.
    const set = DEFAULT.replace(
      "- type: decode-load-scorer\n",
      "- type: decode-load-scorer\n  parameters:\n    maxNumSeqs: 4\n",
    );
    assert.notEqual(set, DEFAULT);
    assert.deepEqual([...(await winners(set, [], 0))], ["b:1"]);
  });

  it("is not read from requests waiting while the running count wanders below its highest", async () => {
    // Waiting behind a step's token budget or KV leaves the running count below its maximum: no cap.
    assert.deepEqual([...(await winners(DEFAULT, [4, 2, 3, 1, 3, 2, 3], 3))], ["a:1"]);
  });
});

describe("SlotCap", () => {
  it("is known after a plateau of scrapes with requests waiting, each scrape counted once", () => {
    const cap = new SlotCap();
    for (let t = 0; t < 4; t++) {
      cap.observe(t, 64, 3, t / 100);
      cap.observe(t, 64, 3, t / 100);
    }
    assert.equal(cap.known, undefined, "four distinct scrapes are not enough");
    cap.observe(4, 63, 5, 0.04);
    cap.observe(5, 64, 2, 0.05);
    assert.equal(cap.known, 64);
    // A higher running count later, even with KV full: the cap was wrong; it must be shown again.
    cap.observe(6, 80, 1, 0.95);
    assert.equal(cap.known, undefined);
  });

  it("is not read while KV is full: those requests wait for blocks, not slots", () => {
    const cap = new SlotCap();
    for (let t = 0; t < 20; t++) cap.observe(t, 30, 4, 0.97);
    assert.equal(cap.known, undefined);
    for (let t = 20; t < 25; t++) cap.observe(t, 30, 4, 0.5 + t / 1000);
    assert.equal(cap.known, 30);
  });

  it("ignores a request that arrived since the last step, and never learns from idle scrapes", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 200 }), fc.integer({ min: 0, max: 50 })), {
          maxLength: 60,
        }),
        (scrapes) => {
          const cap = new SlotCap();
          let max = 0;
          scrapes.forEach(([running, waiting], t) => {
            cap.observe(t, running, waiting);
            max = Math.max(max, running);
          });
          const known = cap.known;
          // Only ever the highest running count seen, and only after requests waited beyond it.
          if (known !== undefined) {
            assert.equal(known, max);
            assert.ok(scrapes.some(([r, w]) => w > 0 && r === max && r + w > max));
          }
        },
      ),
    );
    const cap = new SlotCap();
    for (let t = 0; t < 20; t++) cap.observe(t, 10, 0);
    for (let t = 20; t < 40; t++) cap.observe(t, 9, 1);
    assert.equal(cap.known, undefined, "running 9 + 1 arriving never exceeded the 10 seen");
    // At the highest count with one request waiting, scrape after scrape: each may be a request that
    // arrived since the last step (mixed-length read a cap of 17 from such a plateau, 1,024 slots).
    for (let t = 40; t < 60; t++) cap.observe(t, 10, 1);
    assert.equal(cap.known, undefined);
    for (let t = 60; t < 65; t++) cap.observe(t, 10, 2, t / 1000);
    assert.equal(cap.known, 10);
  });

  it("learns nothing from scrapes of one long step, however many", () => {
    // Qwen3-32B on scale-512: a 0.5 s prefill step froze a replica's gauges at 3 running, 2 waiting
    // for five scrapes, which read as a cap of 3 on a replica with 1,024 slots.
    const cap = new SlotCap();
    for (let t = 0; t < 50; t++) cap.observe(t, 3, 2, 0.07);
    assert.equal(cap.known, undefined);
    // The engine steps again, still at 3 with requests waiting: now it counts.
    for (let t = 50; t < 55; t++) cap.observe(t, 3, 2, 0.07 + (t - 49) / 1000);
    assert.equal(cap.known, 3);
  });
});

describe("SlotCap, with a request of the gateway's stalled there", () => {
  it("believes the plateau after two scrapes, a lone waiting request counted", () => {
    const plain = new SlotCap();
    const stalled = new SlotCap();
    // 48 running, one waiting, scrape after scrape: without a stall that may be an arrival since
    // the last step, every time.
    for (let t = 0; t < 2; t++) {
      plain.observe(t, 48, 1, t / 100);
      stalled.observe(t, 48, 1, t / 100, () => true);
    }
    assert.equal(plain.known, undefined);
    assert.equal(stalled.known, 48, "the gateway's own request has waited far longer than a step");
    // Two waiting at 48: five scrapes without a stall, two with one.
    const five = new SlotCap();
    for (let t = 0; t < 4; t++) five.observe(t, 48, 2, t / 100);
    assert.equal(five.known, undefined);
    five.observe(4, 48, 2, 0.04);
    assert.equal(five.known, 48);
  });

  it("forgets the stall once a scrape shows no request waiting", () => {
    const cap = new SlotCap();
    cap.observe(0, 40, 2, 0.01, () => true);
    // The queue drained: whatever held that request back has passed.
    cap.observe(1, 40, 0, 0.02);
    cap.observe(2, 40, 2, 0.03);
    assert.equal(cap.known, undefined, "one stalled scrape, then a drained one");
    cap.observe(3, 40, 2, 0.04, () => true);
    assert.equal(cap.known, 40, "stalled again, with two scrapes of evidence");
  });

  it("is told of a stall only when the oldest waiting request is far past its endpoint's usual start", () => {
    const load = (since: number | undefined, usual: number | undefined) =>
      ({
        requests: () => 0,
        tokens: () => 0,
        uncachedRequestTokens: () => 0,
        oldestWaitingSince: () => since,
        usualWaitToStart: () => usual,
      }) as InFlightInfo;
    assert.equal(stalledAt(load(10, 0.05), "a", 10.2), true, "0.2 s against a usual 50 ms");
    assert.equal(stalledAt(load(10, 0.05), "a", 10.12), false, "0.12 s: under three times 50 ms");
    assert.equal(stalledAt(load(10, 0.01), "a", 10.05), false, "under the 0.1 s floor");
    assert.equal(stalledAt(load(10, 1.0), "a", 12), false, "a replica that usually takes 1 s");
    assert.equal(stalledAt(load(undefined, 0.05), "a", 12), false, "nothing waiting");
    assert.equal(stalledAt(load(10, undefined), "a", 12), false, "no start seen yet");
  });
});

describe("SlotCaps", () => {
  const scrape = (id: string, t: number, running: number, waiting: number, cacheNumBlocks = 500) =>
    endpoint(id, {
      runningRequestsSize: running,
      waitingQueueSize: waiting,
      kvCacheUsagePercent: t / 100,
      updateTime: t,
      cacheNumBlocks,
    });

  it("lends a learned cap to replicas of the same shape, and takes it back when it is dropped", () => {
    const caps = new SlotCaps();
    for (let t = 0; t < 5; t++) {
      caps.read(scrape("a:1", t, 8, 3));
      caps.read(scrape("b:1", t, 3, 0));
      caps.read(scrape("c:1", t, 3, 0, 900));
    }
    assert.equal(caps.capOf("a:1"), 8);
    assert.equal(caps.capOf("b:1"), 8, "same shape, never ran more than 8: borrows a's");
    assert.equal(caps.capOf("c:1"), undefined, "another shape borrows nothing");
    assert.equal(caps.lowest, 8);
    // b runs 9: a's cap is not b's.
    caps.read(scrape("b:1", 5, 9, 0));
    assert.equal(caps.capOf("b:1"), undefined);
    // a runs 10: its cap of 8 was wrong, and nobody lends it any more.
    caps.read(scrape("a:1", 5, 10, 0));
    assert.equal(caps.capOf("a:1"), undefined);
    assert.equal(caps.lowest, undefined);
    caps.read(scrape("d:1", 5, 2, 0));
    assert.equal(caps.capOf("d:1"), undefined);
  });

  it("lends only within one pod template when the pods carry its revision label", () => {
    const caps = new SlotCaps();
    const pod = (id: string, t: number, running: number, waiting: number, hash: string) =>
      endpoint(
        id,
        {
          runningRequestsSize: running,
          waitingQueueSize: waiting,
          kvCacheUsagePercent: t / 100,
          updateTime: t,
        },
        { "pod-template-hash": hash },
      );
    for (let t = 0; t < 5; t++) {
      caps.read(pod("a:1", t, 8, 3, "5d9f"));
      caps.read(pod("b:1", t, 3, 0, "5d9f"));
      caps.read(pod("canary:1", t, 3, 0, "77c1"));
    }
    assert.equal(caps.capOf("b:1"), 8);
    assert.equal(caps.capOf("canary:1"), undefined, "another template may run other flags");
  });

  it("forgets endpoints that left the pool, with the caps they lent", () => {
    const caps = new SlotCaps();
    for (let t = 0; t < 5; t++) caps.read(scrape("a:1", t, 8, 3));
    caps.read(scrape("b:1", 0, 1, 0));
    assert.equal(caps.capOf("b:1"), 8);
    caps.retain(new Set(["b:1"]));
    assert.equal(caps.capOf("a:1"), undefined);
    assert.equal(caps.capOf("b:1"), undefined);
  });
});
