/**
 * Baseline: llm-d Workload Variant Autoscaler's saturation analyzer (llm-d/llm-d-workload-variant-
 * autoscaler, docs/saturation-analyzer.md and internal/engines/saturation/engine.go): per pool,
 * every 30 s (the saturation engine's polling interval), from max_over_time[1m] of each replica's
 * vllm:kv_cache_usage_perc and vllm:num_requests_waiting:
 *   - a replica is non-saturated when kv < kvCacheThreshold (0.80) and queue < queueLengthThreshold (5);
 *   - spare_kv = 0.80 − kv and spare_queue = 5 − queue, averaged over the non-saturated replicas
 *     (none non-saturated: no spare);
 *   - scale up by one when avg spare kv < kvSpareTrigger (0.10) or avg spare queue < queueSpareTrigger
 *     (3), unless a replica of the pool is still pending (starting) — WVA's guard against cascades;
 *   - scale down by one when N ≥ 2 and, with the pool's total kv and queue spread over N − 1
 *     replicas, the spare kv and queue would still be at or above the triggers.
 */
import {
  type AutoscalePolicy,
  type Bounds,
  clamp,
  lastWindow,
  type PoolDecision,
  type PoolSample,
  type Sample,
  trim,
} from "../types.ts";

export const WVA_DEFAULTS = {
  interval: 30,
  window: 60,
  kvCacheThreshold: 0.8,
  queueLengthThreshold: 5,
  kvSpareTrigger: 0.1,
  queueSpareTrigger: 3,
} as const;

export type WvaConfig = typeof WVA_DEFAULTS;

/** Per-replica max over the window, as max_over_time[1m] per pod (replica k of each sample). */
export interface ReplicaPeak {
  kv: number;
  queue: number;
}

/** WVA's rule on one pool's per-replica peaks: +1, −1 or 0 with the reason. */
export function wvaStep(
  peaks: readonly ReplicaPeak[],
  pending: number,
  cfg: WvaConfig = WVA_DEFAULTS,
): { delta: -1 | 0 | 1; reason: string } {
  const n = peaks.length;
  if (n === 0) return { delta: 0, reason: "no ready replica reports metrics" };
  const free = peaks.filter((p) => p.kv < cfg.kvCacheThreshold && p.queue < cfg.queueLengthThreshold);
  const spareKv = free.length ? free.reduce((s, p) => s + (cfg.kvCacheThreshold - p.kv), 0) / free.length : 0;
  const spareQ = free.length
    ? free.reduce((s, p) => s + (cfg.queueLengthThreshold - p.queue), 0) / free.length
    : 0;
  const fig = `spare kv ${spareKv.toFixed(3)}, spare queue ${spareQ.toFixed(2)} over ${free.length}/${n} non-saturated`;
  if (spareKv < cfg.kvSpareTrigger || spareQ < cfg.queueSpareTrigger) {
    if (pending > 0) return { delta: 0, reason: `saturated (${fig}) but ${pending} replica(s) pending` };
    return { delta: 1, reason: `saturated: ${fig}` };
  }
  if (n >= 2) {
    const kv = peaks.reduce((s, p) => s + p.kv, 0) / (n - 1);
    const q = peaks.reduce((s, p) => s + p.queue, 0) / (n - 1);
    if (
      cfg.kvCacheThreshold - kv >= cfg.kvSpareTrigger &&
      cfg.queueLengthThreshold - q >= cfg.queueSpareTrigger
    )
      return {
        delta: -1,
        reason: `safe on ${n - 1}: kv ${kv.toFixed(3)}, queue ${q.toFixed(2)} per replica`,
      };
  }
  return { delta: 0, reason: fig };
}

export class WvaPolicy implements AutoscalePolicy {
  readonly name = "wva";
  readonly interval: number;
  readonly #history: Sample[] = [];
  constructor(
    readonly bounds: ReadonlyMap<string, Bounds>,
    readonly cfg: WvaConfig = WVA_DEFAULTS,
  ) {
    this.interval = cfg.interval;
  }
  observe(s: Sample): void {
    this.#history.push(s);
    trim(this.#history, s.now, this.cfg.window + 1);
  }
  decide(now: number, pools: readonly PoolSample[]): PoolDecision[] {
    const w = lastWindow(this.#history, now, this.cfg.window);
    return pools.map((ps) => {
      // Replica k's peak over the window (replica lists keep their order while a replica serves).
      const peaks: ReplicaPeak[] = [];
      for (const s of w) {
        const p = s.pools.find((x) => x.name === ps.name);
        p?.replicas.forEach((r, k) => {
          if (k >= ps.ready) return;
          const cur = peaks[k] ?? { kv: 0, queue: 0 };
          peaks[k] = { kv: Math.max(cur.kv, r.kvUsage), queue: Math.max(cur.queue, r.waiting) };
        });
      }
      const step = wvaStep(peaks.filter(Boolean), ps.starting, this.cfg);
      const b = this.bounds.get(ps.name) ?? { min: 1, max: Number.POSITIVE_INFINITY };
      return { pool: ps.name, role: ps.role, desired: clamp(ps.target + step.delta, b), reason: step.reason };
    });
  }
}
