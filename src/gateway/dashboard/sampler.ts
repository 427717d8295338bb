/**
 * The admin dashboard's data: once a second, one sample of the fleet as the gateway sees it — each
 * replica's scraped KV usage, queue, running requests and health, its prefix-cache hit rate over the
 * last minute (from vLLM's own counters), the requests the gateway sent it; the gateway's in-flight
 * requests, request, rejection and error rates, TTFT percentiles and the fleet's output tokens/s; and
 * flow control's queue when it is on. Keeps the last `historySeconds` of samples for a page that
 * opens late, and pushes each new one to its listeners (the SSE streams, sse.ts).
 */
import { monotonicSeconds } from "../../datalayer/datastore.ts";
import type { EngineCounters } from "../../datalayer/extract.ts";
import { flowGateOf } from "../flow-gate.ts";
import type { Gateway } from "../gateway.ts";

export interface ReplicaSample {
  address: string;
  health: string;
  eligible: boolean;
  /** Scraped; null before the first scrape. */
  kv: number | null;
  waiting: number | null;
  running: number | null;
  /** Prefix-cache hits / queries over the last minute (vLLM's counters); null without lookups. */
  hitRate: number | null;
  /** Requests the gateway sent here in the last second (first picks and failover retries). */
  picksPerS: number;
  /** Requests sent here since it joined the pool. */
  picksTotal: number;
  /** Failures before the first byte here in the last second. */
  failuresPerS: number;
  /** Output tokens/s from vLLM's vllm:generation_tokens_total; null without the counter. */
  outputTokPerS: number | null;
}

export interface FlowSample {
  queued: number;
  saturation: number;
  bands: Array<{ priority: number; depth: number; flows: Array<{ fairnessId: string; depth: number }> }>;
}

export interface DashboardSample {
  /** Wall-clock milliseconds (for the page's time axis). */
  t: number;
  pool: string;
  inFlight: number;
  requestsPerS: number;
  /** 429 and 503 answers the gateway gave itself (saturation, limits, flow control), per second. */
  rejectedPerS: number;
  /** Upstream errors, midstream failures, all attempts failed, per second. */
  errorsPerS: number;
  /** TTFT percentiles (seconds) of the requests that started streaming in the last 10 s; null if none. */
  ttftP50: number | null;
  ttftP90: number | null;
  outputTokPerS: number;
  replicas: ReplicaSample[];
  /** Flow control's queue; null when the flowControl feature gate is off. */
  flows: FlowSample | null;
}

interface Raw {
  at: number;
  counters: Map<string, EngineCounters | null>;
  picks: Map<string, { requests: number; failures: number }>;
  /** Cumulative TTFT bucket counts (merged over label sets), by upper bound. */
  ttft: Array<[number, number]>;
  requests: number;
  rejected: number;
  errors: number;
}

const HIT_WINDOW_S = 60;
const TTFT_WINDOW_S = 10;
const ERROR_OUTCOMES = new Set(["upstream-error", "midstream-failure", "all-attempts-failed"]);

export class DashboardSampler {
  readonly #gw: Gateway;
  readonly #historySize: number;
  readonly #samples: DashboardSample[] = [];
  readonly #raws: Raw[] = [];
  readonly #listeners = new Set<(s: DashboardSample) => void>();
  #timer: NodeJS.Timeout | null = null;
  #busy = false;

  constructor(gw: Gateway, opts: { historySeconds?: number } = {}) {
    this.#gw = gw;
    this.#historySize = opts.historySeconds ?? 300;
  }

