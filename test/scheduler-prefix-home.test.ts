/**
 * prefix-home-balance-scorer and the placement of new prefixes in config/examples/precise-sim.yaml:
 * a long request no endpoint holds any of goes to the endpoint homing the fewest prefixes, whatever
 * the instantaneous load, once prompts are seen to be reused; short prompts, requests with a home
 * and traffic that reuses nothing are left to the load scorers. With maxDecodeLoadRatio (the default
 * config's), an endpoint decoding past that multiple of the mean founds nothing; with
 * kvUsageTieBreak (the default config's), the fewest-homed are ranked by scraped KV use, and with
 * skipPrefilling (the default config's) one still prefilling a cold prompt ranks below the others;
 * with stallRatio (the default config's) a document-sized one goes where few requests would stall
 * behind its prefill, one home above the fewest.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import { createXxHasher, type Hasher } from "../src/scheduler/hash.ts";
import { type InFlightInfo, inflightKey, prefixKey } from "../src/scheduler/plugins/data.ts";
import { PrefixHomeBalanceScorer, prefixHomeParams } from "../src/scheduler/plugins/scorers/prefix-home.ts";
import { createScheduler, type Scheduler } from "../src/scheduler/scheduler.ts";
import { completion, cycleFor, endpoint, prefixInfo } from "../src/scheduler/testing.ts";
import type { EndpointState } from "../src/scheduler/types.ts";

const eps = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")];

const defaultConfig = () => readFileSync(new URL("../config/examples/default.yaml", import.meta.url), "utf8");
/** A ~4,000-token prompt of its own per group. */
const long = (g: number) => `group ${g} `.repeat(2000);
/** Candidates with the KV use their last scrape showed. */
const scraped = (kv: Record<string, number>) =>
  Object.entries(kv).map(([id, k]) => endpoint(id, { kvCacheUsagePercent: k }));
/** A scheduler from `cfg` and a send(): schedule a completion and pick its target, as the gateway does. */
async function sender(cfg: string) {
  const { scheduler: s } = await createScheduler(cfg, { seed: 1 });
  const send = (id: string, text: string, cands: EndpointState[], now: number) => {
    const req = completion(id, text);
    const r = s.schedule(req, cands, now);
    s.onPicked(req, r, now);
    return { req, target: r.target?.id as string };
  };
  /** `n` short questions sent to `e` from `t` on, 10 ms apart, left in flight. */
  const questions = (e: EndpointState, n: number, t: number) => {
    for (let i = 0; i < n; i++) send(`${e.id} q${i}`, `short question ${i}`, [e], t + i * 0.01);
  };
  return { s, send, questions };
}

