/**
 * Theoretical limits of a workload on a fleet (kvgate's own bounds from the profile's prefill rate and
 * KV capacity), so a simulated result is read against what the hardware could do and not only against
 * round-robin. Three prefix-cache regimes, each a bound on what routing can achieve:
 *
 * - "zero": nothing is ever reused.
 * - "group": each request reuses its group's shared prefix — the longest block-aligned prefix it
 *   shares with a distinct prompt of its group (groupId, else sessionId) that arrived before it —
 *   except the first request of each group, which computes it: every request of a group goes to a
 *   replica already holding the group's prefix. Requests without a group reuse nothing.
 * - "repeat": the fleet as one infinite cache under perfect routing: every full block any earlier
 *   request (in arrival order) computed is reused; the first occurrence of each block is computed
 *   once. With prompt sets that cycle (inference-perf's shared_prefix) this exceeds "group".
 * Hit rate of a regime = Σ hit tokens / Σ prompt tokens, hits block-aligned and capped at
 * prompt − 1 tokens as vLLM does.
 *
 * Per regime, two ceilings (output tokens/s):
 * - prefill-bound: fleet prefill rate at full chunks (the step-time model at one
 *   max_num_batched_tokens chunk, no context) ÷ mean uncached prompt tokens = requests/s, × mean
 *   output tokens;
 * - KV/decode-bound: the KV left per replica after the regime's resident set (the blocks it
 *   reuses at least once, perfectly partitioned over the replicas) ÷ tokens a live request holds beyond it
 *   (uncached
 *   prompt + half its output, on average) = concurrent requests per replica (≤ max_num_seqs),
 *   ÷ the step time of that many decodes at mean context (prompt + half the output).
 * - mixed-step: prefill and decode share the engine's steps, so neither bound above is reachable
 *   on its own. In the steady state each step decodes C sequences and carries C·U/O prefill tokens
 *   (U uncached prompt and O output tokens per request, on average), within max_num_batched_tokens;
 *   its time is the same step-time model the engines run, and a replica makes C output tokens per
 *   step. C is the KV-bound concurrency above (capped so the step fits the token budget); more
 *   concurrency only helps (step time is affine in C), so C/T(C) at that C bounds the throughput.
 * The regime's ceiling is the smallest of the three.
 *
 * Barriered stages also get their own bound (stage-limits.ts): a stage is measured from its start to
 * its last completion, so its ramp-up — no more sequences running than have arrived — counts
 * against it, which the steady-state ceiling leaves out; and a stage's hits are its own requests'
 * (each regime's hit tokens are also summed per stage), so the stages after a warm-up are not
 * charged for the prefixes it computed. `kvgate simulate` reads each saturated stage against the
 * lower of the two, and against the stage's even share (even-share.ts: the engines themselves with
 * the stage dealt evenly and every block of the bound's regime a hit), what routing can reach.
 *
 * A fleet with a CPU offload tier also gets its host-link bound: at most (load bandwidth ÷ KV bytes
 * per token) tokens/s come back from CPU per replica, so when every hit of the "repeat" regime is a
 * CPU hit the fleet serves at most replicas × that ÷ (hit tokens per request) requests/s; with a
 * shared storage, its read bound likewise (fleet-wide). On such a fleet a regime whose resident set
 * does not fit HBM may still be reached from the tiers, every hit paying its link: limits-tiers.ts
 * computes that second placement and the regime's ceiling is the better of the two.
 */
import type { RequestSpec, Workload } from "../../bench/workloads/types.ts";
import { DEFAULT_HOST_LINK_BYTES_PER_SECOND } from "../../engine/cpu-tier.ts";
import { FastRequestBlockHasher, fastRoot } from "../../engine/fast-block-hash.ts";
import { kvBytesPerToken, stepTime } from "../../engine/profile.ts";
import { ROLE_LABEL } from "../../scheduler/plugins/filters/labels.ts";
import { ABSENT, BlockSet, COMPUTED } from "./block-set.ts";
import { type EvenShareJob, evenShare } from "./even-share.ts";
import { type LinkLimit, linkLimit, tierCapacity, type ViaTiers, viaTiers } from "./limits-tiers.ts";
import type { PromptTokenizer } from "./prompt-tokens.ts";
import type { FleetConfig } from "./replica.ts";
import { mixedStep, type RegimeName, type StageLimit, stageLimits } from "./stage-limits.ts";
import { TextMap } from "./text-map.ts";

