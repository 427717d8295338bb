/** The theoretical limits, on a hand-made workload whose block-level reuse is known exactly. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { generateWorkload } from "../src/bench/workloads/spec.ts";
import type { RequestSpec, Workload } from "../src/bench/workloads/types.ts";
import { FastRequestBlockHasher, fastRoot } from "../src/engine/fast-block-hash.ts";
import { stepTime } from "../src/engine/profile.ts";
import { computeLimits } from "../src/sim/fleet/limits.ts";
import { PromptTokenizer } from "../src/sim/fleet/prompt-tokens.ts";
import type { FleetConfig } from "../src/sim/fleet/replica.ts";
import { loadProfile } from "../src/sim/profiles.ts";

const words = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}${i}`);

/**
 * With the sim tokenizer each word is one token, and completions start with BOS, so a prompt of
 * 80 words is 81 tokens: 5 full 16-token blocks, at most 5 of them hittable (81 − 1 = 80).
 * A1 and A2 share BOS + 63 words = 64 tokens = 4 blocks; B is unrelated.
 */
function workload(): Workload {
  const prefix = words("p", 63);
  const a1 = [...prefix, ...words("x", 17)].join(" ");
  const a2 = [...prefix, ...words("y", 17)].join(" ");
  const b = words("b", 80).join(" ");
  const req = (i: number, prompt: string, groupId: number): RequestSpec => ({
    id: `r${i}`,
    arrivalTime: i,
    kind: "completion",
    prompt,
    promptTokensApprox: 81,
    maxTokens: 100,
    groupId,
  });
  return {
    name: "hand",
    seed: 0,
    requests: [req(0, a1, 0), req(1, a2, 0), req(2, a1, 0), req(3, a2, 0), req(4, b, 1)],
    stages: [],
  };
}

describe("theoretical limits", () => {
  const profile = loadProfile("llama-3.1-8b-h100");
  const fleet: FleetConfig = {
    replicas: 2,
    profile,
    model: profile.model.name,
    blockSize: 16,
    numGpuBlocks: 1001,
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    maxModelLen: 4096,
    labels: {},
    blockHashAlgo: "fast64",
    enableKvCacheEvents: false,
  };
  const l = computeLimits(workload(), fleet, new PromptTokenizer());

  it("counts prompts and hit tokens per regime", () => {
    assert.equal(l.requests, 5);
    assert.equal(l.prompt_tokens_mean, 81);
    assert.equal(l.kv_tokens_per_replica, 16000);
    // Group: the three requests after A1 each reuse the 4-block group prefix; B's group has one request.
    assert.equal(l.regimes.group.prefix_hit_rate, (3 * 64) / 405);
    // Repeat: A2 reuses A1's 4 blocks; the second A1 and A2 reuse all 5 of their own.
    assert.equal(l.regimes.repeat.prefix_hit_rate, (64 + 80 + 80) / 405);
    assert.equal(l.regimes.zero.prefix_hit_rate, 0);
    // Resident: group 0's prefix; for repeats, the 4 prefix blocks plus A1's and A2's last blocks.
    assert.equal(l.regimes.group.resident_tokens_per_replica, 64 / 2);
    assert.equal(l.regimes.repeat.resident_tokens_per_replica, (6 * 16) / 2);
  });

  it("derives the prefill and decode ceilings from the step-time model", () => {
    const chunk = stepTime(profile, { prefills: [{ tokens: 8192, context: 0 }], decodeContexts: [] }).total;
    assert.equal(l.prefill_tokens_per_s_per_replica, 8192 / chunk);
    const g = l.regimes.zero;
    assert.equal(g.uncached_prompt_tokens_mean, 81);
    assert.equal(g.prefill_requests_per_s, (2 * 8192) / chunk / 81);
    assert.equal(g.prefill_output_tokens_per_s, g.prefill_requests_per_s * 100);
    assert.equal(g.live_tokens_per_request, 81 + 50);
    assert.equal(g.concurrency_per_replica, Math.min(256, Math.floor(16000 / 131)));
    const step = stepTime(profile, {
      prefills: [],
      decodeContexts: new Array(g.concurrency_per_replica).fill(131),
    });
    assert.equal(g.decode_step_s, step.total);
    assert.equal(g.decode_output_tokens_per_s, (2 * g.concurrency_per_replica) / step.total);
    for (const r of Object.values(l.regimes)) assert.ok(r.resident_fits);
  });

  it("bounds the fleet by steps that carry prefill and decode together", () => {
    const g = l.regimes.zero;
    // 81 uncached prompt tokens per 100 output tokens: each step decodes C and prefills 0.81·C.
    const c = g.concurrency_per_replica;
    assert.equal(g.mixed_concurrency_per_replica, c);
    const step = stepTime(profile, {
      prefills: [{ tokens: c * 0.81, context: Math.max(0, 81 / 2 - (c * 0.81) / 2) }],
      decodeContexts: new Array(c).fill(131),
    }).total;
    assert.equal(g.mixed_step_s, step);
    assert.equal(g.mixed_output_tokens_per_s, (2 * c) / step);
    // Sharing steps costs time: tighter than both single-phase bounds, and it is the ceiling.
    assert.ok(g.mixed_output_tokens_per_s < g.prefill_output_tokens_per_s);
    assert.ok(g.mixed_output_tokens_per_s < g.decode_output_tokens_per_s);
    assert.equal(g.output_tokens_per_s, g.mixed_output_tokens_per_s);
  });
});

