/**
 * transfer-cost-pd-decider (kvgate): a P/D decider that disaggregates only when a remote prefill
 * costs the decode target less than doing it there, beside llm-d's prefix-based-pd-decider, which
 * disaggregates whenever enough of the prompt is uncached, however slow the link or busy the
 * prefill pool.
 *
 * For the decode target D the disagg-profile-handler picked:
 *   uncached = prompt tokens − tokens D holds (prefix-match info; the tokens the decoder would pull)
 *   local    = (queued_D + uncached) / rate_D
 *              the time D spends prefilling — its gateway-tracked in-flight uncached prompt tokens
 *              (queued_D) plus this prompt — at D's prefill rate, during which D's decoding
 *              streams stall. The in-flight load producer counts a disaggregated request's prompt
 *              on its decode endpoint too, though that endpoint pulls rather than computes it, so
 *              the decider keeps its own ledger of the requests it disaggregated (from the pick to
 *              the decode endpoint's first token) and takes their tokens out of queued_D.
 *   remote   = uncached × kvBytesPerToken / (linkBandwidthGBps · 1e9) + transferOverheadMs / 1000
 *              + min over prefill endpoints P of queued_P / rate_P
 *              the extra wait a remote prefill adds: the KV pull and the queue of the least
 *              loaded prefill endpoint (the compute itself moves to the prefill pool, where it
 *              stalls no decode)
 *   disaggregate iff uncached ≥ nonCachedTokens and remote < local.
 * rate_X is X's prefill throughput learned from its own first-token times (the in-flight load
 * producer's), else peakPrefillThroughput. Prefill endpoints carry only P/D legs, whose first
 * token the gateway does not time, so theirs is peakPrefillThroughput unless they also serve
 * whole requests. With no prefill endpoint among the candidates it never disaggregates.
 *
 * Parameters and why their defaults:
 *   kvBytesPerToken 131072      Llama-3.1-8B BF16 (2 · 32 layers · 8 KV heads · 128 · 2 bytes),
 *                               the default profile's; set it to the served model's.
 *   linkBandwidthGBps 8         RDMA (NIXL over RoCE/InfiniBand) measures 5–11 GB/s per transfer
 *                               (llm-d v0.5 blog; vLLM PR #25388); use ~0.5 for a TCP fallback.
 *   transferOverheadMs 5        NIXL's post + notification time per transfer, 1–7 ms measured
 *                               (vLLM docs/features/nixl_connector_usage.md, vLLM #50913).
 *   peakPrefillThroughput 15928 tokens/s until a rate is learned; llm-d's calibration for
 *                               Qwen3-32B on 2×H100 (the prefix-cache-affinity-filter's default).
 *   nonCachedTokens 0           an llm-d-style floor on uncached tokens as well (0 = none).
 */
import { z } from "zod";
import type { PluginHandle } from "../../plugin-spec.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  Decider,
  EndpointState,
  PreRequestHook,
  RequestFacts,
  ResponseHooks,
  ScheduleResult,
  TypedName,
} from "../../types.ts";
import type { InFlightInfo, PrefixMatchInfo } from "../data.ts";
import { inflightKey, prefixKey } from "../data.ts";
import { ROLE_LABEL } from "../filters/labels.ts";
import { flatPrompt } from "../prefix/hashing.ts";

export const TRANSFER_COST_DECIDER = "transfer-cost-pd-decider";

const PREFILL_PROFILE = "prefill";

/** Roles the prefill-filter keeps (llm-d.ai/role). */
const PREFILL_ROLES = new Set([
  "prefill",
  "encode-prefill",
  "prefill-decode",
  "both",
  "encode-prefill-decode",
]);

export const transferCostParams = z.strictObject({
  kvBytesPerToken: z.number().positive().default(131072),
  linkBandwidthGBps: z.number().positive().default(8),
  transferOverheadMs: z.number().nonnegative().default(5),
  peakPrefillThroughput: z.number().positive().default(15928),
  nonCachedTokens: z.number().int().nonnegative().default(0),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
  inFlightLoadProducerName: z.string().min(1).optional(),
});
export type TransferCostParams = z.output<typeof transferCostParams>;

/** The figures of one decision (the last one is kept for /explain-style inspection). */
export interface TransferCostDecision {
  uncachedTokens: number;
  localS: number;
  remoteS: number;
  prefillEndpoint: string | null;
  disaggregate: boolean;
}