export interface RegimeLimit {
  prefix_hit_rate: number;
  uncached_prompt_tokens_mean: number;
  prefill_requests_per_s: number;
  prefill_output_tokens_per_s: number;
  resident_tokens_per_replica: number;
  /** False when the resident set does not fit the KV cache: the regime is unreachable. */
  resident_fits: boolean;
  live_tokens_per_request: number;
  concurrency_per_replica: number;
  decode_step_s: number;
  decode_output_tokens_per_s: number;
  /** Sequences per step in the mixed-step bound, and that step's time. */
  mixed_concurrency_per_replica: number;
  mixed_step_s: number;
  mixed_output_tokens_per_s: number;
  output_tokens_per_s: number;
  /** Tiered fleets: the regime with its resident set in the tiers (limits-tiers.ts). */
  via_tiers?: ViaTiers;
}

export interface Limits {
  replicas: number;
  kv_tokens_per_replica: number;
  requests: number;
  prompt_tokens_mean: number;
  output_tokens_mean: number;
  prefill_chunk_tokens: number;
  prefill_chunk_s: number;
  prefill_tokens_per_s_per_replica: number;
  regimes: { zero: RegimeLimit; group: RegimeLimit; repeat: RegimeLimit };
  /** The CPU tier's host-link bound (fleets with kvOffload only). */
  offload?: OffloadLimit;
  /**
   * Barriered stages only: each non-warm-up stage's bound over its own window, ramp-up included,
   * with its own requests' hits under each regime, the best kept (stage-limits.ts).
   */
  stages?: StageLimit[];
}

/** What the host link lets come back from CPU when every "repeat" hit is a CPU hit. */
export interface OffloadLimit {
  load_bytes_per_s: number;
  kv_bytes_per_token: number;
  /** load_bytes_per_s ÷ kv_bytes_per_token. */
  load_tokens_per_s_per_replica: number;
  /** The "repeat" regime's hit tokens per request. */
  hit_tokens_per_request: number;
  requests_per_s: number;
  prompt_tokens_per_s: number;
  output_tokens_per_s: number;
  /** The shared storage's read bound when every "all repeats" hit comes from storage (fleet-wide). */
  storage?: LinkLimit;
}

/** The host-link bound of a fleet with a CPU tier (see the module comment); undefined without one. */
export function offloadLimit(
  fleet: FleetConfig,
  hitTokensPerRequest: number,
  promptMean: number,
  outputMean: number,
): OffloadLimit | undefined {
  if (fleet.kvOffload === undefined) return undefined;
  const bw = fleet.kvOffload.loadBandwidth ?? DEFAULT_HOST_LINK_BYTES_PER_SECOND;
  const perToken = kvBytesPerToken(fleet.profile.model);
  const tokens = bw / perToken;
  const reqs =
    hitTokensPerRequest > 0 ? (fleet.replicas * tokens) / hitTokensPerRequest : Number.POSITIVE_INFINITY;
  const st = tierCapacity(fleet);
  return {
    load_bytes_per_s: bw,
    kv_bytes_per_token: perToken,
    load_tokens_per_s_per_replica: tokens,
    hit_tokens_per_request: hitTokensPerRequest,
    requests_per_s: reqs,
    prompt_tokens_per_s: reqs * promptMean,
    output_tokens_per_s: reqs * outputMean,
    ...(st !== null &&
      st.storageBandwidth > 0 && {
        storage: linkLimit(st.storageBandwidth, perToken, 1, hitTokensPerRequest, promptMean, outputMean),
      }),
  };
}

interface PromptInfo {
  tokens: number;
  /** Full-block hashes as 53-bit numbers (collisions here only blur an estimate). */
  blocks: number[];
  /**
   * Requests with this prompt walked so far. After two, every block of it is in `seen` and every
   * hittable one REUSED, so later ones hit all of them and change nothing: they skip the walk.
   */
  visits: number;
}

/** A group's distinct prompts (arrival order), and per prompt its best match among the first `upTo`. */
interface Group {
  prompts: PromptInfo[];
  best: Map<PromptInfo, { blocks: number; upTo: number }>;
}