/**
 * The limits' prefix regimes as first written (a Map of blocks, every request walking every
 * earlier prompt of its group and every block of its own): computeLimits skips work it can prove
 * changes nothing, and must give the same hit tokens and resident sets.
 */
function referenceRegimes(w: Workload, bs: number, tok: PromptTokenizer) {
  const root = fastRoot("limits");
  const infos = new Map<string, { tokens: number; blocks: number[] }>();
  const info = (r: RequestSpec) => {
    const text = r.kind === "chat" ? JSON.stringify(r.messages) : `c${r.prompt}`;
    let p = infos.get(text);
    if (p === undefined) {
      const ids = r.kind === "chat" ? tok.chat(r.messages ?? []) : tok.completion(r.prompt ?? "");
      const h = new FastRequestBlockHasher(root, bs, Math.floor(ids.length / bs));
      h.update(Int32Array.from(ids), ids.length);
      const blocks = Array.from(
        { length: h.count },
        (_, i) => (h.his[i] & 0x1fffff) * 2 ** 32 + (h.los[i] >>> 0),
      );
      infos.set(text, (p = { tokens: ids.length, blocks }));
    }
    return p;
  };
  const reqs = w.requests
    .map((r, i) => ({ r, i }))
    .sort((a, b) => a.r.arrivalTime - b.r.arrivalTime || a.i - b.i)
    .map((x) => x.r);
  const groups = new Map<string, { tokens: number; blocks: number[] }[]>();
  const resident = new Map<string, number>();
  const seen = new Map<number, number>();
  let [prompt, group, repeat, reused] = [0, 0, 0, 0];
  for (const r of reqs) {
    const p = info(r);
    prompt += p.tokens;
    const cap = Math.floor((p.tokens - 1) / bs);
    const g =
      r.groupId !== undefined ? `g${r.groupId}` : r.sessionId !== undefined ? `s${r.sessionId}` : undefined;
    if (g !== undefined) {
      const earlier = groups.get(g) ?? [];
      groups.set(g, earlier);
      if (earlier.length > 0) {
        let best = 0;
        for (const q of earlier) {
          if (q === p) continue;
          let k = 0;
          while (k < Math.min(p.blocks.length, q.blocks.length) && p.blocks[k] === q.blocks[k]) k++;
          best = Math.max(best, k);
        }
        group += Math.min(best, cap) * bs;
        resident.set(g, Math.max(resident.get(g) ?? 0, Math.min(best, cap) * bs));
      }
      if (!earlier.includes(p)) earlier.push(p);
    }
    let k = 0;
    for (; k < cap && seen.has(p.blocks[k]); k++)
      if (seen.get(p.blocks[k]) === 0) {
        seen.set(p.blocks[k], 1);
        reused++;
      }
    repeat += k * bs;
    for (const b of p.blocks) if (!seen.has(b)) seen.set(b, 0);
  }
  let groupResident = 0;
  for (const v of resident.values()) groupResident += v;
  return { group: group / prompt, repeat: repeat / prompt, groupResident, repeatResident: reused * bs };
}

describe("limits against the reference walk", () => {
  const profile = loadProfile("llama-3.1-8b-h100");
  const fleet: FleetConfig = {
    replicas: 3,
    profile,
    model: profile.model.name,
    blockSize: 16,
    numGpuBlocks: 4001,
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    maxModelLen: 8192,
    labels: {},
    blockHashAlgo: "fast64",
    enableKvCacheEvents: false,
  };
  const specs = (seed: number) => [
    {
      workload: "shared-prefix",
      seed,
      numRequests: 120,
      options: { numGroups: 4, promptsPerGroup: 3, systemPromptLen: 200, questionLen: 40, outputLen: 10 },
    },
    {
      workload: "shared-prefix",
      seed,
      numRequests: 60,
      options: { numGroups: 3, promptsPerGroup: 4, systemPromptLen: 100, questionLen: 30, api: "chat" },
    },
    { workload: "multi-turn", seed, numRequests: 30, options: { turns: 4, questionLen: 30, outputLen: 20 } },
    {
      workload: "mixed-length",
      seed,
      numRequests: 40,
      options: { shortLen: 20, longLen: 300, documentPool: 3 },
    },
  ];
  it("gives the same hit tokens and resident sets on generated workloads", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 10_000 }), (seed) => {
        for (const spec of specs(seed)) {
          const w = generateWorkload(spec as never);
          const want = referenceRegimes(w, 16, new PromptTokenizer());
          const got = computeLimits(w, fleet, new PromptTokenizer());
          assert.equal(got.regimes.group.prefix_hit_rate, want.group, spec.workload);
          assert.equal(got.regimes.repeat.prefix_hit_rate, want.repeat, spec.workload);
          assert.equal(got.regimes.group.resident_tokens_per_replica, want.groupResident / 3);
          assert.equal(got.regimes.repeat.resident_tokens_per_replica, want.repeatResident / 3);
        }
      }),
      { numRuns: 8 },
    );
  });
});
