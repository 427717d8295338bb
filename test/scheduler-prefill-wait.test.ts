// prefill-wait-scorer, and the decision it makes beside the default config's other scorers: a request
// goes where its prefill starts soonest, so a short question does not queue behind another request's long prompt on
// a replica that merely has fewer requests in flight; and, being relative, the score still separates
// replicas when every queue is long.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { before, describe, it } from "node:test";
import type { Hasher } from "../src/scheduler/hash.ts";
import { createXxHasher } from "../src/scheduler/hash.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { completion, endpoint } from "../src/scheduler/testing.ts";

let h: Hasher;
before(async () => {
  h = await createXxHasher();
});

/**
 * The default config (config/examples/default.yaml, which has prefill-wait-scorer) with llm-d's
 * active-request-scorer in decode-load-scorer's place: the replica prefilling a document then has
 * the fewest requests, so only the prefill wait can send a short question elsewhere.
 */
const WITH_WAIT = readFileSync("config/examples/default.yaml", "utf8").replaceAll(
  "decode-load-scorer",
  "active-request-scorer",
);
/** ~40,000 pseudo-tokens (4 bytes each) of a prompt nobody has seen: a long document. */
const longDoc = (tag: string) => `${tag} ${"abcd".repeat(40000)}`;

type Created = Awaited<ReturnType<typeof createScheduler>>;

/** Picks `req` on `only` (the sole candidate): in flight there until started/completed. */
function place(s: Created["scheduler"], id: string, prompt: string, only: string, t: number) {
  const req = completion(id, prompt);
  const r = s.schedule(req, [endpoint(only)], t);
  assert.equal(r.target?.id, only);
  s.onPicked(req, r, t);
  return req;
}

describe("prefill-wait-scorer beside the default config's scorers", () => {
  it("sends a short question past a replica prefilling a long prompt, to one with more requests decoding", async () => {
    for (let seed = 1; seed <= 3; seed++) {
      const { scheduler } = await createScheduler(WITH_WAIT, { hasher: h, seed });
      // a:1 has one long document queued (no first token yet); b:1 has three short requests decoding.
      place(scheduler, "doc", longDoc("d"), "a:1", 0);
      for (let i = 0; i < 3; i++) {
        const q = place(scheduler, `s${i}`, `short question number ${i}?`, "b:1", 0);
        scheduler.onResponseStarted(q, "b:1", 0.05);
      }
      const pool = [endpoint("a:1", { updateTime: 0.1 }), endpoint("b:1", { updateTime: 0.1 })];
      const r = scheduler.schedule(completion("q", "what is the capital of France?"), pool, 0.1, {
        explain: true,
      });
      assert.equal(r.target?.id, "b:1", `seed ${seed}`);
      assert.ok(/pluginRef: prefill-wait-scorer/.test(WITH_WAIT));
      // The decision is the prefill wait's: a:1 wins on in-flight requests.
      const cands = r.explanation?.profiles.default.candidates ?? [];
      const raw = (id: string, type: string) =>
        cands.find((c) => c.id === id)?.scores.find((x) => x.type === type)?.raw as number;
      assert.ok(raw("a:1", "active-request-scorer") > raw("b:1", "active-request-scorer"));
      assert.ok(raw("a:1", "prefill-wait-scorer") < 0.2 * raw("b:1", "prefill-wait-scorer"));
    }
  });
});

