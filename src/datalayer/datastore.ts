/**
 * Per-endpoint state the gateway routes on: last scraped metrics, health, probation and served
 * models. Health rules:
 * - `failureThreshold` scrape failures in a row → unhealthy; the next successful scrape readmits.
 * - A request that cannot reach the endpoint (connect error) → unhealthy at once, until a scrape
 *   that STARTED after the failure succeeds ("answers again").
 * - A request that fails on the endpoint (5xx, reset or timeout before the first byte) → probation:
 *   excluded for a backoff doubling per consecutive failure, cleared by a successful response.
 * Candidates are the healthy endpoints off probation that serve the model; if all of those are on
 * probation, the probationers are used rather than failing the request outright.
 */
import type { EndpointMetrics, EndpointState } from "../scheduler/types.ts";
import type { EndpointSpec } from "./endpoints.ts";
import type { EngineCounters, EngineKind, ExtractedMetrics } from "./extract.ts";

/** Monotonic seconds: the one clock for metrics updateTime, staleness and the scheduler's `now`. */
export function monotonicSeconds(): number {
  return performance.now() / 1000;
}

export type Health = "unknown" | "healthy" | "unhealthy";

export interface ModelCard {
  id: string;
  [k: string]: unknown;
}

export interface EndpointRecord {
  spec: EndpointSpec;
  /** The object handed to the scheduler; `metrics` is replaced on every successful scrape. */
  readonly state: EndpointState;
  health: Health;
  engine: EngineKind | null;
  lastScrapeOk: number | null;
  consecutiveFailures: number;
  lastError: string | null;
  /** Set by a connect failure; cleared by a scrape started after it. */
  downSince: number | null;
  probationUntil: number;
  requestFailures: number;
  models: ModelCard[] | null;
  modelIds: Set<string> | null;
  /** vLLM's cumulative token counters from the last scrape that had them (the dashboard's rates). */
  counters: EngineCounters | null;
}

export interface DatastoreOptions {
  /** Consecutive scrape failures that make an endpoint unhealthy. Default 3. */
  failureThreshold?: number;
  /** First probation after a failed request; doubles per consecutive failure. Default 1000. */
  probationBaseMs?: number;
  probationMaxMs?: number;
  onHealthChange?: (id: string, health: Health, reason: string) => void;
}

export type CandidateOutcome =
  | { ok: true; candidates: EndpointState[] }
  | { ok: false; kind: "model-not-found" | "no-endpoints"; message: string };

export type RequestFailureKind = "connect" | "status" | "reset" | "timeout";

export interface EndpointSnapshot {
  address: string;
  labels: Record<string, string>;
  kvEvents: string | null;
  health: Health;
  /** Would be a candidate for a request right now (ignoring model). */
  eligible: boolean;
  probationRemainingMs: number;
  engine: EngineKind | null;
  metrics: EndpointMetrics | null;
  /** ms since the last successful scrape; null if never scraped. */
  stalenessMs: number | null;
  consecutiveScrapeFailures: number;
  consecutiveRequestFailures: number;
  lastError: string | null;
  models: string[] | null;
}

/**
 * The 404 for a model no replica serves, listing the served ones (sorted, deduplicated, at most 10)
 * and what to set: the same text at `kvgate serve` and at the multi-pool front door.
 */
export function unknownModelMessage(model: string | null, served: Iterable<string>): string {
  const ids = [...new Set(served)].sort();
  if (ids.length === 0)
    return `The model \`${model}\` does not exist. No replica lists a model yet; GET /v1/models lists the served models, set "model" to one of them.`;
  const shown = ids.length > 10 ? [...ids.slice(0, 10), "…"] : ids;
  return `The model \`${model}\` does not exist. Served models: ${shown.join(", ")}; set "model" to one of them.`;
}

export class Datastore {
  readonly #records = new Map<string, EndpointRecord>();
  readonly #threshold: number;
  readonly #baseS: number;
  readonly #maxS: number;
  readonly #onHealth: (id: string, health: Health, reason: string) => void;

