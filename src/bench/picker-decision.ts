/**
 * bench:picker, decision half: times Scheduler.schedule() (and schedule()+onPicked()) on a warm
 * prefix index. Synthetic but realistic input: ~8k-token chat prompts from a few hundred users,
 * each user resending a system prompt shared with other users plus their own conversation and a
 * fresh question; endpoints with fresh, varied metrics and in-flight load. Everything random is
 * seeded and pre-generated, so the timed loop only runs the scheduler.
 */
import { createRng, type Rng } from "../scheduler/rng.ts";
import type { EndpointState, RequestFacts, ScheduleResult } from "../scheduler/types.ts";
import { withoutPrompt } from "../scheduler/types.ts";

/** The scheduler surface the bench drives (structural, so an older copy can be timed too). */
export interface BenchScheduler {
  schedule(req: RequestFacts, candidates: readonly EndpointState[], now: number): ScheduleResult;
  onPicked(req: RequestFacts, result: ScheduleResult, now: number): void;
  onResponseStarted(req: RequestFacts, endpointId: string, now: number): void;
  onResponseComplete(
    req: RequestFacts,
    endpointId: string,
    now: number,
    info?: { outputTokens?: number },
  ): void;
  stats(): Record<string, Record<string, number>>;
  /** Between-request measurements (Scheduler.refresh); absent on copies older than it. */
  refresh?(now: number): void;
  readonly refreshIntervalS?: number | null;
}

/**
 * The gateway's refresh timer on the bench's clock: tick(now) calls `s.refresh()` once `now` has
 * passed the next multiple of its period, outside any timed call (the gateway runs it between
 * requests, off the request path).
 */
function refreshClock(s: BenchScheduler): (now: number) => void {
  const every = s.refreshIntervalS ?? null;
  if (every === null || every <= 0 || s.refresh === undefined) return () => {};
  let next = Number.NEGATIVE_INFINITY;
  return (now) => {
    if (now < next) return;
    s.refresh?.(now);
    next = (Math.floor(now / every) + 1) * every;
  };
}

export interface WorkloadOptions {
  users: number;
  systemPrompts: number;
  /** Target prompt length in pseudo-tokens (4 bytes each). */
  promptTokens: number;
  seed: number;
}

export const WORKLOAD_DEFAULTS: WorkloadOptions = {
  users: 300,
  systemPrompts: 32,
  promptTokens: 8192,
  seed: 42,
};

const CONSONANTS = "bcdfghjklmnprstvwz";
const VOWELS = "aeiou";
const WORDS: string[] = [];
for (const a of CONSONANTS) for (const b of VOWELS) for (const c of CONSONANTS) WORDS.push(a + b + c);

/** `tokens` pseudo-tokens of text: 3-letter words plus a space, 4 bytes per token. */
function words(rng: Rng, tokens: number): string {
  const parts = new Array<string>(Math.max(0, tokens));
  for (let i = 0; i < parts.length; i++) parts[i] = WORDS[rng.int(WORDS.length)];
  return `${parts.join(" ")} `;
}

function between(rng: Rng, lo: number, hi: number): number {
  return lo + rng.int(hi - lo + 1);
}

interface User {
  system: number;
  /** JSON text of the user's thread (system prompt, then alternating user/assistant messages). */
  thread: string;
}

/** A pre-generated request: whose thread it resends and the fresh question appended to it. */
export interface RequestSpec {
  id: number;
  user: number;
  question: string;
}

/** What runDecisions() needs of a workload. */
export interface Workload {
  materialize(spec: RequestSpec): RequestFacts;
}

function chatFacts(id: number, messages: { role: string; content: string }[]): RequestFacts {
  return {
    requestId: `r${id}`,
    model: "meta-llama/Llama-3.1-8B-Instruct",
    prompt: { kind: "chat", messages },
    maxTokens: 256,
    stream: true,
    priority: 0,
  };
}

/**
 * Request generator. System prompts are 1k–3k tokens; each user's conversation fills the prompt up
 * to ~promptTokens with 200–800-token turns; every request appends a fresh 60–250-token question.
 * So a user's requests share ~97% of their blocks, and users of one system prompt share 15–35%.
 * Requests are materialised by JSON.parse just before use, as the gateway parses a body: the
 * scheduler sees fresh strings, never string objects shared with earlier requests.
 */
export class ChatWorkload implements Workload {
  readonly users: User[];
  readonly #rng: Rng;
  #seq = 0;

