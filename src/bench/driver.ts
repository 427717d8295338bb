/**
 * The live load driver: sends a workload's requests to an OpenAI-compatible target (one base URL,
 * or client-side round-robin over several: the "plain Kubernetes Service" baseline) with
 * streaming and ignore_eos, through undici, recording each content chunk's arrival. Start times
 * come from the pure ArrivalScheduler. Under --time-scale N (simulated replicas running N× real
 * time) arrivals are scheduled at wall = simulated / N and every recorded time is simulated
 * seconds. Bounded: stops at maxDuration (in-flight requests are cut off) or after maxRequests.
 * Token counts per SSE event: token_ids length when the server sends it (vLLM return_token_ids),
 * else usage.completion_tokens spread over the events (distributeTokens); events that arrive in
 * one network read form one chunk, so bundled delivery shows up as multi-token chunks in the ITL.
 */
import { Agent, request } from "undici";
import { tagHeaders } from "./breakdown.ts";
import { fleetStats, metricsUrl, type ReplicaSnapshot, scrapeReplica } from "./fleet-metrics.ts";
import type { RequestRecord } from "./metrics.ts";
import { resolveModel } from "./model-list.ts";
import type { FleetResult } from "./results.ts";
import { ArrivalScheduler } from "./schedule.ts";
import { distributeTokens, interpretPayload, SseSplitter, type Usage } from "./sse.ts";
import { isWarmup, type RequestSpec, type Workload } from "./workloads/types.ts";

export interface DriverProgress {
  /** Workload seconds since the start. */
  now: number;
  sent: number;
  completed: number;
  errors: number;
  inFlight: number;
  total: number;
  outputTokens: number;
  /** Index of the stage whose requests were sent last. */
  stage?: number;
}

export interface DriverOptions {
  /** Base URLs ("http://host:port"); more than one means client-side round-robin. */
  targets: string[];
  /** Model name; default: the first id of GET {targets[0]}/v1/models. */
  model?: string;
  /** Simulated seconds per wall second of the target (1 for real servers). */
  timeScale?: number;
  /** Hard stop, workload seconds from the start (default 3600). */
  maxDuration?: number;
  maxRequests?: number;
  /** Per-request limit, workload seconds (default 600). */
  requestTimeout?: number;
  /** Where to scrape vLLM /metrics; default: the targets. [] disables scraping. */
  metricsEndpoints?: string[];
  /**
   * Wall seconds between KV-usage samples. Default: one workload second, within [0.1, 1] wall
   * seconds, so a run on a fast simulated clock is still sampled (a fixed 1 s left short runs
   * with none).
   */
  metricsInterval?: number;
  headers?: Record<string, string>;
  /** Merged into every request body (e.g. {"return_token_ids": true}). */
  extraBody?: Record<string, unknown>;
  onProgress?: (p: DriverProgress) => void;
  /** Wall milliseconds between progress callbacks (default 1000). */
  progressIntervalMs?: number;
  signal?: AbortSignal;
}

export interface DriverResult {
  records: RequestRecord[];
  /** Requests never sent (max duration, max requests, abort). */
  notSent: number;
  /** Actual start of each stage (undefined if it never opened). */
  stageStarts: Array<number | undefined>;
  fleet?: FleetResult;
  model: string;
  started: string;
  /** Largest delay between a request's scheduled and actual send, workload seconds. */
  maxScheduleLag: number;
}

export function normalizeBase(url: string): string {
  return url.replace(/\/+$/, "").replace(/\/v1$/, "");
}

/** A sleep that a completion can cut short. */
class Waker {
  #wake: (() => void) | undefined;
  wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(done, Math.max(0, ms));
      const self = this;
      function done() {
        clearTimeout(t);
        self.#wake = undefined;
        resolve();
      }
      this.#wake = done;
    });
  }
  notify(): void {
    this.#wake?.();
  }
}

function errorKind(e: unknown): string {
  const err = e as { name?: string; code?: string };
  if (err.name === "TimeoutError" || err.code === "UND_ERR_HEADERS_TIMEOUT") return "timeout";
  if (err.code === "ECONNREFUSED" || err.code === "UND_ERR_CONNECT_TIMEOUT") return "connect";
  if (err.code === "ECONNRESET" || err.code === "UND_ERR_SOCKET" || err.code === "EPIPE") return "socket";
  return "other";
}