  constructor(opts: DatastoreOptions = {}) {
    this.#threshold = opts.failureThreshold ?? 3;
    this.#baseS = (opts.probationBaseMs ?? 1000) / 1000;
    this.#maxS = (opts.probationMaxMs ?? 30_000) / 1000;
    this.#onHealth = opts.onHealthChange ?? (() => {});
    if (!(Number.isInteger(this.#threshold) && this.#threshold >= 1))
      throw new RangeError("failureThreshold must be an integer ≥ 1");
  }

  get size(): number {
    return this.#records.size;
  }

  get(id: string): EndpointRecord | undefined {
    return this.#records.get(id);
  }

  all(): EndpointRecord[] {
    return [...this.#records.values()];
  }

  /** Adds an endpoint, or updates labels/kvEvents of an existing one (keeping its state). */
  upsert(spec: EndpointSpec): EndpointRecord {
    const old = this.#records.get(spec.id);
    if (old) {
      old.spec = spec;
      old.state.labels = spec.labels;
      return old;
    }
    const rec: EndpointRecord = {
      spec,
      state: { id: spec.id, address: spec.id, labels: spec.labels, metrics: null },
      health: "unknown",
      engine: null,
      lastScrapeOk: null,
      consecutiveFailures: 0,
      lastError: null,
      downSince: null,
      probationUntil: 0,
      requestFailures: 0,
      models: null,
      modelIds: null,
      counters: null,
    };
    this.#records.set(spec.id, rec);
    return rec;
  }

  remove(id: string): boolean {
    return this.#records.delete(id);
  }

  #setHealth(rec: EndpointRecord, h: Health, reason: string): void {
    if (rec.health === h) return;
    const was = rec.health;
    rec.health = h;
    if (was !== "unknown" || h === "unhealthy") this.#onHealth(rec.spec.id, h, reason);
  }

  /** A scrape that started at `startedAt` succeeded at `now`. */
  recordScrapeSuccess(id: string, m: ExtractedMetrics, startedAt: number, now: number): void {
    const rec = this.#records.get(id);
    if (!rec) return;
    rec.state.metrics = {
      waitingQueueSize: m.waitingQueueSize,
      runningRequestsSize: m.runningRequestsSize,
      kvCacheUsagePercent: m.kvCacheUsagePercent,
      ...(m.cacheBlockSize !== undefined ? { cacheBlockSize: m.cacheBlockSize } : {}),
      ...(m.cacheNumBlocks !== undefined ? { cacheNumBlocks: m.cacheNumBlocks } : {}),
      ...(m.cacheNumCpuBlocks !== undefined ? { cacheNumCpuBlocks: m.cacheNumCpuBlocks } : {}),
      ...(m.simTimeScale !== undefined ? { simTimeScale: m.simTimeScale } : {}),
      ...(m.lora !== undefined
        ? {
            activeModels: m.lora.running,
            waitingModels: m.lora.waiting,
            maxActiveModels: m.lora.maxLora,
          }
        : {}),
      updateTime: now,
    };
    rec.engine = m.engine;
    rec.counters = m.counters ?? null;
    rec.lastScrapeOk = now;
    rec.consecutiveFailures = 0;
    rec.lastError = null;
    if (rec.downSince !== null && startedAt <= rec.downSince) return; // answered before the failure
    rec.downSince = null;
    this.#setHealth(rec, "healthy", "metrics scrape succeeded");
  }

  recordScrapeFailure(id: string, error: string): void {
    const rec = this.#records.get(id);
    if (!rec) return;
    rec.consecutiveFailures++;
    rec.lastError = error;
    if (rec.consecutiveFailures >= this.#threshold)
      this.#setHealth(rec, "unhealthy", `${rec.consecutiveFailures} scrapes failed in a row: ${error}`);
  }

  recordModels(id: string, models: ModelCard[]): void {
    const rec = this.#records.get(id);
    if (!rec) return;
    rec.models = models;
    rec.modelIds = new Set(models.map((m) => m.id));
  }

  /** The gateway reports a request that failed on `id` before its first response byte. */
  reportRequestFailure(id: string, kind: RequestFailureKind, error: string, now: number): void {
    const rec = this.#records.get(id);
    if (!rec) return;
    rec.lastError = error;
    if (kind === "connect") {
      rec.downSince = now;
      this.#setHealth(rec, "unhealthy", `request could not connect: ${error}`);
      return;
    }
    rec.requestFailures++;
    const backoff = Math.min(this.#maxS, this.#baseS * 2 ** (rec.requestFailures - 1));
    rec.probationUntil = Math.max(rec.probationUntil, now + backoff);
  }

  reportRequestSuccess(id: string): void {
    const rec = this.#records.get(id);
    if (!rec || (rec.requestFailures === 0 && rec.probationUntil === 0)) return;
    rec.requestFailures = 0;
    rec.probationUntil = 0;
  }

  #serves(rec: EndpointRecord, model: string | null): boolean {
    return model === null || rec.modelIds === null || rec.modelIds.has(model);
  }

  /**
   * Endpoints a request for `model` may go to (null: any model). 404-kind when every endpoint's
   * model list is known and none lists the model; no-endpoints when nothing eligible remains.
   */
  candidates(model: string | null, now: number): CandidateOutcome {
    if (this.#records.size === 0)
      return {
        ok: false,
        kind: "no-endpoints",
        message:
          "no endpoints are known: list the replicas with --endpoints or --endpoints-file, or, with Kubernetes discovery, wait until the InferencePool has Ready pods",
      };
    const serving: EndpointRecord[] = [];
    for (const rec of this.#records.values()) if (this.#serves(rec, model)) serving.push(rec);
    if (serving.length === 0)
      return {
        ok: false,
        kind: "model-not-found",
        message: unknownModelMessage(
          model,
          [...this.#records.values()].flatMap((r) => [...(r.modelIds ?? [])]),
        ),
      };
    const up = serving.filter((r) => r.health !== "unhealthy");
    const ready = up.filter((r) => r.probationUntil <= now);
    const chosen = ready.length > 0 ? ready : up;
    if (chosen.length === 0)
      return {
        ok: false,
        kind: "no-endpoints",
        message: `no healthy endpoint serves model \`${model}\` (${serving.length} unhealthy): GET /endpoints on the admin port shows each one's last error; requests go through again once one answers its /metrics`,
      };
    return { ok: true, candidates: chosen.map((r) => r.state) };
  }

  /** Ids of every endpoint not currently excluded (for pool gauges). */
  readyCount(now: number): number {
    let n = 0;
    for (const r of this.#records.values()) if (r.health !== "unhealthy" && r.probationUntil <= now) n++;
    return n;
  }

  snapshot(now: number): EndpointSnapshot[] {
    return this.all().map((r) => ({
      address: r.spec.id,
      labels: r.spec.labels,
      kvEvents: r.spec.kvEvents,
      health: r.health,
      eligible: r.health !== "unhealthy" && r.probationUntil <= now,
      probationRemainingMs: Math.max(0, Math.round((r.probationUntil - now) * 1000)),
      engine: r.engine,
      metrics: r.state.metrics,
      stalenessMs: r.lastScrapeOk === null ? null : Math.round((now - r.lastScrapeOk) * 1000),
      consecutiveScrapeFailures: r.consecutiveFailures,
      consecutiveRequestFailures: r.requestFailures,
      lastError: r.lastError,
      models: r.modelIds ? [...r.modelIds] : null,
    }));
  }
}
