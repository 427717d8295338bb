/**
 * The engine's speed work must not change its behaviour. A fixed, busy trace (shared prefixes
 * under KV pressure with preemptions, LoRA names, cache salts, aborts, a prefix-cache reset, FCFS
 * and priority scheduling, natural and ignore_eos lengths) is digested — every step's times,
 * outputs and KV events, and the final stats — and compared with the digest the engine produced
 * before block-pool keys and hashing were restructured. And "fast64" block hashing must give the
 * same run as sha256_cbor in everything but the hash values inside KV events. The fleet's prompt
 * hash memo (one hashing per distinct prompt array) must give the same run as hashing every prompt.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, it } from "node:test";
import { type BlockHashAlgo, Engine } from "../src/engine/engine.ts";
import { PromptHashMemo } from "../src/engine/fast-block-hash.ts";
import { Rng } from "../src/engine/output-tokens.ts";
import type { EngineStats, StepResult } from "../src/engine/types.ts";
import { engineConfig } from "./helpers/engine-fixtures.ts";

/** Digests recorded from the engine before the restructuring (sha256_cbor, events on). */
const GOLDEN: Record<string, string> = {
  fcfs: "ee52800907110898a7e27fa3d481b92be3bf9bdf120db33b3fdecbeac79b8562",
  priority: "96976e6a015efb52d4bcc265164ccb03e77d27f3f32359c3da9dcedb91446d20",
};

/**
 * The stats as the digests recorded them: without the P/D fields added since (no request here uses
 * P/D, so they are all zero) and without the then-absent "error" finish reason.
 */
function recordedStats(s: EngineStats): unknown {
  const o: Record<string, unknown> = { ...s, requestSuccess: { ...s.requestSuccess } };
  for (const k of [
    "numRequestsWaitingDeferred",
    "promptTokensBySource",
    "numHeldRequests",
    "numKvExpiredReqs",
  ])
    delete o[k];
  delete (o["requestSuccess"] as Record<string, number>)["error"];
  return o;
}

const json = (v: unknown) => JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x));

function stepView(r: StepResult, withEvents: boolean): unknown {
  return {
    s: r.startTime,
    e: r.endTime,
    o: r.outputs.map((o) => [o.requestId, o.newTokenIds, o.finishReason, o.record ?? null]),
    k: withEvents ? r.kvEvents : r.kvEvents === null ? null : r.kvEvents.events.map((e) => e.type),
    n: [r.numPrefillTokens, r.numDecodeTokens, r.numScheduledRequests, r.numPreemptedThisStep],
  };
}

/**
 * Runs the fixed trace; returns one JSON line per step plus the final stats. With `prompts`,
 * requests draw their prompt arrays from that many shared arrays (the same array object again and
 * again, as the fleet's tokenizer hands them out), and `memo` is given to the engine.
 */
function trace(
  policy: "fcfs" | "priority",
  algo: BlockHashAlgo,
  withEvents: boolean,
  shared?: { prompts: number; memo?: PromptHashMemo },
  outputs: "every-token" | "first-and-last" = "every-token",
  view: (r: StepResult) => unknown = (r) => stepView(r, withEvents),
): string[] {
  const e = new Engine(
    engineConfig({
      numGpuBlocks: 420,
      maxNumSeqs: 24,
      maxNumBatchedTokens: 512,
      maxModelLen: 4096,
      schedulingPolicy: policy,
    }),
    {
      blockHashAlgo: algo,
      outputs,
      ...(shared?.memo !== undefined ? { promptHashMemo: shared.memo } : {}),
    },
  );
  const rng = new Rng(7);
  const pool = new Map<number, number[]>();
  const systems = Array.from({ length: 5 }, (_, g) =>
    Array.from({ length: 300 + 37 * g }, (_, i) => 100 + g * 1000 + i),
  );
  const lines: string[] = [];
  let now = 0;
  let next = 0;
  const total = 160;
  for (let guard = 0; guard < 200000 && (next < total || e.hasUnfinishedRequests()); guard++) {
    while (next < total && next * 0.02 <= now) {
      const g = next % 5;
      const question = Array.from(
        { length: 20 + Math.floor(rng.next() * 150) },
        () => 20000 + Math.floor(rng.next() * 5000),
      );
      let prompt = [...systems[g], ...question];
      if (shared !== undefined) {
        const k = next % shared.prompts;
        prompt = pool.get(k) ?? prompt;
        pool.set(k, prompt);
      }
      e.addRequest(
        {
          id: `q${next}`,
          promptTokenIds: prompt,
          maxTokens: 10 + Math.floor(rng.next() * 120),
          ignoreEos: next % 3 !== 0,
          ...(next % 7 === 0 ? { loraName: "adapter-a" } : {}),
          ...(next % 11 === 0 ? { cacheSalt: `salt-${next % 2}` } : {}),
          priority: next % 4,
        },
        now,
      );
      next++;
    }
    if (next === 60 && e.abort("q55", now) !== null) lines.push(`abort q55 @${now}`);
    if (next === 100) lines.push(`reset ${e.resetPrefixCache(now)} @${now}`);
    if (!e.hasUnfinishedRequests()) {
      now = next * 0.02;
      continue;
    }
    const r = e.step(now);
    e.checkInvariants();
    lines.push(json(view(r)));
    now = r.endTime;
  }
  lines.push(json(recordedStats(e.stats())));
  return lines;
}

