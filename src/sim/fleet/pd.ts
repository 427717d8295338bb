/**
 * Prefill/decode disaggregation in the fleet simulator: the two legs of a request the scheduler
 * sent to a prefill endpoint as well as a decode one, as llm-d's routing sidecar runs them against
 * vLLM's NixlConnector, and the KV transfer between them on the modelled link (kv-link.ts).
 *
 *   1. Prefill leg on the prefill replica: the prompt with max tokens 1 and remoteDecode; its one
 *      token is not returned to the client. When it finishes, the engine holds its blocks.
 *   2. Decode leg on the decode replica (delivered when the prefill leg ends): remotePrefill; the
 *      engine allocates its blocks and keeps it waiting (reason "deferred") for the KV.
 *   3. Transfer: once the decode engine has allocated the blocks, the decoder pulls the tokens it
 *      does not hold (prompt − its own prefix-cache hit) × the profile's KV bytes per token; the
 *      first pull of a (decoder, prefiller) pair waits for the handshake.
 *   4. Transfer done: the decode engine is told (completeRemoteKv) and decodes; the prefill engine
 *      frees the held blocks (releaseHeld). The client's first token is the decode engine's.
 *
 * The fleet loop (fleet.ts) hands this module every event of a disaggregated request; a request
 * the scheduler gave no prefill target runs on its decode replica as a whole request.
 */
import { percentile } from "../../bench/metrics.ts";
import { kvBytesPerToken } from "../../engine/profile.ts";
import type { EngineRequest, RemoteKvNeed, TokenOutput } from "../../engine/types.ts";
import type { ScheduleResult } from "../../scheduler/types.ts";
import { type EventQueue, Priority } from "./event-queue.ts";
import type { PdSummary } from "./format-pd.ts";
import { KvLink, type KvLinkConfig } from "./kv-link.ts";
import type { LocalityConfig } from "./locality.ts";
import type { Replica } from "./replica.ts";
import { WanLink } from "./wan-link.ts";

/** Appended to a request id for its prefill leg (the engines key requests by id). */
export const PREFILL_LEG = "#prefill";
const PREFILL_PROFILE = "prefill";

const NONE = 0;
const PREFILLING = 1;
const DECODE_LEG = 2;

export class PdRun {
  readonly link: KvLink;
  /** Links between regions, when the fleet has regions (a transfer between two crosses one). */
  readonly wan: WanLink | null;
  readonly #regionLabel: string | null;
  #disaggregated = 0;
  #tokensMoved = 0;
  /** Each transfer's time from the decoder's ask to its KV landing, seconds. */
  readonly #durations: number[] = [];
  #decodeOnly = 0;
  /** Per request: NONE, PREFILLING or DECODE_LEG. */
  readonly #phase: Uint8Array;
  readonly #prefillRep: Int32Array;
  readonly #decodeRep: Int32Array;
  /** When the decoder asked for the KV (its blocks allocated), for the transfer time. */
  readonly #askedAt: Float64Array;
  readonly #transferTokens: Float64Array;
  /** Decode legs whose transfer is requested (awaiting-transfer ids already seen). */
  readonly #asked = new Set<number>();

  constructor(
    readonly replicas: readonly Replica[],
    readonly q: EventQueue,
    readonly n: number,
    readonly indexOf: Map<string, number>,
    link: KvLinkConfig,
    locality?: LocalityConfig,
  ) {
    this.link = new KvLink(link);
    this.wan = locality ? new WanLink(locality.bandwidth, locality.oneWay) : null;
    this.#regionLabel = locality?.label ?? null;
    this.#phase = new Uint8Array(n);
    this.#prefillRep = new Int32Array(n).fill(-1);
    this.#decodeRep = new Int32Array(n).fill(-1);
    this.#askedAt = new Float64Array(n);
    this.#transferTokens = new Float64Array(n);
  }

  /**
   * The scheduler's result for request i: when it has a prefill target, the request becomes a
   * P/D request and the replica its prefill leg goes to is returned; else null (decode only).
   */
  route(
    i: number,
    id: string,
    result: ScheduleResult,
    byEndpoint: ReadonlyMap<string, number>,
  ): Replica | null {
    const p = result.profiles[PREFILL_PROFILE]?.target;
    if (p === undefined || p === null || result.target === null) {
      this.#decodeOnly++;
      return null;
    }
    const pi = byEndpoint.get(p.id);
    const di = byEndpoint.get(result.target.id);
    if (pi === undefined || di === undefined)
      throw new Error(`P/D: scheduler picked unknown endpoint ${p.id}`);
    if (pi === di) {
      this.#decodeOnly++;
      return null;
    }
    this.#disaggregated++;
    this.#phase[i] = PREFILLING;
    this.#prefillRep[i] = pi;
    this.#decodeRep[i] = di;
    this.indexOf.set(id + PREFILL_LEG, this.n + i);
    return this.replicas[pi];
  }

  /** Which leg request i's next delivery is: its prefill leg, its decode leg, or the whole request. */
  leg(i: number): "prefill" | "decode" | "whole" {
    const ph = this.#phase[i];
    return ph === PREFILLING ? "prefill" : ph === DECODE_LEG ? "decode" : "whole";
  }