  start(intervalMs = 1000): void {
    if (this.#timer) return;
    void this.tick();
    this.#timer = setInterval(() => void this.tick(), intervalMs);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    this.#listeners.clear();
  }

  history(): DashboardSample[] {
    return [...this.#samples];
  }

  subscribe(fn: (s: DashboardSample) => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  get listeners(): number {
    return this.#listeners.size;
  }

  /** Takes one sample now and sends it to every listener. */
  async tick(): Promise<DashboardSample | null> {
    if (this.#busy) return null;
    this.#busy = true;
    try {
      const raw = await this.#raw();
      const s = this.#sample(raw);
      this.#raws.push(raw);
      while (this.#raws.length > 0 && raw.at - this.#raws[0].at > HIT_WINDOW_S + 1) this.#raws.shift();
      this.#samples.push(s);
      if (this.#samples.length > this.#historySize) this.#samples.shift();
      for (const fn of this.#listeners) fn(s);
      return s;
    } finally {
      this.#busy = false;
    }
  }

  async #raw(): Promise<Raw> {
    const gw = this.#gw;
    const counters = new Map<string, EngineCounters | null>();
    const picks = new Map<string, { requests: number; failures: number }>();
    for (const r of gw.data.store.all()) {
      counters.set(r.spec.id, r.counters);
      const t = gw.traffic.get(r.spec.id);
      picks.set(r.spec.id, { requests: t.requests, failures: t.failures });
    }
    const buckets = new Map<number, number>();
    for (const v of (await gw.metrics.ttft.get()).values) {
      if (!v.metricName?.endsWith("_bucket")) continue;
      const bound = (v.labels as Record<string, string | number>).le;
      const le = bound === "+Inf" ? Number.POSITIVE_INFINITY : Number(bound);
      buckets.set(le, (buckets.get(le) ?? 0) + v.value);
    }
    let requests = 0;
    let rejected = 0;
    let errors = 0;
    for (const v of (await gw.metrics.httpRequests.get()).values) {
      requests += v.value;
      if (v.labels.outcome === "rejected") rejected += v.value;
      else if (ERROR_OUTCOMES.has(String(v.labels.outcome))) errors += v.value;
    }
    return {
      at: monotonicSeconds(),
      counters,
      picks,
      ttft: [...buckets].sort((a, b) => a[0] - b[0]),
      requests,
      rejected,
      errors,
    };
  }

  /**
   * The raw sample closest to `seconds` before `raw` (the oldest kept if none is that old), among
   * those `usable` accepts (e.g. the ones that had a replica's counters).
   */
  #before(raw: Raw, seconds: number, usable: (r: Raw) => boolean = () => true): Raw | undefined {
    let pick: Raw | undefined;
    for (const r of this.#raws) {
      if (!usable(r)) continue;
      if (raw.at - r.at < seconds - 0.25) return pick ?? r;
      pick = r;
    }
    return pick;
  }

  #sample(raw: Raw): DashboardSample {
    const gw = this.#gw;
    const prev = this.#raws.at(-1);
    const dt = prev ? Math.max(raw.at - prev.at, 1e-3) : 1;
    const rate = (now: number, before: number | undefined) =>
      prev && before !== undefined ? Math.max(0, now - before) / dt : 0;
    const now = monotonicSeconds();
    const replicas: ReplicaSample[] = gw.data.store.snapshot(now).map((e) => {
      const id = e.address;
      const c = raw.counters.get(id) ?? null;
      const p = raw.picks.get(id) ?? { requests: 0, failures: 0 };
      const pc = prev?.counters.get(id) ?? null;
      const hc = this.#before(raw, HIT_WINDOW_S, (r) => r.counters.get(id) != null)?.counters.get(id) ?? null;
      const dq = c && hc ? c.prefixCacheQueries - hc.prefixCacheQueries : 0;
      return {
        address: id,
        health: e.health,
        eligible: e.eligible,
        kv: e.metrics?.kvCacheUsagePercent ?? null,
        waiting: e.metrics?.waitingQueueSize ?? null,
        running: e.metrics?.runningRequestsSize ?? null,
        hitRate: c && hc && dq > 0 ? Math.min(1, (c.prefixCacheHits - hc.prefixCacheHits) / dq) : null,
        picksPerS: rate(p.requests, prev?.picks.get(id)?.requests),
        picksTotal: p.requests,
        failuresPerS: rate(p.failures, prev?.picks.get(id)?.failures),
        outputTokPerS: c ? (pc ? Math.max(0, c.generationTokens - pc.generationTokens) / dt : 0) : null,
      };
    });
    const ttftBase = this.#before(raw, TTFT_WINDOW_S);
    const ttft = ttftBase ? bucketDelta(raw.ttft, ttftBase.ttft) : raw.ttft;
    const gate = flowGateOf(gw);
    let flows: FlowSample | null = null;
    if (gate) {
      const f = gate.snapshot();
      flows = {
        queued: f.queued,
        saturation: f.saturation,
        bands: f.bands.map((b) => ({
          priority: b.priority,
          depth: b.depth,
          flows: b.flows.map((x) => ({ fairnessId: x.fairnessId, depth: x.depth })),
        })),
      };
    }
    return {
      t: Date.now(),
      pool: gw.opts.poolName,
      inFlight: gw.active,
      requestsPerS: rate(raw.requests, prev?.requests),
      rejectedPerS: rate(raw.rejected, prev?.rejected),
      errorsPerS: rate(raw.errors, prev?.errors),
      ttftP50: quantile(ttft, 0.5),
      ttftP90: quantile(ttft, 0.9),
      outputTokPerS: replicas.reduce((a, r) => a + (r.outputTokPerS ?? 0), 0),
      replicas,
      flows,
    };
  }
}

function bucketDelta(now: Array<[number, number]>, before: Array<[number, number]>): Array<[number, number]> {
  const b = new Map(before);
  return now.map(([le, c]) => [le, Math.max(0, c - (b.get(le) ?? 0))]);
}

/**
 * The q-quantile of cumulative histogram buckets, linearly interpolated inside the bucket (as
 * Prometheus' histogram_quantile); the last finite bound when it falls in +Inf; null when empty.
 */
export function quantile(buckets: Array<[number, number]>, q: number): number | null {
  const total = buckets.at(-1)?.[1] ?? 0;
  if (total <= 0) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (!Number.isFinite(le)) return lower;
      const inBucket = count - below;
      return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
    }
    lower = le;
    below = count;
  }
  return lower;
}

const samplers = new WeakMap<Gateway, DashboardSampler>();

/** The gateway's sampler, started on first use (the first dashboard request). */
export function dashboardSamplerOf(gw: Gateway): DashboardSampler {
  let s = samplers.get(gw);
  if (!s) {
    s = new DashboardSampler(gw);
    samplers.set(gw, s);
    s.start();
  }
  return s;
}

/** Stops the gateway's sampler, if one was started (gateway shutdown). */
export function stopDashboard(gw: Gateway): void {
  samplers.get(gw)?.stop();
  samplers.delete(gw);
}
