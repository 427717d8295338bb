/**
 * Hardware/model profiles and the roofline step-time model of one engine step.
 *
 * One vLLM V1 step runs prefill chunks and decodes in one forward pass, so its time is modelled as
 * additive terms (after the basis functions of BLIS's trained-physics model, inference-sim/inference-sim
 * `sim/latency/trained_physics_model.go`):
 *   T = t_step + c_req·B
 *       + W_streamed / (η_w · BW)                         weights read once per step
 *       + Σ_decode ctx_i · kv_bytes / (η_kv · BW)         KV read for each decoding sequence
 *       + 2 · P_nonemb · T_pf / (mfu · FLOPS)             prefill GEMMs
 *       + 4 · L · H · dh · Σ_chunks T·(ctx + T/2) / (mfu_attn · FLOPS)   prefill attention
 * with BW and FLOPS summed over the TP group, and prefill compute × (1 + tp_overhead) when TP > 1.
 * Profiles are data (profiles/*.yaml); this module only validates and evaluates them.
 */

export interface ModelSpec {
  name: string;
  numLayers: number;
  hiddenSize: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  intermediateSize: number;
  vocabSize: number;
  /** Parameters excluding the input embedding (the GEMM work per token). */
  paramsNonEmbedding: number;
  /** Bytes per weight and per KV element (2 for BF16). */
  dtypeBytes: number;
}

export interface HardwareSpec {
  gpu: string;
  tensorParallel: number;
  /** Per GPU, bytes/s. */
  memBandwidth: number;
  /** Per GPU, dense BF16 FLOP/s. */
  peakFlops: number;
  memGiB: number;
}

export interface Efficiency {
  weights: number;
  kv: number;
  prefillMfu: number;
  attentionMfu: number;
  /** Extra fraction of prefill compute when TP > 1 (all-reduces). */
  tpOverhead: number;
}

export interface Profile {
  name: string;
  description: string;
  model: ModelSpec;
  hardware: HardwareSpec;
  efficiency: Efficiency;
  /** Fixed cost per step, seconds (launches, sampler, all-reduce latency). */
  stepOverhead: number;
  /** Cost per scheduled request per step, seconds. */
  perRequestOverhead: number;
  /** KV capacity of one instance in tokens (across its TP group), before block rounding. */
  kvCapacityTokens: number;
  defaults: { maxNumSeqs: number; maxNumBatchedTokens: number; maxModelLen: number };
  /** Where the numbers come from. */
  sources: string[];
}

/** KV bytes one token occupies across the TP group: K and V, every layer, every KV head. */
export function kvBytesPerToken(m: ModelSpec): number {
  return 2 * m.numLayers * m.numKvHeads * m.headDim * m.dtypeBytes;
}

/** Weight bytes read every step: the non-embedding weights plus the LM head. */
export function weightBytesStreamed(m: ModelSpec): number {
  return (m.paramsNonEmbedding + m.vocabSize * m.hiddenSize) * m.dtypeBytes;
}

/** Blocks of `blockSize` tokens that fit the profile's KV capacity, plus vLLM's null block. */
export function numGpuBlocksFor(p: Profile, blockSize: number): number {
  return Math.floor(p.kvCapacityTokens / blockSize) + 1;
}

/** One prefill chunk in a step: `tokens` new tokens after `context` already computed ones. */
export interface PrefillChunk {
  tokens: number;
  context: number;
}

/** The composition of one step, as the step-time model needs it. */
export interface BatchShape {
  prefills: PrefillChunk[];
  /** Context length (tokens already in KV) of each decoding sequence. */
  decodeContexts: number[];
}

export interface StepTimeBreakdown {
  overhead: number;
  weights: number;
  kvRead: number;
  prefillGemm: number;
  prefillAttention: number;
  total: number;
}

/** Modelled time of one step, in seconds, with its parts. An empty batch costs nothing. */
export function stepTime(p: Profile, batch: BatchShape): StepTimeBreakdown {
  const m = p.model;
  const hw = p.hardware;
  const e = p.efficiency;
  const nReq = batch.prefills.length + batch.decodeContexts.length;
  if (nReq === 0)
    return { overhead: 0, weights: 0, kvRead: 0, prefillGemm: 0, prefillAttention: 0, total: 0 };
  const bw = hw.memBandwidth * hw.tensorParallel;
  const flops = hw.peakFlops * hw.tensorParallel;
  const overhead = p.stepOverhead + p.perRequestOverhead * nReq;
  const weights = weightBytesStreamed(m) / (e.weights * bw);
  let ctxSum = 0;
  for (const c of batch.decodeContexts) ctxSum += c;
  const kvRead = (ctxSum * kvBytesPerToken(m)) / (e.kv * bw);
  let pfTokens = 0;
  let attnWork = 0;
  for (const c of batch.prefills) {
    pfTokens += c.tokens;
    attnWork += c.tokens * (c.context + c.tokens / 2);
  }
  const tpFactor = hw.tensorParallel > 1 ? 1 + e.tpOverhead : 1;
  const prefillGemm = ((2 * m.paramsNonEmbedding * pfTokens) / (e.prefillMfu * flops)) * tpFactor;
  const prefillAttention =
    ((4 * m.numLayers * m.numHeads * m.headDim * attnWork) / (e.attentionMfu * flops)) * tpFactor;
  const total = overhead + weights + kvRead + prefillGemm + prefillAttention;
  return { overhead, weights, kvRead, prefillGemm, prefillAttention, total };
}