  /** Request i was dropped (an engine refused a leg): nothing of it is left to orchestrate. */
  forget(i: number, id: string): void {
    if (this.#phase[i] === DECODE_LEG)
      this.replicas[this.#prefillRep[i]].engine.releaseHeld(id + PREFILL_LEG, 0);
    this.#phase[i] = NONE;
    this.indexOf.delete(id + PREFILL_LEG);
  }

  /** The prefill leg's engine request. */
  prefillRequest(id: string, promptTokenIds: number[]): EngineRequest {
    return { id: id + PREFILL_LEG, promptTokenIds, maxTokens: 1, ignoreEos: true, remoteDecode: true };
  }

  /** The decode leg's engine request (the original limits; its KV comes from the prefiller). */
  decodeRequest(id: string, promptTokenIds: number[], maxTokens: number): EngineRequest {
    return { id, promptTokenIds, maxTokens, ignoreEos: true, remotePrefill: true };
  }

  /**
   * An output of prefill leg `i` (index − n in the fleet's table). When the leg ends, the decode
   * leg is delivered to its decode replica now (the sidecar's second request; the loop kept the
   * prompt for it).
   */
  prefillOutput(i: number, out: TokenOutput, now: number): void {
    if (out.record === undefined) return;
    this.#phase[i] = DECODE_LEG;
    this.q.push(now, Priority.DELIVER, "deliver", this.#decodeRep[i], i);
  }

  /**
   * A step of decoder `rep` starting at `now` parked decode legs (their blocks allocated): each asks for
   * its KV. A pair's first pull waits for the handshake (a kv-start event), others start now.
   */
  afterStep(rep: Replica, needs: readonly RemoteKvNeed[], now: number): void {
    for (const need of needs) {
      const i = this.indexOf.get(need.requestId);
      if (i === undefined || i >= this.n || this.#asked.has(i)) continue;
      this.#asked.add(i);
      this.#askedAt[i] = now;
      this.#transferTokens[i] = need.tokens;
      const p = this.replicas[this.#prefillRep[i]];
      const ready = this.link.readyAt(rep.state.id, p.state.id, now);
      if (ready > now) this.q.push(ready, Priority.DELIVER, "kv-start", rep.index, i);
      else this.startTransfer(rep, i, now);
    }
  }

  /** The pull of request i's KV into decoder `rep` starts on the link: its tokens × KV bytes per token. */
  startTransfer(rep: Replica, i: number, now: number): void {
    const tokens = this.#transferTokens[i];
    this.#tokensMoved += tokens;
    const bytes = tokens * this.#kvBytes(rep);
    const tpD = rep.engine.config.profile.hardware.tensorParallel;
    const tpP = this.replicas[this.#prefillRep[i]].engine.config.profile.hardware.tensorParallel;
    const p = this.replicas[this.#prefillRep[i]];
    let done = this.link.start(rep.state.id, bytes, now, this.#askedAt[i], Math.min(tpP, tpD), tpD);
    const from = this.#regionLabel === null ? undefined : p.state.labels[this.#regionLabel];
    const to = this.#regionLabel === null ? undefined : rep.state.labels[this.#regionLabel];
    if (this.wan !== null && from !== undefined && to !== undefined && from !== to)
      done = Math.max(done, this.wan.transfer(from, to, bytes, now));
    this.#durations.push(done - this.#askedAt[i]);
    this.q.push(done, Priority.DELIVER, "kv-done", rep.index, i);
  }

  #kvBytes(rep: Replica): number {
    return kvBytesPerToken(rep.engine.config.profile.model);
  }

  /** Request i's KV landed on decoder `rep`: it may decode, and the prefiller frees its blocks. */
  transferDone(rep: Replica, i: number, now: number, specId: string): Replica {
    const done = rep.engine.completeRemoteKv(specId, now, true);
    if (done.outcome !== "loaded")
      throw new Error(`P/D: ${specId} was not waiting for its KV (${done.outcome})`);
    const p = this.replicas[this.#prefillRep[i]];
    p.engine.releaseHeld(specId + PREFILL_LEG, now);
    this.indexOf.delete(specId + PREFILL_LEG);
    this.#asked.delete(i);
    this.#phase[i] = NONE;
    return p;
  }

  summary(): PdSummary {
    const bySource: Record<string, number> = {};
    for (const rep of this.replicas) {
      const s = rep.engine.stats().promptTokensBySource;
      for (const [k, v] of Object.entries(s)) bySource[k] = (bySource[k] ?? 0) + (v as number);
    }
    const st = this.link.stats;
    return {
      disaggregated: this.#disaggregated,
      decode_only: this.#decodeOnly,
      transfers: st.transfers,
      transferred_tokens: this.#tokensMoved,
      bytes: st.bytes,
      transfer_mean_s: st.transfers > 0 ? st.transferSeconds / st.transfers : null,
      transfer_p50_s: percentile(Float64Array.from(this.#durations).sort(), 50) ?? null,
      handshakes: st.handshakes,
      ...(this.wan !== null
        ? { cross_region_transfers: this.wan.stats.transfers, cross_region_bytes: this.wan.stats.bytes }
        : {}),
      prompt_tokens_by_source: bySource,
    };
  }
}