describe("prefix-home-balance-scorer", () => {
  const mk = (p: Record<string, unknown> = {}) =>
    new PrefixHomeBalanceScorer("h", prefixHomeParams.parse({ prefixMatchInfoProducerName: "p", ...p }));
  /** A request of `blocks` 64-token blocks, matched where `matches` says. */
  const cyc = (blocks: number, matches: Record<string, number> = {}) => {
    const x = cycleFor(completion("r", "p"), eps);
    x.set(prefixKey("p"), prefixInfo(blocks, 64, matches));
    return x;
  };
  const pick = (s: PrefixHomeBalanceScorer, blocks: number, target: EndpointState, m = {}) =>
    s.preRequest(cyc(blocks, m), { target, profiles: {} } as never);
  const scores = (s: PrefixHomeBalanceScorer, blocks: number, m = {}) =>
    Array.from(s.score(cyc(blocks, m), eps));
  type PerEndpoint = Record<string, number>;
  /** In-flight load with the given per-endpoint requests, prompt tokens waiting and context tokens. */
  const inflight = (p: {
    requests?: PerEndpoint;
    tokens?: PerEndpoint;
    context?: PerEndpoint;
  }): InFlightInfo => ({
    requests: (id) => p.requests?.[id] ?? 0,
    tokens: (id) => p.tokens?.[id] ?? 0,
    uncachedRequestTokens: () => 0,
    contextTokens: (id) => p.context?.[id] ?? 0,
  });

  it("scores (max − homes) ÷ (max − min) for a long cold request once a long request was a hit", () => {
    const s = mk();
    pick(s, 32, eps[0]);
    pick(s, 32, eps[0]);
    pick(s, 32, eps[1]);
    // No long request has matched yet: the traffic shows no reuse, so no preference.
    assert.deepEqual(scores(s, 32), [0.5, 0.5, 0.5]);
    pick(s, 32, eps[0], { "a:1": 32 });
    assert.deepEqual(
      [0, 1, 2].map((i) => s.homes(eps[i].id)),
      [2, 1, 0],
      "a hit homes nothing",
    );
    assert.deepEqual(scores(s, 32), [0, 0.5, 1]);
    // A request with a home, or a short one, is not placed by homes.
    assert.deepEqual(scores(s, 32, { "b:1": 3 }), [0.5, 0.5, 0.5]);
    assert.deepEqual(scores(s, 8), [0.5, 0.5, 0.5]);
    pick(s, 8, eps[2]);
    assert.equal(s.homes("c:1"), 0, "a short cold request homes nothing");
  });

  it("with maxDecodeLoadRatio, an endpoint decoding above that multiple of the mean founds nothing", () => {
    const s = mk({ maxDecodeLoadRatio: 2, inFlightLoadProducerName: "i" });
    pick(s, 32, eps[0]);
    pick(s, 32, eps[0]);
    pick(s, 32, eps[1]);
    pick(s, 32, eps[0], { "a:1": 32 });
    // Homes 2, 1, 0: c homes the fewest. Decode load is the context in flight plus 256 per request;
    // the endpoints not past the ratio are scored by homes among themselves, so b wins next.
    const withLoad = (context: Record<string, number>, requests: Record<string, number> = {}) => {
      const x = cyc(32);
      x.set(inflightKey("i"), inflight({ requests, context }));
      return Array.from(s.score(x, eps));
    };
    // Mean 40,000: c at 100,000 is above twice it and loses the count it would have won on.
    assert.deepEqual(withLoad({ "a:1": 10_000, "b:1": 10_000, "c:1": 100_000 }), [0, 1, 0]);
    // At exactly twice the mean it still founds (mean 30,000, c at 60,000).
    assert.deepEqual(withLoad({ "a:1": 15_000, "b:1": 15_000, "c:1": 60_000 }), [0, 0.5, 1]);
    // a past the ratio instead: b and c by homes.
    assert.deepEqual(withLoad({ "a:1": 100_000, "b:1": 10_000, "c:1": 10_000 }), [0, 0, 1]);
    // Requests count 256 tokens each: 120 requests put c past twice the mean with no context at all.
    assert.deepEqual(withLoad({}, { "a:1": 10, "b:1": 10, "c:1": 120 }), [0, 1, 0]);
    // Without the ratio, the same picks score by homes alone (no in-flight data read).
    const plain = mk();
    for (const [e, m] of [
      [0, {}],
      [0, {}],
      [1, {}],
      [0, { "a:1": 32 }],
    ] as const)
      pick(plain, 32, eps[e], m);
    assert.deepEqual(scores(plain, 32), [0, 0.5, 1]);
  });

  it("with kvUsageTieBreak, the fewest-homed are ranked by scraped KV use, below no endpoint homing more", () => {
    const s = mk({ kvUsageTieBreak: 0.5 });
    pick(s, 32, eps[0]);
    pick(s, 32, eps[0], { "a:1": 32 });
    // Homes 1, 0, 0: b and c tie on the fewest.
    const withKv = (kv: (number | null)[], list = eps) => {
      const e = list.map((x, i) =>
        endpoint(x.id, kv[i] === null ? null : { kvCacheUsagePercent: kv[i] as number }),
      );
      const x = cycleFor(completion("r", "p"), e);
      x.set(prefixKey("p"), prefixInfo(32, 64, {}));
      return Array.from(s.score(x, e));
    };
    // c uses more KV than b: b scores 1, c 1 − 0.5; a, a home more, 0 even with the least KV use.
    assert.deepEqual(withKv([0, 0.2, 0.6]), [0, 1, 0.5]);
    assert.deepEqual(withKv([0, 0.6, 0.2]), [0, 0.5, 1]);
    // Equal use (or none scraped anywhere): the tie is left to the other scorers.
    assert.deepEqual(withKv([0, 0.4, 0.4]), [0, 1, 1]);
    assert.deepEqual(withKv([null, null, null]), [0, 1, 1]);
    // An endpoint without metrics counts as the most used of the tied.
    assert.deepEqual(withKv([0, null, 0.3]), [0, 0.5, 1]);
    // Homes 2, 1, 0, 0 (a fourth endpoint): the middle one is scaled by 1 − 0.5, under every tied one.
    pick(s, 32, eps[0]);
    pick(s, 32, eps[1]);
    const four = [...eps, endpoint("d:1")];
    assert.deepEqual(withKv([0, 0, 0.9, 0.1], four), [0, 0.25, 0.5, 1]);
  });

  it("with skipPrefilling, a tied endpoint still prefilling a cold prompt's worth steps back while another is not", () => {
    const s = mk({ kvUsageTieBreak: 0.5, skipPrefilling: true, inFlightLoadProducerName: "i" });
    pick(s, 32, eps[0]);
    pick(s, 32, eps[0], { "a:1": 32 });
    // Homes 1, 0, 0: b and c tie. b uses the least KV (it just founded a prompt) but is prefilling it.
    const at = (tokens: Record<string, number>, kv: number[]) => {
      const e = eps.map((x, i) => endpoint(x.id, { kvCacheUsagePercent: kv[i] }));
      const x = cycleFor(completion("r", "p"), e);
      x.set(prefixKey("p"), prefixInfo(32, 64, {}));
      x.set(inflightKey("i"), inflight({ tokens }));
      return Array.from(s.score(x, e));
    };
    assert.deepEqual(at({ "b:1": 4000 }, [0, 0.1, 0.5]), [0, 0.5, 1], "c founds, not b");
    // Below minPromptTokens (1,024) of prefill queued, b is not held back: KV use decides.
    assert.deepEqual(at({ "b:1": 1000 }, [0, 0.1, 0.5]), [0, 1, 0.5]);
    // Every tied endpoint prefilling: KV use decides among them, as without the option.
    assert.deepEqual(at({ "b:1": 4000, "c:1": 2000 }, [0, 0.1, 0.5]), [0, 1, 0.5]);
    // Without a KV tie-break there is no tie for it to reorder: refused, saying what to set.
    assert.throws(() => mk({ skipPrefilling: true }), /set kvUsageTieBreak above 0/);
  });

  it("with stallRatio, a document-sized cold prompt founds one home above the fewest where few requests run", () => {
    const s = mk({ kvUsageTieBreak: 0.5, stallRatio: 0.5, inFlightLoadProducerName: "i" });
    for (const e of [0, 1, 2, 2]) pick(s, 32, eps[e]);
    pick(s, 32, eps[0], { "a:1": 32 });
    // Homes 1, 1, 2: a and b tie on the fewest.
    const at = (blocks: number, requests: Record<string, number>, context: Record<string, number> = {}) => {
      const e = eps.map((x, i) => endpoint(x.id, { kvCacheUsagePercent: [0.2, 0.4, 0.1][i] }));
      const x = cycleFor(completion("r", "p"), e);
      x.set(prefixKey("p"), prefixInfo(blocks, 64, {}));
      x.set(inflightKey("i"), inflight({ requests, context }));
      return Array.from(s.score(x, e));
    };
    // 16,384 tokens (256 blocks). Decode load is the context in flight plus 256 a request: the
    // fewest-homed decode 10 and 8 requests, c 4 (half of 8): c alone founds, and a and b score as
    // homing one more (0.5 × (2 − 1) ÷ (2 − 0)).
    assert.deepEqual(at(256, { "a:1": 10, "b:1": 8, "c:1": 4 }), [0.25, 0.25, 1]);
    // One request more on c, or one request decoding a 50,000-token document, or a prompt one block
    // shorter: homes and KV use decide as before.
    assert.deepEqual(at(256, { "a:1": 10, "b:1": 8, "c:1": 5 }), [1, 0.5, 0]);
    assert.deepEqual(at(256, { "a:1": 10, "b:1": 8, "c:1": 1 }, { "c:1": 50_000 }), [1, 0.5, 0]);
    assert.deepEqual(at(255, { "a:1": 10, "b:1": 8, "c:1": 4 }), [1, 0.5, 0]);
    // A fewest-homed endpoint with nothing in flight: nothing there to stall, c is not brought in.
    assert.deepEqual(at(256, { "a:1": 10, "c:1": 0 }), [1, 0.5, 0]);
    // Two homes above the fewest is too many however idle.
    pick(s, 32, eps[2]);
    assert.deepEqual(at(256, { "a:1": 10, "b:1": 8, "c:1": 0 }), [1, 0.5, 0]);
  });

  it("the default config does not found a new prompt where the prompt founded a moment ago is still prefilling", async () => {
    const text = defaultConfig();
    const run = async (cfg: string) => {
      const { s, send } = await sender(cfg);
      const [x, y, z] = [endpoint("x:1"), endpoint("y:1"), endpoint("z:1")];
      // Groups 1 and 2 home on x and y and are asked again (reuse seen); the second requests are
      // decoding, so every endpoint has one prompt's context in flight.
      for (const [id, g, e, ends] of [
        ["g1", 1, x, true],
        ["g1b", 1, x, false],
        ["g2", 2, y, true],
        ["g2b", 2, y, false],
      ] as const) {
        const { req, target } = send(id, long(g), [e], 0);
        s.onResponseStarted(req, target, 0.005);
        if (ends) s.onResponseComplete(req, target, 0.01);
      }
      // Group 3 is founded on z and has no first token yet: z is prefilling its ~4,000 tokens.
      send("g3", long(3), [z], 0.02);
      // Every endpoint homes one group; z's last scrape shows the least KV use (its one request).
      const cands = scraped({ "x:1": 0.3, "y:1": 0.32, "z:1": 0.05 });
      return send("g4", long(4), cands, 0.03).target;
    };
    assert.equal(await run(text), "x:1", "the idle endpoint using the least KV founds it");
    const without = text.replace(/\n\s*skipPrefilling: true/, "");
    assert.notEqual(without, text);
    assert.equal(await run(without), "z:1", "without it the least KV use decides, prefilling or not");
  });

  it("the default config founds a new prefix on the fewest-homed endpoint using the least KV, against its load scorers", async () => {
    const text = defaultConfig();
    const run = async (cfg: string) => {
      const { send, questions } = await sender(cfg);
      const [x, z] = [endpoint("x:1"), endpoint("z:1")];
      // Group 1 homes on z and is asked again there (reuse seen); x and y home nothing.
      send("g1", long(1), [z], 0);
      send("g1b", long(1), [z], 0.01);
      // x has three short requests in flight, y none: the in-flight scorers prefer y.
      questions(x, 3, 0.02);
      // By the last scrape x uses a little less KV than y; z, homing a group, the least of all.
      const cands = scraped({ "x:1": 0.3, "y:1": 0.32, "z:1": 0.1 });
      return send("g2", long(2), cands, 0.05).target;
    };
    assert.equal(await run(text), "x:1", "the tie goes to the lower KV use");
    const without = text
      .replace(/\n\s*kvUsageTieBreak: [0-9.]+/, "")
      .replace(/\n\s*skipPrefilling: true/, "");
    assert.notEqual(without, text);
    assert.equal(await run(without), "y:1", "without it the in-flight load decides");
  });

  it("the default config founds a document one home above the fewest where no requests would stall behind it", async () => {
    const text = defaultConfig();
    /** A ~17,000-token document of its own per group. */
    const doc = (g: number) => `group ${g} `.repeat(8500);
    const run = async (cfg: string) => {
      const { s, send, questions } = await sender(cfg);
      const [x, y, z] = [endpoint("x:1"), endpoint("y:1"), endpoint("z:1")];
      // Document 1 homes on z and is asked about again there (reuse seen); both requests end.
      for (const id of ["d1", "d1b"]) {
        const { req, target } = send(id, doc(1), [z], 0);
        s.onResponseStarted(req, target, 0.5);
        s.onResponseComplete(req, target, 1);
      }
      // x and y, homing nothing, decode short questions: three and two in flight; z runs none.
      questions(x, 3, 1.1);
      questions(y, 2, 1.2);
      const cands = scraped({ "x:1": 0.1, "y:1": 0.1, "z:1": 0.3 });
      return send("d2", doc(2), cands, 1.6).target;
    };
    assert.equal(await run(text), "z:1", "the document goes where nothing runs, a home above the fewest");
    const without = text.replace(/\n\s*stallRatio: [0-9.]+/, "");
    assert.notEqual(without, text);
    assert.notEqual(await run(without), "z:1", "without it the fewest-homed found it");
  });

  it("maxDecodeLoadRatio brings in an inflight-load producer, and must be above 1", async () => {
    const cfg = (ratio: number) => `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-home-balance-scorer
  parameters:
    maxDecodeLoadRatio: ${ratio}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-home-balance-scorer
  - pluginRef: max-score-picker
`;
    const { scheduler } = await createScheduler(cfg(2), { seed: 1 });
    assert.ok(
      [...scheduler.plugins.values()].some((p) => p.typedName.type === "inflight-load-producer"),
      "the inflight-load producer was added",
    );
    await assert.rejects(createScheduler(cfg(1), { seed: 1 }), /maxDecodeLoadRatio/);
  });

  it("forgets reuse older than reuseWindow long requests, and endpoints that left the pool", () => {
    const s = mk({ reuseWindow: 2 });
    pick(s, 32, eps[0], { "a:1": 32 });
    pick(s, 32, eps[1]);
    assert.deepEqual(scores(s, 32), [1, 0, 1]);
    pick(s, 32, eps[2]);
    assert.deepEqual(scores(s, 32), [0.5, 0.5, 0.5], "the hit fell out of the window");
    s.retainEndpoints(new Set(["a:1", "c:1"]));
    assert.equal(s.homes("b:1"), 0);
  });
});