describe("prefill-wait-scorer", () => {
  const cfg = (scorer: string) => `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: ${scorer}
`;

  /** a:1 queues 9 long documents (~360k tokens), b:1 queues 12 (~480k): both past 2^18 tokens. */
  async function scores(scorer: string) {
    const { scheduler } = await createScheduler(cfg(scorer), { hasher: h, seed: 1 });
    for (let i = 0; i < 9; i++) place(scheduler, `a${i}`, longDoc(`a${i}`), "a:1", 0);
    for (let i = 0; i < 12; i++) place(scheduler, `b${i}`, longDoc(`b${i}`), "b:1", 0);
    const r = scheduler.schedule(completion("q", "hello?"), [endpoint("a:1"), endpoint("b:1")], 1, {
      explain: true,
    });
    const cands = r.explanation?.profiles.default.candidates ?? [];
    return cands.map((c) => c.scores[0].raw);
  }

  it("still separates replicas when every queue is longer than token-load-scorer's threshold", async () => {
    const tokenLoad = await scores("token-load-scorer\n  parameters: { queueThresholdTokens: 262144 }");
    assert.equal(tokenLoad[0], tokenLoad[1]);
    const [a, b] = await scores("prefill-wait-scorer");
    assert.equal(a, 1);
    // 0.25 s floor, 15,928 tok/s until learned: (0.25 + 360k/r) / (0.25 + 480k/r) ≈ 0.75.
    assert.ok(b > 0.7 && b < 0.8, `b ${b}`);
  });

  it("lets differences far below its floor count for little", async () => {
    const { scheduler } = await createScheduler(cfg("prefill-wait-scorer"), { hasher: h, seed: 1 });
    place(scheduler, "x", "a forty token question or so, nothing long at all here", "a:1", 0);
    const r = scheduler.schedule(completion("q", "hi?"), [endpoint("a:1"), endpoint("b:1")], 0.01, {
      explain: true,
    });
    const [a, b] = (r.explanation?.profiles.default.candidates ?? []).map((c) => c.scores[0].raw);
    assert.equal(b, 1);
    assert.ok(a > 0.99 && a < 1, `a ${a}`);
  });
});

