/**
 * Polls every endpoint's `/metrics` (and, less often, `/v1/models`) and records the results in the
 * Datastore. Each endpoint has its own loop and its own small undici Pool, so a stalled or slow
 * endpoint only delays itself: every poll has a hard timeout (abort), the next poll starts
 * `intervalMs` after the previous one started (never overlapping), and response bodies are capped.
 */
import { Pool } from "undici";
import type { Datastore, ModelCard } from "./datastore.ts";
import { monotonicSeconds } from "./datastore.ts";
import type { EndpointSpec } from "./endpoints.ts";
import { ExtractError, extractMetrics, isExtractedSample } from "./extract.ts";
import { parsePromText } from "./prom-text.ts";

export interface ScraperOptions {
  /**
   * Poll period per endpoint. Default 100; llm-d's floor is 50 (its `--refresh-metrics-interval`,
   * llm-d/llm-d-router@ebab6879).
   */
  intervalMs?: number;
  /** Hard limit per poll, connect to last byte. Default 1000 (llm-d's per-poll timeout). */
  timeoutMs?: number;
  /** `/v1/models` refresh period. Default 5000. */
  modelsIntervalMs?: number;
  /** Largest /metrics or /v1/models body read. Default 8 MiB. */
  maxBodyBytes?: number;
  clock?: () => number;
  /** Metric hooks: a poll that failed (HTTP/timeout) or whose text yielded no signals. */
  onPollError?: (id: string, err: Error) => void;
  onExtractError?: (id: string, err: Error) => void;
}

interface Target {
  spec: EndpointSpec;
  pool: Pool;
  timer: NodeJS.Timeout | null;
  inflight: Set<AbortController>;
  stopped: boolean;
  nextModelsAt: number;
  modelsBusy: boolean;
}

export class Scraper {
  readonly #store: Datastore;
  readonly #targets = new Map<string, Target>();
  readonly intervalMs: number;
  readonly timeoutMs: number;
  readonly #modelsS: number;
  readonly #maxBody: number;
  readonly #clock: () => number;
  readonly #opts: ScraperOptions;
  #running = false;

  constructor(store: Datastore, opts: ScraperOptions = {}) {
    this.#store = store;
    this.#opts = opts;
    this.intervalMs = opts.intervalMs ?? 100;
    this.timeoutMs = opts.timeoutMs ?? 1000;
    this.#modelsS = (opts.modelsIntervalMs ?? 5000) / 1000;
    this.#maxBody = opts.maxBodyBytes ?? 8 * 1024 * 1024;
    this.#clock = opts.clock ?? monotonicSeconds;
    for (const [k, v] of [
      ["intervalMs", this.intervalMs],
      ["timeoutMs", this.timeoutMs],
    ] as const)
      if (!(Number.isFinite(v) && v >= 1)) throw new RangeError(`scraper ${k} must be ≥ 1 ms, got ${v}`);
  }

  /** Starts polling every endpoint added so far and every one added later. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    for (const t of this.#targets.values()) this.#tick(t);
  }

  add(spec: EndpointSpec): void {
    this.remove(spec.id);
    const t: Target = {
      spec,
      pool: new Pool(`http://${spec.id}`, {
        connections: 2,
        keepAliveTimeout: 10_000,
        connect: { timeout: this.timeoutMs },
      }),
      timer: null,
      inflight: new Set(),
      stopped: false,
      nextModelsAt: 0,
      modelsBusy: false,
    };
    this.#targets.set(spec.id, t);
    if (this.#running) this.#tick(t);
  }

  remove(id: string): void {
    const t = this.#targets.get(id);
    if (!t) return;
    this.#targets.delete(id);
    this.#stop(t);
  }

  #stop(t: Target): void {
    t.stopped = true;
    if (t.timer) clearTimeout(t.timer);
    for (const ac of t.inflight) ac.abort(new Error("scraper stopped"));
    t.pool.destroy().catch(() => {});
  }

  async close(): Promise<void> {
    this.#running = false;
    for (const t of this.#targets.values()) this.#stop(t);
    this.#targets.clear();
  }

  #tick(t: Target): void {
    if (t.stopped) return;
    const started = this.#clock();
    if (started >= t.nextModelsAt && !t.modelsBusy) void this.refreshModels(t.spec.id);
    void this.#scrape(t, started).finally(() => {
      if (t.stopped) return;
      const wait = Math.max(0, this.intervalMs - (this.#clock() - started) * 1000);
      t.timer = setTimeout(() => this.#tick(t), wait);
      t.timer.unref();
    });
  }

  /** One scrape of `id` now; resolves true when metrics were recorded. */
  async scrapeOnce(id: string): Promise<boolean> {
    const t = this.#targets.get(id);
    return t ? this.#scrape(t, this.#clock()) : false;
  }