export class TransferCostPdDecider implements Decider, PreRequestHook, ResponseHooks {
  readonly typedName: TypedName;
  readonly #prefix: DataKey<PrefixMatchInfo>;
  readonly #inflight: DataKey<InFlightInfo>;
  readonly decisions = { disaggregate: 0, local: 0, "no-prefill-endpoint": 0, "below-threshold": 0 };
  last: TransferCostDecision | null = null;
  /** This cycle's yes (request id, decode endpoint, tokens), confirmed by preRequest. */
  #pending: { requestId: string; decoder: string; tokens: number } | null = null;
  /** Disaggregated requests not yet started on their decode endpoint: id → [decoder, tokens]. */
  readonly #ledger = new Map<string, [string, number]>();
  /** Per decode endpoint: Σ tokens of its ledger entries. */
  readonly #pulled = new Map<string, number>();

  constructor(
    name: string,
    readonly params: TransferCostParams,
    readonly handle: PluginHandle,
  ) {
    this.typedName = { type: TRANSFER_COST_DECIDER, name };
    this.#prefix = prefixKey(params.prefixMatchInfoProducerName as string);
    this.#inflight = inflightKey(params.inFlightLoadProducerName as string);
  }

  consumes() {
    return { required: [this.#prefix, this.#inflight] };
  }

  decide(cycle: CycleState, decodeTarget: EndpointState): boolean {
    const p = this.params;
    const input = flatPrompt(cycle, this.handle.hasher).tokenCount;
    const info = cycle.get(this.#prefix);
    const cached = info === undefined ? 0 : info.matchBlocks(decodeTarget.id) * info.blockSizeTokens;
    const uncached = Math.max(0, input - cached);
    if (uncached === 0 || uncached < p.nonCachedTokens) {
      this.decisions["below-threshold"]++;
      return false;
    }
    const load = cycle.get(this.#inflight);
    const rate = (id: string) => load?.prefillRate?.(id) ?? p.peakPrefillThroughput;
    const queued = (id: string) => load?.tokens(id) ?? 0;
    let bestQueue = Number.POSITIVE_INFINITY;
    let best: string | null = null;
    for (const e of cycle.candidates) {
      const role = e.labels[ROLE_LABEL];
      if (role === undefined || !PREFILL_ROLES.has(role) || e.id === decodeTarget.id) continue;
      const q = queued(e.id) / rate(e.id);
      if (q < bestQueue) {
        bestQueue = q;
        best = e.id;
      }
    }
    if (best === null) {
      this.decisions["no-prefill-endpoint"]++;
      return false;
    }
    const own = Math.max(0, queued(decodeTarget.id) - (this.#pulled.get(decodeTarget.id) ?? 0));
    const localS = (own + uncached) / rate(decodeTarget.id);
    const remoteS =
      (uncached * p.kvBytesPerToken) / (p.linkBandwidthGBps * 1e9) + p.transferOverheadMs / 1000 + bestQueue;
    const disaggregate = remoteS < localS;
    this.last = { uncachedTokens: uncached, localS, remoteS, prefillEndpoint: best, disaggregate };
    this.decisions[disaggregate ? "disaggregate" : "local"]++;
    this.#pending = disaggregate
      ? { requestId: cycle.request.requestId, decoder: decodeTarget.id, tokens: uncached }
      : null;
    return disaggregate;
  }

  /** The pick: a request this decider disaggregated, with a prefill target, enters the ledger. */
  preRequest(_cycle: CycleState, result: ScheduleResult): void {
    const p = this.#pending;
    this.#pending = null;
    if (p === null || p.requestId !== result.requestId || !result.profiles[PREFILL_PROFILE]?.target) return;
    this.#ledger.set(p.requestId, [p.decoder, p.tokens]);
    this.#pulled.set(p.decoder, (this.#pulled.get(p.decoder) ?? 0) + p.tokens);
  }

  onResponseStarted(req: RequestFacts): void {
    this.#settle(req.requestId);
  }

  onResponseComplete(req: RequestFacts): void {
    this.#settle(req.requestId);
  }

  #settle(id: string): void {
    const e = this.#ledger.get(id);
    if (e === undefined) return;
    this.#ledger.delete(id);
    const left = (this.#pulled.get(e[0]) ?? 0) - e[1];
    if (left > 0) this.#pulled.set(e[0], left);
    else this.#pulled.delete(e[0]);
  }

  stats() {
    return { ...this.decisions, inFlightDisaggregated: this.#ledger.size };
  }
}

export const transferCostDeciderSpec = spec({
  type: TRANSFER_COST_DECIDER,
  stability: "alpha",
  kind: "decider",
  kvgateOnly: true,
  summary:
    "Runs prefill separately only when the KV transfer plus the prefill pool's queue costs less than prefilling on the decode endpoint.",
  params: transferCostParams,
  needs: () => [
    { family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true },
    { family: "inflight-load", param: "inFlightLoadProducerName", required: true },
  ],
  factory: (name, p, handle) => new TransferCostPdDecider(name, p, handle),
});
