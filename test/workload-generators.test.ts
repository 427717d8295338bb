// Workload generators: token lengths under the simulator tokenizer, prefix-sharing structure,
// multi-turn thread growth, and seed reproducibility.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { generateMixedLength, MIXED_LENGTH_DEFAULTS } from "../src/bench/workloads/mixed-length.ts";
import { generateMultiTurn, MULTI_TURN_DEFAULTS } from "../src/bench/workloads/multi-turn.ts";
import { generateRandom, RANDOM_DEFAULTS } from "../src/bench/workloads/random.ts";
import { generateSharedPrefix, SHARED_PREFIX_DEFAULTS } from "../src/bench/workloads/shared-prefix.ts";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import type { RequestSpec } from "../src/bench/workloads/types.ts";
import { createSimTokenizer } from "../src/engine/sim-tokenizer.ts";
import { messageText } from "../src/engine/tokenizer.ts";

const tok = createSimTokenizer();
const count = (text: string) => tok.encode(text, false).length;
const textOf = (r: { prompt?: string; messages?: Array<{ role: string; content?: unknown }> }) =>
  r.prompt ?? (r.messages ?? []).map((m) => messageText(m as never)).join(" ");
const within = (actual: number, target: number, tol = 0.1) =>
  assert.ok(Math.abs(actual - target) <= Math.max(1, target * tol), `${actual} tokens, wanted ~${target}`);

describe("shared-prefix", () => {
  const o = {
    ...SHARED_PREFIX_DEFAULTS,
    numGroups: 6,
    promptsPerGroup: 3,
    systemPromptLen: 500,
    questionLen: 80,
    outputLen: 20,
  };

  test("prompt lengths match the requested token counts under the sim tokenizer (±10%)", () => {
    const units = generateSharedPrefix(o, 7, 18);
    for (const [r] of units) {
      within(count(r.prompt!), 580);
      assert.equal(r.promptTokensApprox, 580);
      assert.equal(r.maxTokens, 20);
    }
  });

  test("same group ⇒ same system prompt text; different groups ⇒ different first tokens", () => {
    const units = generateSharedPrefix({ ...o, api: "chat" }, 7, 18).map((u) => u[0]);
    const sysByGroup = new Map<number, string>();
    for (const r of units) {
      const sys = messageText(r.messages![0]);
      assert.equal(r.messages![0].role, "system");
      const prev = sysByGroup.get(r.groupId!);
      if (prev !== undefined) assert.equal(sys, prev);
      sysByGroup.set(r.groupId!, sys);
      within(count(sys), 500);
    }
    assert.equal(sysByGroup.size, 6);
    const firstBlocks = [...sysByGroup.values()].map((s) => tok.encode(s, false).slice(0, 4).join(","));
    assert.equal(new Set(firstBlocks).size, 6, "every group starts with a different first 4 tokens");
    const first = [...sysByGroup.values()].map((s) => tok.encode(s, false)[0]);
    assert.equal(new Set(first).size, 6, "and a different very first token");
  });

  test("150 groups (llmd-73 scale) all start with different first tokens", () => {
    const units = generateSharedPrefix(
      { ...o, numGroups: 150, promptsPerGroup: 1, systemPromptLen: 8 },
      1,
      150,
    );
    assert.equal(new Set(units.map(([r]) => tok.encode(r.prompt!, false)[0])).size, 150);
  });

  test("completion prompts of one group share the system prompt as a text prefix", () => {
    const units = generateSharedPrefix({ ...o, order: "interleaved" }, 3, 18).map((u) => u[0]);
    const g0 = units.filter((r) => r.groupId === 0).map((r) => r.prompt!);
    assert.equal(g0.length, 3);
    const sysChars = 500 * 4 - 1;
    assert.ok(g0.every((p) => p.slice(0, sysChars) === g0[0].slice(0, sysChars)));
    assert.notEqual(g0[0], g0[1], "questions differ within a group");
  });

  test("the G·P prompts are permuted once and cycled; interleaved order maps request i to group i mod G", () => {
    const units = generateSharedPrefix(o, 11, 36).map((u) => u[0]);
    for (let i = 0; i < 18; i++) assert.equal(units[i].prompt, units[i + 18].prompt);
    assert.equal(new Set(units.slice(0, 18).map((r) => r.prompt)).size, 18);
    const inter = generateSharedPrefix({ ...o, order: "interleaved" }, 11, 12).map((u) => u[0]);
    assert.deepEqual(
      inter.map((r) => r.groupId),
      [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5],
    );
  });

  test("seeds reproduce exactly and different seeds differ", () => {
    const a = generateWorkload({ preset: "smoke", seed: 5 });
    const b = generateWorkload({ preset: "smoke", seed: 5 });
    const c = generateWorkload({ preset: "smoke", seed: 6 });
    assert.deepEqual(a, b);
    assert.notDeepEqual(
      a.requests.map((r) => r.prompt),
      c.requests.map((r) => r.prompt),
    );
    assert.notDeepEqual(
      a.requests.map((r) => r.arrivalTime),
      c.requests.map((r) => r.arrivalTime),
    );
  });

  test("length distributions stay within [min, max]", () => {
    const units = generateSharedPrefix(
      {
        ...o,
        questionLen: { mean: 100, std: 50, min: 60, max: 130 },
        outputLen: { mean: 10, std: 5, min: 2, max: 12 },
      },
      1,
      18,
    );
    for (const [r] of units) {
      assert.ok(r.promptTokensApprox - 500 >= 60 && r.promptTokensApprox - 500 <= 130);
      assert.ok(r.maxTokens >= 2 && r.maxTokens <= 12);
      within(count(r.prompt!), r.promptTokensApprox);
    }
  });
});

