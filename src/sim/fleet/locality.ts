/**
 * Several regions in the fleet simulator: a scenario's `locality` section gives each region its own
 * traffic (its origin: the workload spec with that region's arrival process, seed and options) and
 * the round-trip times between regions. Every request carries its origin (RequestSpec.origin); the
 * scheduler sees it as RequestFacts.locality, which is what locality-filter keeps local; a request
 * served from another region pays the one-way delay on the way in (gateway → replica) and again on
 * the way back (RequestRecord.networkDelay, added to its TTFT and E2E). Replicas get their region
 * from their pool's `labels` (the label named by `locality.label`).
 *
 * A prefill/decode KV transfer between regions also crosses the link between them (wan-link.ts):
 * `bandwidthGbps` per pair, shared first come first served, one round trip of latency.
 */
import { z } from "zod";
import { aggregateSet } from "../../bench/metrics.ts";
import type { RequestRecord } from "../../bench/request-metrics.ts";
import type { Slo } from "../../bench/slo.ts";
import { ArrivalSchema, generateWorkload, type WorkloadSpec } from "../../bench/workloads/spec.ts";
import type { RequestSpec, StageInfo, Workload } from "../../bench/workloads/types.ts";
import { REGION_LABEL } from "../../scheduler/plugins/filters/locality.ts";

export const LocalitySchema = z.strictObject({
  /** The endpoint label holding a replica's region (default topology.kubernetes.io/region). */
  label: z.string().min(1).optional(),
  /** Round trip between two regions, "a/b": ms (either order); pairs not listed are an error. */
  rttMs: z.record(z.string(), z.number().finite().nonnegative()).optional(),
  /** Bandwidth of the link between two regions, "a/b": Gb/s (either order); unlisted pairs: unlimited. */
  bandwidthGbps: z.record(z.string(), z.number().finite().positive()).optional(),
  /** Round trip within a region, ms (default 0: gatewayDelayMs already covers the local hop). */
  localRttMs: z.number().finite().nonnegative().optional(),
  /** Each region's traffic: the scenario's workload with these fields replaced. */
  origins: z
    .array(
      z.strictObject({
        region: z.string().min(1),
        arrival: ArrivalSchema.optional(),
        numRequests: z.number().int().nonnegative().optional(),
        seed: z.number().int().nonnegative().optional(),
        /** Merged over the workload's options. */
        options: z.record(z.string(), z.unknown()).optional(),
      }),
    )
    .min(1),
});
export type LocalityInput = z.infer<typeof LocalitySchema>;

export interface LocalityConfig {
  label: string;
  /** One-way seconds between regions: "a\0b" in both orders, and "a\0a" for the local hop. */
  oneWay: Map<string, number>;
  /** Bytes/s between regions: "a\0b" in both orders (pairs given in bandwidthGbps only). */
  bandwidth: Map<string, number>;
  origins: LocalityInput["origins"];
}

/** Resolves the section against the regions the fleet's pools are labelled with; throws a message. */
export function resolveLocality(
  input: LocalityInput,
  poolRegions: readonly (string | undefined)[],
): LocalityConfig {
  const label = input.label ?? REGION_LABEL;
  const regions = new Set<string>();
  for (const [i, r] of poolRegions.entries()) {
    if (r === undefined)
      throw new Error(`fleet pool ${i} has no ${label} label: give every pool its region in labels`);
    regions.add(r);
  }
  for (const o of input.origins) regions.add(o.region);
  const seen = new Set<string>();
  for (const o of input.origins) {
    if (seen.has(o.region)) throw new Error(`origins: region ${o.region} is listed twice`);
    seen.add(o.region);
  }
  const oneWay = new Map<string, number>();
  const local = (input.localRttMs ?? 0) / 2000;
  for (const r of regions) oneWay.set(`${r}\u0000${r}`, local);
  for (const [pair, ms] of Object.entries(input.rttMs ?? {})) {
    const [a, b, extra] = pair.split("/");
    if (!a || !b || extra !== undefined) throw new Error(`rttMs: "${pair}" must be "regionA/regionB"`);
    oneWay.set(`${a}\u0000${b}`, ms / 2000);
    oneWay.set(`${b}\u0000${a}`, ms / 2000);
  }
  for (const a of regions)
    for (const b of regions)
      if (!oneWay.has(`${a}\u0000${b}`)) throw new Error(`rttMs: no round-trip time for "${a}/${b}"; add it`);
  const bandwidth = new Map<string, number>();
  for (const [pair, gbps] of Object.entries(input.bandwidthGbps ?? {})) {
    const [a, b, extra] = pair.split("/");
    if (!a || !b || extra !== undefined || a === b)
      throw new Error(`bandwidthGbps: "${pair}" must be "regionA/regionB" with two different regions`);
    for (const r of [a, b])
      if (!regions.has(r)) throw new Error(`bandwidthGbps: "${pair}": no pool or origin is in region ${r}`);
    bandwidth.set(`${a}\u0000${b}`, (gbps * 1e9) / 8);
    bandwidth.set(`${b}\u0000${a}`, (gbps * 1e9) / 8);
  }
  return { label, oneWay, bandwidth, origins: input.origins };
}