/** Limits of `workload` on `fleet`; prompts are tokenized as the replicas would see them. */
export function computeLimits(workload: Workload, fleet: FleetConfig, tok: PromptTokenizer): Limits {
  const bs = fleet.blockSize;
  const root = fastRoot("limits");
  // Prompts are identified by their text (completion prompt, or rendered chat template).
  const completions = new TextMap<PromptInfo>();
  const chats = new TextMap<PromptInfo>();
  const promptOf = (r: RequestSpec): PromptInfo => {
    const chat = r.kind === "chat";
    const text = chat
      ? tok.tokenizer.applyChatTemplate(r.messages ?? [], { addGenerationPrompt: true })
      : (r.prompt ?? "");
    const info = chat ? chats : completions;
    let p = info.get(text);
    if (p === undefined) {
      const ids = chat ? tok.chat(r.messages ?? []) : tok.completion(text);
      const h = new FastRequestBlockHasher(root, bs, Math.floor(ids.length / bs));
      h.update(Int32Array.from(ids), ids.length);
      const blocks = new Array<number>(h.count);
      for (let i = 0; i < h.count; i++) blocks[i] = (h.his[i] & 0x1fffff) * 4294967296 + (h.los[i] >>> 0);
      p = { tokens: ids.length, blocks, visits: 0 };
      info.set(text, p);
    }
    return p;
  };
  const reqs = workload.requests
    .map((r, i) => ({ r, i }))
    .sort((a, b) => a.r.arrivalTime - b.r.arrivalTime || a.i - b.i)
    .map((x) => x.r);
  const n = reqs.length;
  const groupOf = (r: RequestSpec) =>
    r.groupId !== undefined ? `g${r.groupId}` : r.sessionId !== undefined ? `s${r.sessionId}` : undefined;

  // Each group's distinct prompts seen so far (arrival order): a request reuses the longest prefix it
  // shares with one of them.
  const groups = new Map<string, Group>();
  let promptSum = 0;
  let outputSum = 0;
  let groupHits = 0;
  let repeatHits = 0;
  /** Blocks computed so far, REUSED once some later request reused them. */
  const seen = new BlockSet();
  let reused = 0;
  const groupResident = new Map<string, number>();
  /** Per stage: requests, prompt and output tokens, and each regime's hit tokens (stage bounds). */
  const perStage = new Map<number, StageSums>();
  for (const r of reqs) {
    const p = promptOf(r);
    promptSum += p.tokens;
    outputSum += r.maxTokens;
    const groupBefore = groupHits;
    const repeatBefore = repeatHits;
    const cap = Math.floor((p.tokens - 1) / bs);
    const g = groupOf(r);
    if (g !== undefined) {
      let group = groups.get(g);
      if (group === undefined) groups.set(g, (group = { prompts: [], best: new Map() }));
      const earlier = group.prompts;
      // The group's first request computes its prefix; later ones reuse what an earlier one shares.
      if (earlier.length > 0) {
        // The best match among the group's prompts, extended over those that joined since last time.
        let m = group.best.get(p);
        if (m === undefined) group.best.set(p, (m = { blocks: 0, upTo: 0 }));
        for (; m.upTo < earlier.length; m.upTo++) {
          const q = earlier[m.upTo];
          if (q !== p) m.blocks = Math.max(m.blocks, commonBlocks(p.blocks, q.blocks));
        }
        const shared = Math.min(m.blocks, cap);
        groupHits += shared * bs;
        groupResident.set(g, Math.max(groupResident.get(g) ?? 0, shared * bs));
      }
      if (!earlier.includes(p)) earlier.push(p);
    }
    if (p.visits++ >= 2) repeatHits += cap * bs;
    else {
      let k = 0;
      for (; k < cap; k++) {
        const b = p.blocks[k];
        const state = seen.state(b);
        if (state === ABSENT) break;
        if (state === COMPUTED) {
          seen.markReused(b);
          reused++;
        }
      }
      repeatHits += k * bs;
      for (const b of p.blocks) seen.add(b);
    }
    if (r.stage !== undefined) {
      let s = perStage.get(r.stage);
      if (s === undefined) perStage.set(r.stage, (s = stageSums()));
      const o = r.maxTokens;
      s.requests++;
      s.prompt += p.tokens;
      s.output += o;
      s.groupHits += groupHits - groupBefore;
      s.repeatHits += repeatHits - repeatBefore;
      // The engine emits a request's first token from its prefill step and decodes the other O − 1 at
      // contexts P + 1 … P + O − 1; it holds U + m private tokens while making token m + 1.
      s.decodeRead += (o - 1) * p.tokens + (o * (o - 1)) / 2;
      s.outputPairs += (o * (o - 1)) / 2;
      const uncached = [
        p.tokens,
        p.tokens - (groupHits - groupBefore),
        p.tokens - (repeatHits - repeatBefore),
      ];
      s.jobs.push({
        at: r.arrivalTime,
        prompt: p.tokens,
        output: o,
        cached: [0, groupHits - groupBefore, repeatHits - repeatBefore],
      });
      for (let k = 0; k < 3; k++) {
        const u = uncached[k];
        s.byRegime[k].attention += u * (p.tokens - u / 2);
        s.byRegime[k].uncachedOutput += u * o;
      }
    }
  }
  let groupResidentSum = 0;
  for (const v of groupResident.values()) groupResidentSum += v;

  const chunk = fleet.maxNumBatchedTokens;
  const chunkS = stepTime(fleet.profile, {
    prefills: [{ tokens: chunk, context: 0 }],
    decodeContexts: [],
  }).total;
  const prefillRate = chunk / chunkS;
  const kv = (fleet.numGpuBlocks - 1) * bs;
  const promptMean = n ? promptSum / n : 0;
  const outputMean = n ? outputSum / n : 0;
  /** A regime's bounds; `inHbm`: the resident tokens per replica held in HBM (all of them by default). */
  const regime = (hits: number, resident: number, inHbm = resident / fleet.replicas): RegimeLimit => {
    const uncached = n ? (promptSum - hits) / n : 0;
    const reqRate = uncached > 0 ? (fleet.replicas * prefillRate) / uncached : Number.POSITIVE_INFINITY;
    const residentPer = resident / fleet.replicas;
    const live = uncached + outputMean / 2;
    const free = kv - inHbm;
    const conc = Math.max(
      0,
      Math.min(fleet.maxNumSeqs, live > 0 ? Math.floor(free / live) : fleet.maxNumSeqs),
    );
    const ctx = Math.round(promptMean + outputMean / 2);
    const dStep =
      conc > 0
        ? stepTime(fleet.profile, { prefills: [], decodeContexts: new Array(conc).fill(ctx) }).total
        : 0;
    const decodeOut = conc > 0 ? (fleet.replicas * conc) / dStep : 0;
    const prefillOut = reqRate * outputMean;
    const mixed = mixedStep(fleet, conc, uncached, promptMean, outputMean);
    return {
      prefix_hit_rate: promptSum > 0 ? hits / promptSum : 0,
      uncached_prompt_tokens_mean: uncached,
      prefill_requests_per_s: reqRate,
      prefill_output_tokens_per_s: prefillOut,
      resident_tokens_per_replica: residentPer,
      resident_fits: free > 0,
      live_tokens_per_request: live,
      concurrency_per_replica: conc,
      decode_step_s: dStep,
      decode_output_tokens_per_s: decodeOut,
      mixed_concurrency_per_replica: mixed.concurrency,
      mixed_step_s: mixed.step,
      mixed_output_tokens_per_s: mixed.output,
      output_tokens_per_s: Math.min(prefillOut, decodeOut, mixed.output),
    };
  };
  const tiers = tierCapacity(fleet);
  /** The regime, or its tiered placement when that serves more (limits-tiers.ts). */
  const tiered = (hits: number, resident: number): RegimeLimit => {
    const base = regime(hits, resident);
    if (tiers === null) return base;
    const via = viaTiers(
      tiers,
      fleet.replicas,
      resident / fleet.replicas,
      n ? hits / n : 0,
      outputMean,
      (h) => regime(hits, resident, h),
    );
    if (via === null || via.output_tokens_per_s <= base.output_tokens_per_s) return base;
    return {
      ...regime(hits, resident, via.resident_in_hbm_per_replica),
      via_tiers: via,
      output_tokens_per_s: via.output_tokens_per_s,
    };
  };
  const regimes = {
    zero: regime(0, 0),
    group: tiered(groupHits, groupResidentSum),
    repeat: tiered(repeatHits, reused * bs),
  };
  // Each stage under each regime, with that stage's own requests: its prompts' hits counted against
  // every earlier request (the warm-up's cold prefixes are not charged to the stages after it).
  const hbmFree = (g: RegimeLimit) =>
    kv - (g.via_tiers?.resident_in_hbm_per_replica ?? g.resident_tokens_per_replica);
  const stageRegimes = (
    [
      [regimes.zero, () => 0],
      [regimes.group, (s: StageSums) => s.groupHits],
      [regimes.repeat, (s: StageSums) => s.repeatHits],
    ] as const
  ).map(([g, hits], k) => ({
    name: REGIMES[k],
    freeTokensPerReplica: hbmFree(g),
    stages: new Map(
      [...perStage].map(([i, s]) => [
        i,
        {
          uncachedMean: (s.prompt - hits(s)) / s.requests,
          promptMean: s.prompt / s.requests,
          outputMean: s.output / s.requests,
          perToken:
            s.output > 0
              ? {
                  decodeContext: s.decodeRead / s.output,
                  prefillTokens: (s.prompt - hits(s)) / s.output,
                  prefillAttention: s.byRegime[k].attention / s.output,
                  privateTokens: (s.byRegime[k].uncachedOutput + s.outputPairs) / s.output,
                }
              : undefined,
        },
      ]),
    ),
  }));
  const stages = stageLimits(workload, fleet, stageRegimes);
  // Each bounded stage on the engines themselves, dealt evenly, under the regime its bound was read
  // in; not for one side of a P/D fleet, whose engines do not run whole requests.
  const role = fleet.labels[ROLE_LABEL];
  for (const b of role === "prefill" || role === "decode" ? [] : (stages ?? [])) {
    const sums = perStage.get(b.index);
    const start = workload.stages.find((x) => x.index === b.index)?.start ?? 0;
    const k = REGIMES.indexOf(b.regime);
    if (sums === undefined) continue;
    const jobs: EvenShareJob[] = sums.jobs.map((j) => ({
      at: j.at - start,
      prompt: j.prompt,
      cached: j.cached[k],
      output: j.output,
    }));
    const run = evenShare(fleet, jobs, stageRegimes[k].freeTokensPerReplica);
    if (run === null || !(run.end > 0)) continue;
    b.even_share_end_s = run.end;
    b.even_share_output_tokens_per_s = b.output_tokens / run.end;
  }
  return {
    replicas: fleet.replicas,
    kv_tokens_per_replica: kv,
    requests: n,
    prompt_tokens_mean: promptMean,
    output_tokens_mean: outputMean,
    prefill_chunk_tokens: chunk,
    prefill_chunk_s: chunkS,
    prefill_tokens_per_s_per_replica: prefillRate,
    regimes,
    ...(fleet.kvOffload !== undefined && {
      offload: offloadLimit(fleet, n ? repeatHits / n : 0, promptMean, outputMean),
    }),
    ...(stages !== undefined && { stages }),
  };
}