describe("multi-turn", () => {
  const o = { ...MULTI_TURN_DEFAULTS, turns: 4, systemPromptLen: 300, questionLen: 50, outputLen: 40 };

  test("each turn resends the whole thread: previous messages + assistant reply + new user message", () => {
    const sessions = generateMultiTurn(o, 9, 3);
    for (const s of sessions) {
      assert.equal(s.length, 4);
      for (let t = 1; t < s.length; t++) {
        const prev = s[t - 1].messages!;
        const cur = s[t].messages!;
        assert.equal(cur.length, prev.length + 2);
        assert.deepEqual(cur.slice(0, prev.length), prev);
        assert.equal(cur[prev.length].role, "assistant");
        assert.equal(cur[prev.length + 1].role, "user");
        within(count(messageText(cur[prev.length])), s[t - 1].maxTokens);
        assert.equal(s[t].turn, t + 1);
        assert.equal(s[t].sessionId, s[0].sessionId);
      }
    }
  });

  test("completion threads: turn k's prompt is a prefix of turn k+1's, lengths grow as computed", () => {
    const [s] = generateMultiTurn({ ...o, api: "completion" }, 9, 1);
    for (let t = 1; t < s.length; t++) {
      assert.ok(s[t].prompt!.startsWith(s[t - 1].prompt!));
      assert.equal(s[t].promptTokensApprox, s[t - 1].promptTokensApprox + s[t - 1].maxTokens + 50);
    }
    for (const r of s) within(count(r.prompt!), r.promptTokensApprox);
  });

  test("shared system prompts: session i uses prompt i mod N", () => {
    const sessions = generateMultiTurn({ ...o, sharedSystemPrompts: 2 }, 4, 4);
    const sys = sessions.map((s) => messageText(s[0].messages![0]));
    assert.equal(sys[0], sys[2]);
    assert.equal(sys[1], sys[3]);
    assert.notEqual(sys[0], sys[1]);
    assert.deepEqual(
      sessions.map((s) => s[0].groupId),
      [0, 1, 0, 1],
    );
  });

  test("through generateWorkload, later turns wait for the previous turn (after + think time)", () => {
    const w = generateWorkload({
      workload: "multi-turn",
      numRequests: 3,
      arrival: { type: "poisson", rate: 2 },
      options: { turns: 3, thinkTime: 1.5 },
    });
    assert.equal(w.requests.length, 9);
    const byId = new Map(w.requests.map((r) => [r.id, r]));
    for (const r of w.requests) {
      if (r.turn === 1) assert.equal(r.after, undefined);
      else {
        const dep = byId.get(r.after!.id)!;
        assert.equal(dep.sessionId, r.sessionId);
        assert.equal(dep.turn, r.turn! - 1);
        assert.equal(r.after!.delay, 1.5);
      }
    }
  });
});

describe("mixed-length and random", () => {
  test("mixed-length: mostly short questions, a fraction of ~50k-token documents", () => {
    const units = generateMixedLength({ ...MIXED_LENGTH_DEFAULTS, longFraction: 0.1, longLen: 5000 }, 2, 400);
    const long = units.filter(([r]) => r.promptTokensApprox > 1000);
    assert.ok(long.length > 20 && long.length < 65, `${long.length} long of 400`);
    for (const [r] of units) within(count(textOf(r)), r.promptTokensApprox);
    const big = generateMixedLength({ ...MIXED_LENGTH_DEFAULTS, longFraction: 1 }, 2, 1);
    within(count(textOf(big[0][0])), 50040);
  });

  test("mixed-length with a document pool repeats documents as groups", () => {
    const units = generateMixedLength(
      { ...MIXED_LENGTH_DEFAULTS, longFraction: 0.5, longLen: 300, documentPool: 2 },
      3,
      60,
    );
    const docs = units.map(([r]) => r).filter((r) => r.groupId !== undefined);
    const g0 = docs.filter((r) => r.groupId === 0).map((r) => textOf(r).slice(0, 300 * 4 - 1));
    assert.ok(g0.length >= 2);
    assert.ok(g0.every((t) => t === g0[0]));
  });

  test("random: lengths from the distribution, no two prompts share a first block", () => {
    const units = generateRandom(RANDOM_DEFAULTS, 8, 300).map((u) => u[0]);
    const heads = new Set<string>();
    for (const r of units) {
      within(count(r.prompt!), r.promptTokensApprox);
      assert.ok(r.promptTokensApprox >= 32 && r.promptTokensApprox <= 4000);
      heads.add(tok.encode(r.prompt!, false).slice(0, 16).join(","));
    }
    assert.equal(heads.size, 300);
  });
});

test("every preset generates requests whose text matches promptTokensApprox (sampled)", () => {
  for (const preset of ["smoke", "tutorial"]) {
    const w = generateWorkload({ preset });
    const sample: RequestSpec[] = w.requests.filter((_, i) => i % 97 === 0);
    for (const r of sample) within(count(textOf(r)), r.promptTokensApprox);
  }
});