/** One-way delay in seconds from `origin` to a replica with `labels` (0 without an origin). */
export function oneWayDelay(
  cfg: LocalityConfig,
  origin: string | undefined,
  labels: Record<string, string>,
): number {
  if (origin === undefined) return 0;
  return cfg.oneWay.get(`${origin}\u0000${labels[cfg.label]}`) ?? 0;
}

/**
 * Every origin's workload, merged by arrival time; ids and dependencies prefixed by region. The
 * stage table is the first staged origin's; other origins' requests fall in the stage their
 * arrival time does, so a stage row shows the whole fleet's load while that origin's stage ran.
 */
export function originWorkload(base: WorkloadSpec, cfg: LocalityConfig, traceText?: string): Workload {
  const parts = cfg.origins.map((o, k) => {
    const spec: WorkloadSpec = {
      ...base,
      seed: o.seed ?? base.seed + k + 1,
      ...(o.arrival !== undefined ? { arrival: o.arrival } : {}),
      ...(o.numRequests !== undefined ? { numRequests: o.numRequests } : {}),
      options: { ...base.options, ...(o.options ?? {}) },
    };
    const w = generateWorkload(spec, { traceText });
    if (w.stageBarrier)
      throw new Error(`origins: region ${o.region}: stage barriers cannot be merged across regions`);
    return { region: o.region, w };
  });
  const staged = parts.find((p) => p.w.stages.length > 0);
  const stages: StageInfo[] = staged ? staged.w.stages.map((s) => ({ ...s, count: 0 })) : [];
  const stageAt = (t: number) => {
    let i = 0;
    while (i + 1 < stages.length && t >= stages[i + 1].start) i++;
    return i;
  };
  const requests: RequestSpec[] = [];
  for (const { region, w } of parts)
    for (const r of w.requests) {
      const stage =
        stages.length === 0 ? undefined : staged?.region === region ? r.stage : stageAt(r.arrivalTime);
      if (stage !== undefined) stages[stage].count++;
      requests.push({
        ...r,
        id: `${region}/${r.id}`,
        origin: region,
        ...(r.after ? { after: { ...r.after, id: `${region}/${r.after.id}` } } : {}),
        ...(r.sessionId !== undefined ? { sessionId: `${region}/${r.sessionId}` } : {}),
        ...(stage !== undefined ? { stage } : {}),
      });
    }
  requests.sort((a, b) => a.arrivalTime - b.arrivalTime);
  for (const s of stages) s.rate = s.count / s.duration;
  return {
    name: base.workload,
    seed: base.seed,
    requests,
    stages,
    notes: [
      `${parts.length} regions: ${parts.map((p) => `${p.region} ${p.w.requests.length} requests`).join(", ")}`,
    ],
  };
}

export interface OriginRow {
  origin: string;
  requests: number;
  errors: number;
  /** Share of completed requests served by a replica in the request's own region. */
  local_share: number | null;
  output_tokens_per_s: number | null;
  ttft_p50: number | null;
  ttft_p90: number | null;
  ttft_p99: number | null;
  /** Share of requests (failures count as misses) meeting the scenario's SLO (goodput fraction). */
  slo_attainment: number | null;
}

/** Per-origin figures of one run (warm-up requests left out, as in the run's aggregates). */
export function originRows(
  records: readonly RequestRecord[],
  specs: readonly RequestSpec[],
  regionOf: (endpoint: string) => string | undefined,
  slo: Slo | undefined,
): OriginRow[] {
  const originOf = new Map(specs.map((s) => [s.id, s.origin]));
  const by = new Map<string, RequestRecord[]>();
  for (const r of records) {
    const origin = originOf.get(r.id);
    if (r.warmup || origin === undefined) continue;
    const list = by.get(origin);
    if (list === undefined) by.set(origin, [r]);
    else list.push(r);
  }
  return [...by.entries()]
    .sort((a, b) => (a[0] < b[0] ? -1 : 1))
    .map(([origin, rs]) => {
      const a = aggregateSet(rs, slo);
      let local = 0;
      for (const r of rs)
        if (!r.error && r.endpoint !== undefined && regionOf(r.endpoint) === origin) local++;
      return {
        origin,
        requests: a.requests,
        errors: a.errors,
        local_share: a.completed > 0 ? local / a.completed : null,
        output_tokens_per_s: a.output_tokens_per_s,
        ttft_p50: a.ttft.p50,
        ttft_p90: a.ttft.p90,
        ttft_p99: a.ttft.p99,
        slo_attainment: a.goodput?.fraction ?? null,
      };
    });
}
