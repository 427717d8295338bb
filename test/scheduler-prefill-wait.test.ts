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