const digest = (lines: string[]) => createHash("sha256").update(lines.join("\n")).digest("hex");

describe("engine equivalence", () => {
  for (const policy of ["fcfs", "priority"] as const) {
    it(`${policy}: the sha256_cbor run matches the recorded digest`, () => {
      assert.equal(digest(trace(policy, "sha256_cbor", true)), GOLDEN[policy]);
    });

    it(`${policy}: fast64 hashing gives the same run except event hash values`, () => {
      assert.deepEqual(trace(policy, "fast64", false), trace(policy, "sha256_cbor", false));
    });
  }

  for (const policy of ["fcfs", "priority"] as const)
    it(`${policy}: the prompt hash memo gives the same run as hashing every prompt`, () => {
      const memo = new PromptHashMemo();
      const withMemo = trace(policy, "fast64", true, { prompts: 12, memo });
      assert.deepEqual(withMemo, trace(policy, "fast64", true, { prompts: 12 }));
      // Prompts recur under other LoRA names and salts, which must not reuse each other's hashes.
      assert.ok(memo.hits > 50, `memo hits ${memo.hits}`);
      assert.ok(memo.misses > 12, `memo misses ${memo.misses}`);
    });

  for (const policy of ["fcfs", "priority"] as const)
    it(`${policy}: "first-and-last" outputs give the same run, listing only first and finishing tokens`, () => {
      // Every-token outputs cut to each request's first token and its finishing one; records as arrays.
      const seen = new Set<string>();
      const cut = (r: StepResult) => {
        const outputs = r.outputs.filter((o) => {
          const first = !seen.has(o.requestId);
          seen.add(o.requestId);
          return first || o.finishReason !== null;
        });
        return stepView({ ...r, outputs }, true);
      };
      const plain = (r: StepResult) => {
        for (const o of r.outputs) {
          if (o.record === undefined) continue;
          assert.ok(o.record.tokenTimes instanceof Float64Array, "token times as a typed array");
          assert.ok(o.record.outputTokenIds instanceof Int32Array, "token ids as a typed array");
          o.record = {
            ...o.record,
            tokenTimes: Array.from(o.record.tokenTimes),
            outputTokenIds: Array.from(o.record.outputTokenIds),
          };
        }
        return stepView(r, true);
      };
      const every = trace(policy, "fast64", true, undefined, "every-token", cut);
      const sparse = trace(policy, "fast64", true, undefined, "first-and-last", plain);
      assert.deepEqual(sparse, every);
      // The filter did cut: most of the every-token run's outputs are neither first nor last.
      const count = (lines: string[]) => lines.reduce((n, l) => n + (l.match(/"q\d+",\[/g)?.length ?? 0), 0);
      const all = trace(policy, "fast64", true);
      assert.ok(count(all) > 3 * count(every), `${count(all)} outputs in all, ${count(every)} kept`);
    });

  it("the trace exercises preemption, prefix hits, aborts and events", () => {
    const lines = trace("fcfs", "sha256_cbor", true);
    const stats = JSON.parse(lines[lines.length - 1]);
    assert.ok(stats.numPreemptions > 0, "preemptions");
    assert.ok(stats.prefixCacheHits > 0, "prefix hits");
    assert.ok(stats.requestSuccess.abort === 1, "one abort");
    assert.ok(
      lines.some((l) => l.includes("BlockRemoved")),
      "evictions",
    );
    assert.ok(
      lines.some((l) => l.startsWith("reset ")),
      "reset attempted",
    );
  });
});