interface StageSums {
  requests: number;
  prompt: number;
  output: number;
  groupHits: number;
  repeatHits: number;
  /** Σ over requests of the KV tokens their decode steps read: (O − 1)·P + O(O − 1)/2. */
  decodeRead: number;
  /** Σ O(O − 1)/2: the generated tokens a request holds, summed over its steps. */
  outputPairs: number;
  /** Per regime (zero, group, repeat): Σ U(P − U/2), the prefill attention work, and Σ U·O. */
  byRegime: { attention: number; uncachedOutput: number }[];
  /** The stage's requests in arrival order, each with its cached tokens per regime (even-share.ts). */
  jobs: { at: number; prompt: number; output: number; cached: [number, number, number] }[];
}

const REGIMES: readonly RegimeName[] = ["zero", "group", "repeat"];

function stageSums(): StageSums {
  return {
    requests: 0,
    prompt: 0,
    output: 0,
    groupHits: 0,
    repeatHits: 0,
    decodeRead: 0,
    outputPairs: 0,
    byRegime: [0, 1, 2].map(() => ({ attention: 0, uncachedOutput: 0 })),
    jobs: [],
  };
}

function commonBlocks(a: readonly number[], b: readonly number[]): number {
  const m = Math.min(a.length, b.length);
  let k = 0;
  while (k < m && a[k] === b[k]) k++;
  return k;
}