  constructor(readonly opts: WorkloadOptions = WORKLOAD_DEFAULTS) {
    const rng = createRng(opts.seed);
    this.#rng = createRng(opts.seed + 1);
    const sysTokens: number[] = [];
    const systems: string[] = [];
    for (let i = 0; i < opts.systemPrompts; i++) {
      const n = between(rng, 1000, 3000);
      sysTokens.push(n);
      // Distinct first words, so system prompts differ from block 0 on.
      systems.push(`You are assistant ${i}. ${words(rng, n - 4)}`);
    }
    this.users = [];
    for (let u = 0; u < opts.users; u++) {
      const system = rng.int(opts.systemPrompts);
      const budget = opts.promptTokens - sysTokens[system] - 160;
      const thread = [{ role: "system", content: systems[system] }];
      let used = 0;
      while (used < budget) {
        const n = Math.min(between(rng, 200, 800), budget - used);
        thread.push({ role: thread.length % 2 === 1 ? "user" : "assistant", content: words(rng, n) });
        used += n;
      }
      if (thread.length % 2 === 0) thread.push({ role: "assistant", content: "Ok. " });
      this.users.push({ system, thread: JSON.stringify(thread) });
    }
  }

  /** The next request: a uniformly random user and a fresh question. */
  next(): RequestSpec {
    const rng = this.#rng;
    return { id: this.#seq++, user: rng.int(this.users.length), question: words(rng, between(rng, 60, 250)) };
  }

  batch(n: number): RequestSpec[] {
    return Array.from({ length: n }, () => this.next());
  }

  /** The request as the gateway would hand it to the scheduler (fresh objects and strings). */
  materialize(spec: RequestSpec): RequestFacts {
    const messages = JSON.parse(this.users[spec.user].thread) as { role: string; content: string }[];
    messages.push({ role: "user", content: spec.question });
    return chatFacts(spec.id, messages);
  }
}

/**
 * Cold requests: every request is a new ~promptTokens conversation (its own system prompt and
 * turns, from a per-request seed), so no endpoint holds any of its blocks: the decision path
 * where nothing matches and every candidate stays in play. The bodies are generated up front
 * (generate()) and kept as bytes outside the JS heap, as a gateway holds a request body;
 * materialize() decodes and parses one, as the gateway does. So neither the generator's garbage
 * nor ~165 MB of kept text (5,000 requests) burdens the garbage collector between decisions.
 */
export class ColdChatWorkload implements Workload {
  #seq = 0;
  readonly #bodies = new Map<number, Buffer>();

  constructor(readonly opts: WorkloadOptions = WORKLOAD_DEFAULTS) {}

