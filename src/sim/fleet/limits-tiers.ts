/**
 * Limits of a fleet whose KV has tiers below HBM (a CPU tier per replica, a shared storage per fleet):
 * the links' bounds, and the prefix-reuse regimes reached with the resident set kept in the tiers.
 *
 * - Link bounds, each with every "all repeats" hit from that tier: CPU, replicas × host-link load
 *   bandwidth ÷ KV bytes per token ÷ hit tokens per request (requests/s); storage, the fleet's read
 *   bandwidth ÷ the same.
 * - A regime whose resident set (the blocks it reuses, limits.ts) does not fit HBM is unreachable from
 *   HBM alone, but a tiered fleet can keep that set in its tiers and load each hit back. The regime is
 *   then computed a second way: the resident set in the CPU tiers (per replica) and then the storage
 *   (shared: its capacity split over the replicas), only what fits neither left in HBM, so HBM serves
 *   the live requests; hits spread evenly over the resident set (uniform reuse), so each part's share
 *   of the hits comes over its link (none for the part left in HBM), both links reading at once. Its ceiling is the smaller of
 *   that regime's compute bounds and the links' bound. The regime reports whichever of the two
 *   placements serves more; mixes of the two (some of the resident set in HBM) are not searched.
 */
import { DEFAULT_HOST_LINK_BYTES_PER_SECOND } from "../../engine/cpu-tier.ts";
import { kvBytesPerToken } from "../../engine/profile.ts";
import {
  DEFAULT_STORAGE_BYTES_PER_SECOND,
  DEFAULT_STORAGE_CAPACITY_BYTES,
} from "../../engine/storage-tier.ts";
import type { FleetConfig } from "./replica.ts";

/** A tier link's bound when every "all repeats" hit comes over it. */
export interface LinkLimit {
  /** Bytes/s: per replica for the CPU tier's host link, fleet-wide for storage. */
  load_bytes_per_s: number;
  load_tokens_per_s: number;
  requests_per_s: number;
  prompt_tokens_per_s: number;
  output_tokens_per_s: number;
}

/** How a regime fares with its resident set in the tiers (see the module comment). */
export interface ViaTiers {
  /** The resident set's tokens per replica left in HBM (what fits neither tier). */
  resident_in_hbm_per_replica: number;
  /** Share of the hits read from storage (the rest from the CPU tiers and what is left in HBM). */
  storage_share: number;
  /** Requests/s the links carry at that split. */
  link_requests_per_s: number;
  link_output_tokens_per_s: number;
  /** The regime's ceiling this way: min(its compute bounds with that HBM, the links'). */
  output_tokens_per_s: number;
}

export interface TierCapacity {
  kvBytesPerToken: number;
  /** Per replica, tokens its CPU tier holds, and its host link's load bytes/s. */
  cpuTokens: number;
  cpuBandwidth: number;
  /** Fleet-wide tokens the storage holds and its read bytes/s (0 without storage). */
  storageTokens: number;
  storageBandwidth: number;
}

/** The fleet's tiers below HBM, or null when it has none. */
export function tierCapacity(fleet: FleetConfig): TierCapacity | null {
  if (fleet.kvOffload === undefined) return null;
  const kvB = kvBytesPerToken(fleet.profile.model);
  const st = fleet.sharedStorage;
  return {
    kvBytesPerToken: kvB,
    cpuTokens: fleet.kvOffload.cpuBytes / kvB,
    cpuBandwidth: fleet.kvOffload.loadBandwidth ?? DEFAULT_HOST_LINK_BYTES_PER_SECOND,
    storageTokens: st === undefined ? 0 : (st.capacityBytes ?? DEFAULT_STORAGE_CAPACITY_BYTES) / kvB,
    storageBandwidth: st === undefined ? 0 : (st.readBandwidth ?? DEFAULT_STORAGE_BYTES_PER_SECOND),
  };
}

/** A link's bound at `bytesPerS` for `hitTokens` hit tokens per request. */
export function linkLimit(
  bytesPerS: number,
  kvB: number,
  replicas: number,
  hitTokens: number,
  promptMean: number,
  outputMean: number,
): LinkLimit {
  const tokens = bytesPerS / kvB;
  const reqs = hitTokens > 0 ? (replicas * tokens) / hitTokens : Number.POSITIVE_INFINITY;
  return {
    load_bytes_per_s: bytesPerS,
    load_tokens_per_s: tokens,
    requests_per_s: reqs,
    prompt_tokens_per_s: reqs * promptMean,
    output_tokens_per_s: reqs * outputMean,
  };
}

/**
 * A regime with its resident set in the tiers: `computeWith(hbmResident)` is the regime's own
 * bound with that much of the resident set per replica in HBM (limits.ts), `hitTokens` its hits per request.
 */
export function viaTiers(
  t: TierCapacity,
  replicas: number,
  residentPerReplica: number,
  hitTokens: number,
  outputMean: number,
  computeWith: (hbmResident: number) => { output_tokens_per_s: number; resident_fits: boolean },
): ViaTiers | null {
  if (residentPerReplica <= 0 || hitTokens <= 0) return null;
  const inCpu = Math.min(residentPerReplica, t.cpuTokens);
  const inStorage = Math.min(residentPerReplica - inCpu, t.storageTokens / replicas);
  const inHbm = residentPerReplica - inCpu - inStorage;
  const share = inStorage / residentPerReplica;
  const cpuShare = inCpu / residentPerReplica;
  const perReq = hitTokens * t.kvBytesPerToken;
  // Hits on the part left in HBM cost no link; both links read at once: whichever fills first caps.
  const cpuReqs = cpuShare > 0 ? (replicas * t.cpuBandwidth) / (perReq * cpuShare) : Number.POSITIVE_INFINITY;
  const stReqs = share > 0 ? t.storageBandwidth / (perReq * share) : Number.POSITIVE_INFINITY;
  const linkReqs = Math.min(cpuReqs, stReqs);
  const c = computeWith(inHbm);
  const linkOut = linkReqs * outputMean;
  return {
    resident_in_hbm_per_replica: inHbm,
    storage_share: share,
    link_requests_per_s: linkReqs,
    link_output_tokens_per_s: linkOut,
    output_tokens_per_s: c.resident_fits ? Math.min(c.output_tokens_per_s, linkOut) : 0,
  };
}