describe("prefill-wait-scorer's shortLanes: under a backlog the least-queued replica is kept for short prompts", () => {
  /** `n` pseudo-tokens (4 bytes each) of a prompt nobody has seen. */
  const prompt = (tag: string, n: number) => `${tag} ${"wxyz".repeat(n)}`.slice(0, 4 * n);
  const pool = ["a:1", "b:1", "c:1", "d:1"];
  type Sched = Created["scheduler"];

  /**
   * 32 prompts scored, none picked (no queue moves): 24 of `short` tokens and 8 of 4,000. Then each
   * replica is sent 10 prompts of 4,000 tokens (each scored too, on its one replica), so the short
   * ones are the bottom quartile of what the scorer has seen (at 1,500 tokens, 18% of its tokens:
   * 0.73 of a replica's worth, one lane). Of those 40,000 tokens in flight on
   * each replica only the last `queued[i]` are not prefilled yet (the rest have their first token),
   * so the decode and KV loads are the same everywhere and only the prefill queue differs.
   */
  function backlog(s: Sched, queued: number[], short = 1500) {
    for (let i = 0; i < 32; i++)
      s.schedule(
        completion(`w${i}`, prompt(`w${i}`, i % 4 === 0 ? 4000 : short)),
        pool.map((id) => endpoint(id)),
        0,
      );
    pool.forEach((id, e) => {
      for (let j = 0; j < 10; j++) {
        const req = place(s, `${id}-${j}`, prompt(`${id}-${j}`, 4000), id, 0);
        if ((10 - j) * 4000 > queued[e]) s.onResponseStarted(req, id, 0);
      }
    });
  }
  const pick = (s: Sched, tokens: number, seed: number) =>
    s.schedule(
      completion(`q${seed}-${tokens}`, prompt(`q${seed}-${tokens}`, tokens)),
      pool.map((id) => endpoint(id)),
      0.01,
    ).target?.id;

  it("sends a long prompt past the least-queued replica and a short one to it, in the default config", async () => {
    const cfg = readFileSync("config/examples/default.yaml", "utf8");
    assert.match(cfg, /^ +shortLanes:/m);
    for (let seed = 1; seed <= 3; seed++) {
      // a:1 has 12,000 tokens queued (0.75 s at 15,928 tok/s), the others 40,000 (2.5 s).
      const { scheduler } = await createScheduler(cfg, { hasher: h, seed });
      backlog(scheduler, [12000, 40000, 40000, 40000]);
      assert.notEqual(pick(scheduler, 4000, seed), "a:1", `seed ${seed}: a long prompt`);
      assert.equal(pick(scheduler, 1500, seed), "a:1", `seed ${seed}: a short prompt`);
      // Without the lanes the long prompt goes to a:1 too.
      const offCfg = cfg.replace(/\n {4}shortLanes:\n(?: {6}.*\n)+/, "\n");
      assert.doesNotMatch(offCfg, /^ +shortLanes:/m);
      const off = await createScheduler(offCfg, { hasher: h, seed });
      backlog(off.scheduler, [12000, 40000, 40000, 40000]);
      assert.equal(pick(off.scheduler, 4000, seed), "a:1", `seed ${seed}: lanes off`);
    }
  });

  it("gives the lane long prompts when its own queue is short, or when there is no backlog", async () => {
    const cfg = readFileSync("config/examples/default.yaml", "utf8");
    // a:1 under laneSeconds (4,000 tokens: 0.25 s): it would idle without them.
    const short = await createScheduler(cfg, { hasher: h, seed: 1 });
    backlog(short.scheduler, [4000, 40000, 40000, 40000]);
    assert.equal(pick(short.scheduler, 4000, 1), "a:1");
    // The median replica has 12,000 tokens (0.75 s) ahead: under gateSeconds, no lanes.
    const light = await createScheduler(cfg, { hasher: h, seed: 1 });
    backlog(light.scheduler, [8000, 12000, 12000, 40000]);
    assert.equal(pick(light.scheduler, 4000, 1), "a:1");
  });

  it("keeps no lane when the short prompts would fill under half a replica", async () => {
    // 100-token short prompts are 1.5% of the tokens: 0.06 of a replica's worth, 0 lanes.
    const { scheduler } = await createScheduler(readFileSync("config/examples/default.yaml", "utf8"), {
      hasher: h,
      seed: 1,
    });
    backlog(scheduler, [12000, 40000, 40000, 40000], 100);
    assert.equal(pick(scheduler, 4000, 1), "a:1");
  });

  it("keeps as many lanes as hold the short prompts' tokens under maxLaneLoad of their capacity", async () => {
    // 2,000-token short prompts are 23% of the tokens: 0.92 of a replica's worth. One lane would
    // run at 0.92 of its capacity (and backlog with them in a burst), so the default (0.8) keeps two:
    // a long prompt passes a:1 and b:1 (0.75 and 1.26 s queued) for the 2.5 s queues.
    const cfg = readFileSync("config/examples/default.yaml", "utf8");
    for (let seed = 1; seed <= 3; seed++) {
      const { scheduler } = await createScheduler(cfg, { hasher: h, seed });
      backlog(scheduler, [12000, 20000, 40000, 40000], 2000);
      assert.ok(!["a:1", "b:1"].includes(pick(scheduler, 4000, seed) ?? ""), `seed ${seed}: a long prompt`);
      assert.equal(pick(scheduler, 2000, seed), "a:1", `seed ${seed}: a short prompt`);
    }
    // At maxLaneLoad 1 one lane holds them: the long prompt takes b:1, the least-queued after it.
    const one = cfg.replace(/^( +)laneSeconds: 0\.5$/m, "$1laneSeconds: 0.5\n$1maxLaneLoad: 1");
    assert.match(one, /maxLaneLoad: 1/);
    const { scheduler } = await createScheduler(one, { hasher: h, seed: 1 });
    backlog(scheduler, [12000, 20000, 40000, 40000], 2000);
    assert.equal(pick(scheduler, 4000, 1), "b:1");
  });

  it("keeps no lane before it has seen 32 prompts, nor for a prompt in the bottom quantile", async () => {
    const { scheduler } = await createScheduler(
      `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-wait-scorer
  parameters: { learnPrefillThroughput: false, shortLanes: { quantile: 0.5 } }
`,
      { hasher: h, seed: 1 },
    );
    // a:1 queues 12,000 tokens (0.75 s), the others 36,000 (2.3 s): 10 prompts seen.
    pool.forEach((id, e) => {
      for (let j = 0; j < (e === 0 ? 1 : 3); j++)
        place(scheduler, `${id}-${j}`, prompt(`${id}-${j}`, 12000), id, 0);
    });
    assert.equal(pick(scheduler, 4000, 1), "a:1");
    for (let i = 0; i < 32; i++) pick(scheduler, i < 24 ? 1500 : 4000, 100 + i);
    // Now the bottom half of the prompts seen is the 1,500-token ones, 19% of the tokens: one lane.
    assert.notEqual(pick(scheduler, 4000, 2), "a:1");
    assert.equal(pick(scheduler, 1500, 3), "a:1");
  });
});