  batch(n: number): RequestSpec[] {
    return Array.from({ length: n }, () => ({ id: this.#seq++, user: -1, question: "" }));
  }

  /** Generates the JSON texts of `specs` now (materialize() generates any missing one itself). */
  generate(specs: readonly RequestSpec[]): void {
    for (const s of specs) if (!this.#bodies.has(s.id)) this.#bodies.set(s.id, this.#body(s.id));
  }

  materialize(spec: RequestSpec): RequestFacts {
    let body = this.#bodies.get(spec.id);
    if (body === undefined) this.#bodies.set(spec.id, (body = this.#body(spec.id)));
    return chatFacts(spec.id, JSON.parse(body.toString("utf8")));
  }

  #body(id: number): Buffer {
    const rng = createRng(this.opts.seed * 7919 + id);
    const sys = between(rng, 1000, 3000);
    const thread = [{ role: "system", content: `Session ${id}. ${words(rng, sys - 3)}` }];
    let used = sys;
    while (used < this.opts.promptTokens - 160) {
      const n = Math.min(between(rng, 200, 800), this.opts.promptTokens - 160 - used);
      thread.push({ role: thread.length % 2 === 1 ? "user" : "assistant", content: words(rng, n) });
      used += n;
    }
    thread.push({ role: "user", content: words(rng, between(rng, 60, 250)) });
    return Buffer.from(JSON.stringify(thread), "utf8");
  }
}

/** Bytes of a chat request's roles and contents (ASCII here), for reporting prompt size. */
export function promptBytes(req: RequestFacts): number {
  if (req.prompt.kind !== "chat") return 0;
  let n = 0;
  for (const m of req.prompt.messages)
    n += m.role.length + (typeof m.content === "string" ? m.content.length : 0);
  return n;
}

/** `n` endpoints; with `roles`, alternately labelled prefill and decode (for pd.yaml). */
export function makeEndpoints(n: number, roles: boolean): EndpointState[] {
  const out: EndpointState[] = [];
  for (let i = 0; i < n; i++) {
    const address = `10.${(i >> 8) & 255}.${i & 255}.${1 + (i % 7)}`;
    out.push({
      id: `${address}:8000`,
      address,
      // Two regions, for locality-filter; no other example config reads the label.
      labels: {
        "topology.kubernetes.io/region": i % 2 === 0 ? "us-east" : "us-west",
        ...(roles ? { "llm-d.ai/role": i % 2 === 0 ? "decode" : "prefill" } : {}),
      },
      metrics: null,
    });
  }
  return out;
}

/** A scrape: fresh, varied load metrics on every endpoint (mutated in place, as a datastore would). */
export function scrape(endpoints: EndpointState[], rng: Rng, now: number): void {
  for (const e of endpoints) {
    e.metrics = {
      waitingQueueSize: rng.next() < 0.6 ? 0 : rng.int(12),
      runningRequestsSize: rng.int(96),
      kvCacheUsagePercent: 0.05 + 0.85 * rng.next(),
      cacheBlockSize: 16,
      cacheNumBlocks: 32768,
      updateTime: now,
    };
  }
}

export interface DecisionRunOptions {
  /** Timed decisions (at most timedReqs.length). */
  calls: number;
  /** Decisions between two scrapes (metrics refresh). */
  scrapeEvery: number;
  /** In-flight window: requests complete FIFO once more than this many are in flight. */
  inflight: number;
  /** Output tokens each request reports as it ends (the gateway's usage read); 0 or absent: none. */
  answerTokens?: number;
  /** Seconds of virtual time between decisions. */
  dt: number;
  /**
   * After the headline pass, a diagnostic pass times each timed request's decision this many
   * times in a row (fresh request objects, same scheduler state, no learning) and reports the
   * per-request minimum: the machine's jitter filtered out, but repeats find caches warm, so a
   * lower bound. 1 = off. Separate from the headline pass so that its extra request parsing does
   * not add garbage (and GC pauses) between headline decisions: the gateway parses a body once.
   */
  repeat: number;
  /**
   * What the endpoints report back, outside the timed calls (precise mode's KV events): `deliver`
   * before each decision, `picked` after each onPicked() of the warm-up and headline passes.
   */
  feed?: {
    deliver(now: number): void;
    picked(req: RequestFacts, result: ScheduleResult, now: number): void;
  };
  /**
   * A scheduler that decides each request first, untimed, with its own copy of the request and
   * its own in-flight lifecycle (picker-locality.ts: it computes the candidate list a `~spill-set`
   * twin decides over).
   */
  shadow?: BenchScheduler;
}

export interface Percentiles {
  p50: number;
  p90: number;
  p99: number;
  max: number;
  mean: number;
}

export interface DecisionRun {
  /** schedule() alone, µs. */
  schedule: Percentiles;
  /** schedule() + onPicked(), µs. */
  scheduleAndPicked: Percentiles;
  /** Per request, the fastest of `repeat` schedule() calls, µs (null when repeat = 1). */
  scheduleMinOfRepeats: Percentiles | null;
  /** Prefix index hit ratio over the timed calls (matched / looked-up blocks on the target). */
  hitRatio: number | null;
  /** Share of timed decisions with a target. */
  targeted: number;
}

/** Nearest-rank percentiles of `ns` (nanoseconds), in µs. Sorts `ns` in place. */
export function percentiles(ns: Float64Array): Percentiles {
  ns.sort();
  const at = (q: number) => ns[Math.min(ns.length - 1, Math.max(0, Math.ceil(q * ns.length) - 1))] / 1000;
  let sum = 0;
  for (const v of ns) sum += v;
  return {
    p50: at(0.5),
    p90: at(0.9),
    p99: at(0.99),
    max: ns[ns.length - 1] / 1000,
    mean: sum / ns.length / 1000,
  };
}

function prefixStats(s: BenchScheduler): { hit: number; lookup: number } | null {
  for (const p of Object.values(s.stats())) {
    if (p.lookupBlocks !== undefined && p.hitBlocks !== undefined)
      return { hit: p.hitBlocks, lookup: p.lookupBlocks };
  }
  return null;
}

/**
 * Warms `scheduler` with the `warmupReqs` lifecycles, then times up to `calls` decisions on
 * `timedReqs` (schedule() alone, and with onPicked()), then the diagnostic repeats. Each request
 * is materialised (parsed) before its timer starts.
 */
export function runDecisions(
  scheduler: BenchScheduler,
  endpoints: EndpointState[],
  workload: Workload,
  warmupReqs: readonly RequestSpec[],
  timedReqs: readonly RequestSpec[],
  o: DecisionRunOptions,
  seed: number,
): DecisionRun {
  const rng = createRng(seed);
  let now = 1000;
  const inflight = inflightWindow(scheduler, o.inflight, o.answerTokens ?? 0);
  const shadow = o.shadow === undefined ? null : shadowRunner(o.shadow, endpoints, workload, o.inflight);
  scrape(endpoints, rng, now);
  const feed = o.feed;
  const refresh = refreshClock(scheduler);
  for (let i = 0; i < warmupReqs.length; i++) {
    now += o.dt;
    if (i % o.scrapeEvery === 0) scrape(endpoints, rng, now);
    refresh(now);
    feed?.deliver(now);
    shadow?.(warmupReqs[i], now, true);
    const req = workload.materialize(warmupReqs[i]);
    const r = scheduler.schedule(req, endpoints, now);
    scheduler.onPicked(req, r, now);
    feed?.picked(req, r, now);
    inflight.add(req, r, now);
  }
  const before = prefixStats(scheduler);
  const n = Math.min(o.calls, timedReqs.length);
  const tSchedule = new Float64Array(n);
  const tBoth = new Float64Array(n);
  const tMin = new Float64Array(n);
  let targeted = 0;
  for (let i = 0; i < n; i++) {
    now += o.dt;
    if (i % o.scrapeEvery === 0) scrape(endpoints, rng, now);
    refresh(now);
    feed?.deliver(now);
    shadow?.(timedReqs[i], now, true);
    const req = workload.materialize(timedReqs[i]);
    const t0 = process.hrtime.bigint();
    const r = scheduler.schedule(req, endpoints, now);
    const t1 = process.hrtime.bigint();
    scheduler.onPicked(req, r, now);
    const t2 = process.hrtime.bigint();
    feed?.picked(req, r, now);
    tSchedule[i] = Number(t1 - t0);
    tBoth[i] = Number(t2 - t0);
    if (r.target !== null) targeted++;
    inflight.add(req, r, now);
  }
  const after = prefixStats(scheduler);
  for (let i = 0; i < (o.repeat > 1 ? n : 0); i++) {
    let best = Number.POSITIVE_INFINITY;
    for (let k = 0; k < o.repeat; k++) {
      shadow?.(timedReqs[i], now, false);
      const req = workload.materialize(timedReqs[i]);
      const t0 = process.hrtime.bigint();
      scheduler.schedule(req, endpoints, now);
      const t = Number(process.hrtime.bigint() - t0);
      if (t < best) best = t;
    }
    tMin[i] = best;
  }
  const hitRatio =
    before !== null && after !== null && after.lookup > before.lookup
      ? (after.hit - before.hit) / (after.lookup - before.lookup)
      : null;
  return {
    schedule: percentiles(tSchedule),
    scheduleAndPicked: percentiles(tBoth),
    scheduleMinOfRepeats: o.repeat > 1 ? percentiles(tMin) : null,
    hitRatio,
    targeted: targeted / n,
  };
}

/**
 * runDecisions' shadow: decides `spec` (a fresh copy of the request) before the timed scheduler
 * does; with `learn`, also its onPicked() and its own FIFO in-flight window, as the timed one has.
 */
function shadowRunner(
  shadow: BenchScheduler,
  endpoints: EndpointState[],
  workload: Workload,
  window: number,
): (spec: RequestSpec, now: number, learn: boolean) => void {
  const inflight = inflightWindow(shadow, window);
  const refresh = refreshClock(shadow);
  return (spec, now, learn) => {
    refresh(now);
    const req = workload.materialize(spec);
    const r = shadow.schedule(req, endpoints, now);
    if (!learn) return;
    shadow.onPicked(req, r, now);
    inflight.add(req, r, now);
  };
}

/**
 * A FIFO window of `size` requests in flight on `scheduler`: add() keeps a picked request (what the
 * gateway keeps of it, server.ts: the facts without the prompt) and ends the oldest beyond the
 * window (response started, then complete).
 */
function inflightWindow(
  scheduler: BenchScheduler,
  size: number,
  answerTokens = 0,
): { add(req: RequestFacts, r: ScheduleResult, now: number): void } {
  const info = answerTokens > 0 ? { outputTokens: answerTokens } : undefined;
  const inflight: { req: RequestFacts; id: string }[] = [];
  let head = 0;
  return {
    add(req, r, now) {
      if (r.target !== null) inflight.push({ req: withoutPrompt(req), id: r.target.id });
      while (inflight.length - head > size) {
        const f = inflight[head++];
        scheduler.onResponseStarted(f.req, f.id, now);
        scheduler.onResponseComplete(f.req, f.id, now, info);
      }
      if (head > 4096) {
        inflight.splice(0, head);
        head = 0;
      }
    },
  };
}