describe("precise-sim.yaml: new prefixes dealt out evenly", () => {
  let h: Hasher;
  before(async () => {
    h = await createXxHasher();
  });
  const config = readFileSync(new URL("../config/examples/precise-sim.yaml", import.meta.url), "utf8");
  /** A prompt of `blocks` 16-token blocks, distinct per `g`. */
  const prompt = (g: number, blocks: number) =>
    Array.from({ length: 16 * blocks + 3 }, (_, i) => g * 100_000 + i);
  const send = (s: Scheduler, id: string, tokenIds: number[], cands: EndpointState[], now: number) => {
    const req = completion(id, "", { tokenIds });
    const r = s.schedule(req, cands, now);
    s.onPicked(req, r, now);
    return r.target?.id;
  };
  const loaded = [
    endpoint("a:1", { waitingQueueSize: 6, kvCacheUsagePercent: 0.7 }),
    endpoint("b:1", { waitingQueueSize: 9, kvCacheUsagePercent: 0.9 }),
    endpoint("c:1", { waitingQueueSize: 0, kvCacheUsagePercent: 0.1 }),
  ];

  it("a new prefix goes to the endpoint homing the fewest, even the most loaded, once prompts are reused", async () => {
    const { scheduler: s } = await createScheduler(config, { seed: 1, hasher: h });
    const idle = [endpoint("a:1"), endpoint("b:1"), endpoint("c:1")];
    // Groups 1 and 2 found homes on two endpoints; group 1 is asked again (reuse seen).
    const g1 = send(s, "g1", prompt(1, 80), idle, 0);
    const g2 = send(
      s,
      "g2",
      prompt(2, 80),
      idle.filter((e) => e.id !== g1),
      0.01,
    );
    assert.notEqual(g1, g2);
    assert.equal(send(s, "g1b", prompt(1, 80), idle, 0.02), g1, "g1b");
    const empty = ["a:1", "b:1", "c:1"].find((id) => id !== g1 && id !== g2) as string;
    // The endpoint homing nothing is the most loaded by what the load scorers read (queue, KV use):
    // the new group still goes there. (Not so loaded that the load scorers' 2 + 2 outweigh the
    // group's own prefix hit at 3, which would move its second request away.)
    const cands = ["a:1", "b:1", "c:1"].map((id) =>
      id === empty ? endpoint(id, { waitingQueueSize: 9, kvCacheUsagePercent: 0.3 }) : endpoint(id),
    );
    assert.equal(send(s, "g3", prompt(3, 80), cands, 0.03), empty, "g3");
    // Its second request, before any KV event, follows it (speculated cold pick).
    assert.equal(send(s, "g3b", prompt(3, 80), cands, 0.04), empty, "g3b");
    // A short new prompt (< 1,024 tokens) is left to load: not the loaded endpoint.
    assert.notEqual(send(s, "q", prompt(4, 8), cands, 0.05), empty);
  });

  it("traffic that reuses nothing is placed by load alone", async () => {
    const { scheduler: s } = await createScheduler(config, { seed: 1, hasher: h });
    const picks = new Set<string | undefined>();
    for (let g = 1; g <= 6; g++) picks.add(send(s, `u${g}`, prompt(g, 80), loaded, g));
    assert.deepEqual([...picks], ["c:1"], "every unique prompt goes to the least loaded endpoint");
  });
});