  async #scrape(t: Target, started: number): Promise<boolean> {
    let text: string;
    try {
      text = await this.#get(t, "/metrics", "text/plain");
    } catch (err) {
      if (t.stopped) return false;
      const e = err as Error;
      this.#store.recordScrapeFailure(t.spec.id, `GET /metrics: ${e.message}`);
      this.#opts.onPollError?.(t.spec.id, e);
      return false;
    }
    if (t.stopped) return false;
    try {
      const parsed = parsePromText(text, { lenient: true, keep: isExtractedSample });
      const m = extractMetrics(parsed.families);
      this.#store.recordScrapeSuccess(t.spec.id, m, started, this.#clock());
      return true;
    } catch (err) {
      const e = err instanceof ExtractError ? err : new ExtractError((err as Error).message);
      this.#store.recordScrapeFailure(t.spec.id, `/metrics: ${e.message}`);
      this.#opts.onExtractError?.(t.spec.id, e);
      return false;
    }
  }

  /** Fetches `/v1/models` of `id` and records it; resolves to the cards or null on failure. */
  async refreshModels(id: string): Promise<ModelCard[] | null> {
    const t = this.#targets.get(id);
    if (!t || t.modelsBusy) return null;
    t.modelsBusy = true;
    try {
      const cards = parseModelList(await this.#get(t, "/v1/models", "application/json"));
      this.#store.recordModels(id, cards);
      t.nextModelsAt = this.#clock() + this.#modelsS;
      return cards;
    } catch {
      t.nextModelsAt = this.#clock() + Math.min(this.#modelsS, 1); // retry sooner
      return null;
    } finally {
      t.modelsBusy = false;
    }
  }

  async #get(t: Target, path: string, accept: string): Promise<string> {
    const ac = new AbortController();
    const timer = setTimeout(
      () => ac.abort(new Error(`timed out after ${this.timeoutMs} ms`)),
      this.timeoutMs,
    );
    t.inflight.add(ac);
    try {
      const res = await t.pool.request({ path, method: "GET", headers: { accept }, signal: ac.signal });
      res.body.on("error", () => {}); // a destroyed body reports its abort; nobody waits for it
      if (res.statusCode !== 200) {
        res.body.destroy();
        throw new Error(`HTTP ${res.statusCode}`);
      }
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const c of res.body) {
        size += (c as Buffer).length;
        if (size > this.#maxBody) {
          res.body.destroy();
          throw new Error(`body larger than ${this.#maxBody} bytes`);
        }
        chunks.push(c as Buffer);
      }
      return Buffer.concat(chunks).toString("utf8");
    } catch (err) {
      throw ac.signal.aborted && ac.signal.reason instanceof Error ? ac.signal.reason : err;
    } finally {
      clearTimeout(timer);
      t.inflight.delete(ac);
    }
  }
}

/** An OpenAI ModelList (`{object: "list", data: [{id, ...}]}`); throws if it is not one. */
export function parseModelList(text: string): ModelCard[] {
  const doc = JSON.parse(text) as { data?: unknown };
  if (!doc || !Array.isArray(doc.data)) throw new Error("not a model list");
  return doc.data.filter(
    (m): m is ModelCard => typeof m === "object" && m !== null && typeof (m as ModelCard).id === "string",
  );
}