/** Checks a profile read from a file; throws an Error naming the first bad field. */
export function validateProfile(raw: unknown, origin: string): Profile {
  const fail = (path: string, why: string): never => {
    throw new Error(`profile ${origin}: ${path} ${why}`);
  };
  if (typeof raw !== "object" || raw === null) fail("(root)", "must be a mapping");
  const p = raw as Record<string, unknown>;
  const obj = (v: unknown, path: string): Record<string, unknown> => {
    if (typeof v !== "object" || v === null || Array.isArray(v)) fail(path, "must be a mapping");
    return v as Record<string, unknown>;
  };
  const pos = (o: Record<string, unknown>, k: string, path: string): number => {
    const v = o[k];
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0)
      fail(`${path}.${k}`, "must be a positive number");
    return v as number;
  };
  const nonneg = (o: Record<string, unknown>, k: string, path: string): number => {
    const v = o[k];
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) fail(`${path}.${k}`, "must be a number ≥ 0");
    return v as number;
  };
  const str = (o: Record<string, unknown>, k: string, path: string): string => {
    const v = o[k];
    if (typeof v !== "string" || v === "") fail(`${path}.${k}`, "must be a non-empty string");
    return v as string;
  };
  const m = obj(p.model, "model");
  const hw = obj(p.hardware, "hardware");
  const ef = obj(p.efficiency, "efficiency");
  const d = obj(p.defaults, "defaults");
  const sources = p.sources;
  if (!Array.isArray(sources) || sources.some((s) => typeof s !== "string"))
    fail("sources", "must be a list of strings");
  const frac = (o: Record<string, unknown>, k: string, path: string): number => {
    const v = pos(o, k, path);
    if (v > 1) fail(`${path}.${k}`, "must be in (0, 1]");
    return v;
  };
  return {
    name: str(p, "name", "(root)"),
    description: typeof p.description === "string" ? p.description : "",
    model: {
      name: str(m, "name", "model"),
      numLayers: pos(m, "numLayers", "model"),
      hiddenSize: pos(m, "hiddenSize", "model"),
      numHeads: pos(m, "numHeads", "model"),
      numKvHeads: pos(m, "numKvHeads", "model"),
      headDim: pos(m, "headDim", "model"),
      intermediateSize: pos(m, "intermediateSize", "model"),
      vocabSize: pos(m, "vocabSize", "model"),
      paramsNonEmbedding: pos(m, "paramsNonEmbedding", "model"),
      dtypeBytes: pos(m, "dtypeBytes", "model"),
    },
    hardware: {
      gpu: str(hw, "gpu", "hardware"),
      tensorParallel: pos(hw, "tensorParallel", "hardware"),
      memBandwidth: pos(hw, "memBandwidth", "hardware"),
      peakFlops: pos(hw, "peakFlops", "hardware"),
      memGiB: pos(hw, "memGiB", "hardware"),
    },
    efficiency: {
      weights: frac(ef, "weights", "efficiency"),
      kv: frac(ef, "kv", "efficiency"),
      prefillMfu: frac(ef, "prefillMfu", "efficiency"),
      attentionMfu: frac(ef, "attentionMfu", "efficiency"),
      tpOverhead: nonneg(ef, "tpOverhead", "efficiency"),
    },
    stepOverhead: nonneg(p, "stepOverhead", "(root)"),
    perRequestOverhead: nonneg(p, "perRequestOverhead", "(root)"),
    kvCapacityTokens: pos(p, "kvCapacityTokens", "(root)"),
    defaults: {
      maxNumSeqs: pos(d, "maxNumSeqs", "defaults"),
      maxNumBatchedTokens: pos(d, "maxNumBatchedTokens", "defaults"),
      maxModelLen: pos(d, "maxModelLen", "defaults"),
    },
    sources: sources as string[],
  };
}