export async function runBench(workload: Workload, opts: DriverOptions): Promise<DriverResult> {
  const targets = opts.targets.map(normalizeBase);
  if (targets.length === 0) throw new Error("runBench: no target");
  const scale = opts.timeScale ?? 1;
  if (!(scale > 0)) throw new RangeError("timeScale must be > 0");
  const maxDuration = opts.maxDuration ?? 3600;
  const maxRequests = opts.maxRequests ?? Number.POSITIVE_INFINITY;
  const requestTimeoutMs = ((opts.requestTimeout ?? 600) / scale) * 1000;
  const headers = { "content-type": "application/json", ...opts.headers };
  const dispatcher = new Agent({ headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 30_000 });
  const metricUrls = (opts.metricsEndpoints ?? targets).map(metricsUrl);
  const scrapeAll = () => Promise.all(metricUrls.map((u) => scrapeReplica(u, dispatcher)));
  try {
    const model = opts.model ?? (await resolveModel(targets[0], opts.headers ?? {}, dispatcher));
    const before = await scrapeAll();
    const started = new Date().toISOString();
    const t0 = performance.now();
    const now = () => ((performance.now() - t0) / 1000) * scale;
    const toWallMs = (workloadSeconds: number) => (workloadSeconds / scale) * 1000;

    const samples: ReplicaSnapshot[][] = [];
    let sampling = metricUrls.length > 0;
    const samplerWaker = new Waker();
    const interval = opts.metricsInterval ?? Math.min(1, Math.max(0.1, 1 / scale));
    const sampler = (async () => {
      while (sampling) {
        await samplerWaker.wait(interval * 1000);
        if (sampling) samples.push(await scrapeAll());
      }
    })();

    const scheduler = new ArrivalScheduler(workload);
    const waker = new Waker();
    const cutoff = new AbortController();
    const onAbort = () => {
      cutoff.abort();
      waker.notify();
    };
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    const records: RequestRecord[] = [];
    const inFlight = new Set<Promise<void>>();
    const progress: DriverProgress = {
      now: 0,
      sent: 0,
      completed: 0,
      errors: 0,
      inFlight: 0,
      total: workload.requests.length,
      outputTokens: 0,
    };
    const report = () => opts.onProgress?.({ ...progress, now: now(), inFlight: inFlight.size });
    const ticker = opts.onProgress ? setInterval(report, opts.progressIntervalMs ?? 1000) : undefined;

    let maxLag = 0;
    const launch = (spec: RequestSpec, scheduledAt: number) => {
      maxLag = Math.max(maxLag, now() - scheduledAt);
      const base = targets[progress.sent % targets.length];
      progress.sent++;
      progress.stage = spec.stage;
      const p = sendOne(spec, base).then((rec) => {
        records.push(rec);
        scheduler.complete(spec.id, rec.end);
        if (rec.error) progress.errors++;
        else progress.outputTokens += rec.completionTokens;
        progress.completed++;
        inFlight.delete(p);
        waker.notify();
      });
      inFlight.add(p);
    };

    const sendOne = async (spec: RequestSpec, base: string): Promise<RequestRecord> => {
      const chat = spec.kind === "chat";
      const body = JSON.stringify({
        model,
        ...(chat ? { messages: spec.messages } : { prompt: spec.prompt }),
        max_tokens: spec.maxTokens,
        stream: true,
        stream_options: { include_usage: true },
        ignore_eos: true,
        ...opts.extraBody,
      });
      const rec: RequestRecord = {
        id: spec.id,
        ...(spec.stage !== undefined ? { stage: spec.stage } : {}),
        ...(isWarmup(spec, workload) ? { warmup: true } : {}),
        start: now(),
        end: 0,
        chunkTimes: [],
        chunkTokens: [],
        promptTokens: spec.promptTokensApprox,
        completionTokens: 0,
      };
      const times: number[] = [];
      const chars: number[] = [];
      const ids: Array<number | undefined> = [];
      let usage: Usage | undefined;
      let done = false;
      const signal = AbortSignal.any([cutoff.signal, AbortSignal.timeout(requestTimeoutMs)]);
      try {
        const res = await request(`${base}${chat ? "/v1/chat/completions" : "/v1/completions"}`, {
          method: "POST",
          body,
          headers: spec.tags === undefined ? headers : { ...headers, ...tagHeaders(spec) },
          dispatcher,
          signal,
        });
        if (res.statusCode !== 200) {
          const text = (await res.body.text()).slice(0, 300);
          const reason = res.headers["x-llm-d-request-dropped-reason"];
          rec.error = {
            kind: `http_${res.statusCode}`,
            status: res.statusCode,
            message: text,
            ...(typeof reason === "string" ? { reason } : {}),
          };
        } else {
          const splitter = new SseSplitter();
          const handle = (payloads: string[]) => {
            const t = now();
            for (const data of payloads) {
              const ev = interpretPayload(data, spec.kind);
              if (ev.error) rec.error ??= { kind: "stream", message: ev.error };
              if (ev.done) done = true;
              if (ev.usage) usage = ev.usage;
              if ((ev.text !== undefined && ev.text !== "") || (ev.tokenIds ?? 0) > 0) {
                times.push(t);
                chars.push(ev.text?.length ?? 0);
                ids.push(ev.tokenIds);
              }
            }
          };
          for await (const buf of res.body) handle(splitter.push(buf as Uint8Array));
          handle(splitter.end());
          if (!done && !rec.error) rec.error = { kind: "incomplete", message: "stream ended without [DONE]" };
        }
      } catch (e) {
        const kind = cutoff.signal.aborted ? "cutoff" : errorKind(e);
        rec.error ??= { kind, message: (e as Error).message };
      }
      rec.end = now();
      const perChunk = ids.every((x) => x !== undefined)
        ? (ids as number[])
        : distributeTokens(chars, usage?.completionTokens);
      // Events read together arrived together: one chunk carrying their tokens (chunk-aware ITL).
      const cTimes: number[] = [];
      const cTokens: number[] = [];
      for (const [i, k] of perChunk.entries()) {
        if (cTimes.length && cTimes[cTimes.length - 1] === times[i]) cTokens[cTokens.length - 1] += k;
        else {
          cTimes.push(times[i]);
          cTokens.push(k);
        }
      }
      rec.chunkTimes = Float64Array.from(cTimes);
      rec.chunkTokens = Uint32Array.from(cTokens);
      rec.completionTokens = usage?.completionTokens ?? perChunk.reduce((a, b) => a + b, 0);
      if (usage?.promptTokens !== undefined) rec.promptTokens = usage.promptTokens;
      if (usage?.cachedTokens !== undefined) rec.cachedTokens = usage.cachedTokens;
      return rec;
    };

    try {
      for (;;) {
        const t = now();
        if (cutoff.signal.aborted || t >= maxDuration) break;
        for (const s of scheduler.takeDue(t)) {
          if (progress.sent >= maxRequests) break;
          launch(s.spec, s.time);
        }
        const exhausted = scheduler.done || progress.sent >= maxRequests;
        const next = scheduler.nextTime();
        if (inFlight.size === 0 && (exhausted || next === undefined)) break;
        const until = Math.min(next ?? Number.POSITIVE_INFINITY, maxDuration);
        await waker.wait(Math.min(toWallMs(until - now()), 60_000));
      }
    } finally {
      cutoff.abort();
      await Promise.all(inFlight);
      opts.signal?.removeEventListener("abort", onAbort);
      if (ticker) clearInterval(ticker);
      sampling = false;
      samplerWaker.notify();
      await sampler;
    }
    report();
    const wallSeconds = (performance.now() - t0) / 1000;
    const after = await scrapeAll();
    const anyMetrics = [...before, ...after].some(
      (s) => s.ok && (s.queries !== undefined || s.kvUsage !== undefined),
    );
    return {
      records,
      notSent: workload.requests.length - progress.sent,
      stageStarts: workload.stages.map((s) => scheduler.stageStart(s.index)),
      ...(anyMetrics
        ? { fleet: fleetStats(before, after, samples, { wallSeconds, intervalSeconds: interval }) }
        : {}),
      model,
      started,
      maxScheduleLag: maxLag,
    };
  } finally {
    await dispatcher.close();
  }
}
