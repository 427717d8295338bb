/**
 * The fleet simulator's event loop: one workload run through the real scheduler (the gateway's
 * plugins and admission) onto N engine models, in virtual time. Deterministic: no clocks, no
 * Math.random; time is passed explicitly and every random draw comes from a seeded stream.
 *
 * A request's life: arrival at the gateway (tokenized; admission, schedule, onPicked against the
 * endpoints' metrics as of the last scrape and, for a precise prefix router, the KV events
 * delivered so far) → delivery to its replica after the gateway delay → engine steps (one output
 * chunk per step, at the step's end) → onResponseStarted at its first token, onResponseComplete and
 * the arrival scheduler's completion at its last. A request refused by admission or the scheduler,
 * or rejected by the engine, is recorded as dropped.
 *
 * Precise prefix routing: when the router config has a precise-prefix-cache-producer, the engines
 * record KV-cache events, and each step's batch (current vLLM publishes one per step, in
 * update_from_output after the step) is
 * applied to every such producer's index at step end + kvEventsDelay, as a queued event of its own,
 * under the endpoint id the scheduler sees for the replica. The router is then given the prompt's
 * token ids (the very array the engine gets), since the producer keys requests by token ids. The
 * engines' block hash does not matter: the index keys blocks by their token ids and maps the engine
 * hashes only to apply removals, so the fast hash serves. Without such a producer no events are
 * recorded, so other routers pay nothing for them.
 *
 * Invariants (a violation throws): the clock never goes back (INV-1); every request is resolved —
 * completed or dropped — exactly once, and no engine holds a request after the run (INV-2); a
 * replica with work always has a step in flight or queued, so the queue never runs dry while
 * requests are unresolved (INV-3).
 */
import type { RequestRecord } from "../../bench/metrics.ts";
import type { FleetResult } from "../../bench/results.ts";
import { ArrivalScheduler } from "../../bench/schedule.ts";
import { isWarmup, type RequestSpec, type Workload } from "../../bench/workloads/types.ts";
import { EngineInputError } from "../../engine/engine.ts";
import { PromptHashMemo } from "../../engine/fast-block-hash.ts";
import type { RequestRecord as EngineRecord, StepResult } from "../../engine/types.ts";
import { type Admission, priorityOf } from "../../flow/admission.ts";
import type { KVEventBatch } from "../../kv/events.ts";
import { ROLE_LABEL } from "../../scheduler/plugins/filters/labels.ts";
import { PrecisePrefixProducer } from "../../scheduler/plugins/precise-prefix-cache-producer.ts";
import type { Scheduler } from "../../scheduler/scheduler.ts";
import type { EndpointMetrics, EndpointState, RequestFacts } from "../../scheduler/types.ts";
import { EventQueue, Priority, type SimEvent } from "./event-queue.ts";
import { FLOW_SWEEP_S, type FlowSim } from "./flow.ts";
import type { PdSummary } from "./format-pd.ts";
import { type GatewaySyncConfig, SimGateways } from "./gateways.ts";
import { type KvLinkConfig, kvLinkConfig } from "./kv-link.ts";
import { type LocalityConfig, oneWayDelay } from "./locality.ts";
import { PdRun } from "./pd.ts";
import { PromptTokenizer } from "./prompt-tokens.ts";
import { type FleetConfig, fleetResult, type KvTicks, Replica } from "./replica.ts";
import { fleetStorage, type StorageSummary, storageSummary } from "./shared-storage.ts";
import { oneTokenChunks } from "./step-timeline.ts";

export interface FleetObserver {
  onEvent?(e: SimEvent): void;
  /** A step's results at its end time (its KV events too, when the fleet records them). */
  onStepEnd?(now: number, replica: number, result: StepResult): void;
  onScrape?(now: number, replica: number, metrics: EndpointMetrics): void;
  onSchedule?(
    now: number,
    req: RequestFacts,
    candidates: readonly EndpointState[],
    target: string | null,
  ): void;
  /** A request reached the gateway (its record has the prompt's token count). */
  onArrive?(now: number, record: RequestRecord): void;
  /** A request completed or was dropped (its record is final). */
  onResolved?(now: number, record: RequestRecord): void;
}

/** What a membership controller (autoscale.ts) can do to a running fleet. */
export interface FleetControl {
  readonly replicas: readonly Replica[];
  /** Pool index of each replica. */
  readonly poolOf: readonly number[];
  /** Adds a fresh replica of pool `pool` (cold cache), serving from now; returns its index. */
  add(pool: number): number;
  /** Stops routing new requests to replica i (it finishes what it holds), or routes to it again. */
  setServing(i: number, serving: boolean): void;
  /** Stops scraping replica i, once it has drained (it is gone from the fleet). */
  retire(i: number): void;
}

/** Replicas joining and leaving during a run: woken at `start`, then at each time `wake` returns. */
export interface FleetMembership {
  start: number;
  wake(now: number, ctl: FleetControl): number | undefined;
}

export interface FleetRunOptions {
  /** The fleet when it is one pool; with `pools`, the first pool (model, block size). */
  fleet: FleetConfig;
  /** The fleet pool by pool (replica indices run on across pools); default [fleet]. */
  pools?: FleetConfig[];
  /** The KV link of a P/D fleet (pd.ts); default RDMA's. */
  kvLink?: KvLinkConfig;
  workload: Workload;
  scheduler: Scheduler;
  /**
   * Several gateway replicas (gateways.ts): their schedulers (the first is `scheduler`), requests
   * round-robin across them, and their state sync (null: each learns alone). Default: one gateway.
   */
  gateways?: { schedulers: Scheduler[]; sync: GatewaySyncConfig | null };
  /** llm-d's legacy admission; not consulted when `flow` is given. */
  admission: Admission;
  /** Flow control (flow.ts): requests wait at the gateway until its saturation detector lets them go. */
  flow?: FlowSim | null;
  /** InferenceObjective name → priority, for requests tagged with an objective (mix workloads). */
  objectives?: ReadonlyMap<string, number>;
  /** Seeds the engines' output-token streams. */
  seed: number;
  /** Seconds between metric scrapes (> 0). */
  scrapeInterval: number;
  /** Seconds from the gateway's decision to the replica receiving the request (≥ 0). */
  gatewayDelay: number;
  /**
   * Give the router real token ids (a tokenizer in the gateway); else it hashes prompt bytes. A
   * router with a precise prefix producer always gets them.
   */
  routerTokenizer: boolean;
  /** Seconds from a step's end to its KV events reaching a precise prefix index (≥ 0; default 0). */
  kvEventsDelay?: number;
  /** Shared across runs so each distinct text chunk is tokenized once per process. */
  tokenizer?: PromptTokenizer;
  observer?: FleetObserver;
  /** Replicas that join and leave (autoscale.ts); without it every replica serves the whole run. */
  membership?: FleetMembership;
  /** Regions (locality.ts): requests with an origin pay the one-way delay to and from their replica. */
  locality?: LocalityConfig;
}

export interface FleetCounters {
  events: number;
  steps: number;
  scrapes: number;
  completed: number;
  dropped: number;
  prefillTokens: number;
  decodeTokens: number;
  /** KV-event batches applied to precise prefix indexes (0 without a precise router). */
  kvEventBatches: number;
}

export interface FleetRunResult {
  /** One record per workload request, in workload order (the live driver's record shape). */
  records: RequestRecord[];
  stageStarts: Array<number | undefined>;
  fleet: FleetResult;
  counters: FleetCounters;
  /** Virtual time of the last event handled. */
  endTime: number;
  /** P/D figures, when the fleet has a prefill pool. */
  pd?: PdSummary;
  /** With several gateways: how many, and the sync batches merged into peers. */
  gateways?: { count: number; syncBatchesMerged: number };
  /** The shared-storage tier's figures, when the fleet has one. */
  storage?: StorageSummary;
}

const PENDING = 0;
const IN_FLIGHT = 1;
const DONE = 2;
const EMPTY_TIMES = new Float64Array(0);
const EMPTY_TOKENS = new Uint8Array(0);

/** The scheduler's precise prefix producers, in config order (their indexes take the fleet's KV events). */
export function preciseProducers(scheduler: Scheduler): PrecisePrefixProducer[] {
  const out: PrecisePrefixProducer[] = [];
  for (const p of scheduler.plugins.values()) if (p instanceof PrecisePrefixProducer) out.push(p);
  return out;
}

export function runFleet(o: FleetRunOptions): FleetRunResult {
  if (!(o.scrapeInterval > 0) || !Number.isFinite(o.scrapeInterval))
    throw new RangeError(`scrapeInterval must be > 0, got ${o.scrapeInterval}`);
  if (!(o.gatewayDelay >= 0) || !Number.isFinite(o.gatewayDelay))
    throw new RangeError(`gatewayDelay must be ≥ 0, got ${o.gatewayDelay}`);
  const kvDelay = o.kvEventsDelay ?? 0;
  if (!(kvDelay >= 0) || !Number.isFinite(kvDelay))
    throw new RangeError(`kvEventsDelay must be ≥ 0, got ${kvDelay}`);
  const { workload, admission, observer } = o;
  const flow = o.flow ?? null;
  const objectives = o.objectives ?? new Map<string, number>();
  const q = new EventQueue();
  const gws = new SimGateways(o.gateways?.schedulers ?? [o.scheduler], q, o.gateways?.sync ?? null);
  const scheds = gws.schedulers;
  // Every gateway subscribes to the replicas' KV events itself: precise routing needs no sync.
  const precise = scheds.flatMap(preciseProducers);
  for (const p of precise)
    if (p.blockSizeTokens !== o.fleet.blockSize)
      throw new RangeError(
        `${p.typedName.name}: blockSizeTokens ${p.blockSizeTokens} must equal the engines' block size ${o.fleet.blockSize}`,
      );
  const withEvents = (f: FleetConfig) =>
    precise.length > 0 && !f.enableKvCacheEvents ? { ...f, enableKvCacheEvents: true } : f;
  const withTokenIds = o.routerTokenizer || precise.length > 0;
  const tok = o.tokenizer ?? new PromptTokenizer();
  // The tokenizer hands out one shared, never-modified array per distinct prompt: hash each once.
  const memo = new PromptHashMemo();
  const storage = fleetStorage(o.fleet);
  const replicas: Replica[] = [];
  const poolOf: number[] = [];
  const pools = o.pools ?? [o.fleet];
  for (const [k, pool] of pools.entries())
    for (let j = 0; j < pool.replicas; j++) {
      poolOf.push(k);
      replicas.push(new Replica(replicas.length, withEvents(pool), o.seed, memo, storage));
    }
  /** The replicas the router may pick (all of them unless a membership controller changes it). */
  const candidates: EndpointState[] = replicas.map((r) => r.state);
  for (const p of precise) for (const r of replicas) p.index.setEndpointModel(r.state.id, o.fleet.model);
  /** Per replica, the KV-event batches published and not yet applied, oldest first (from head). */
  const kvPending: KVEventBatch[][] = replicas.map(() => []);
  const kvHead: number[] = replicas.map(() => 0);
  const byEndpoint = new Map(replicas.map((r) => [r.state.id, r.index]));
  const byId = new Map(replicas.map((r) => [r.state.id, r]));
  /** Replicas scraped (not retired). */
  const live = new Set(replicas);
  const specs = workload.requests;
  const n = specs.length;
  const indexOf = new Map<string, number>();
  for (let i = 0; i < n; i++) {
    if (indexOf.has(specs[i].id)) throw new Error(`workload: duplicate request id ${specs[i].id}`);
    indexOf.set(specs[i].id, i);
  }
  // P/D when a pool has a role: prefill legs are table entries n + i (pd.ts).
  const pd = replicas.some((r) => r.state.labels[ROLE_LABEL] !== undefined)
    ? new PdRun(replicas, q, n, indexOf, o.kvLink ?? kvLinkConfig("rdma"), o.locality)
    : null;
  const status = new Uint8Array(n);
  const records: RequestRecord[] = new Array(n);
  const facts: Array<RequestFacts | undefined> = new Array(n);
  const tokens: Array<number[] | undefined> = new Array(n);
  const started = new Uint8Array(n);
  /** The gateway that picked request i. */
  const gwOf = new Uint16Array(n);
  const arrivals = new ArrivalScheduler(workload);
  const counters: FleetCounters = {
    events: 0,
    steps: 0,
    scrapes: 0,
    completed: 0,
    dropped: 0,
    prefillTokens: 0,
    decodeTokens: 0,
    kvEventBatches: 0,
  };
  let now = 0;
  let resolved = 0;
  let scrapeTick = 0;
  let nextArrivalAt = Number.POSITIVE_INFINITY;
  const kvTicks: KvTicks = { min: 0, mean: 0, max: 0, peak: 0, count: 0 };

  const resolve = (i: number) => {
    if (status[i] === DONE) throw new Error(`INV-2: request ${specs[i].id} resolved twice`);
    status[i] = DONE;
    resolved++;
    observer?.onResolved?.(now, records[i]);
    facts[i] = undefined;
    tokens[i] = undefined;
    arrivals.complete(specs[i].id, now);
    queueArrival();
  };
  const drop = (i: number, kind: string, message: string, httpStatus?: number, reason?: string) => {
    const r = records[i];
    r.end = now;
    r.error = {
      kind,
      message,
      ...(httpStatus !== undefined ? { status: httpStatus } : {}),
      ...(reason !== undefined ? { reason } : {}),
    };
    // A request flow control dispatched is no longer in flight: its slot may go to the next.
    const freed = flow?.finished(specs[i].id, null) === true;
    counters.dropped++;
    resolve(i);
    if (freed) pumpFlow();
  };
  const queueArrival = () => {
    const t = arrivals.nextTime();
    if (t === undefined || t >= nextArrivalAt) return;
    nextArrivalAt = Math.max(t, now);
    q.push(nextArrivalAt, Priority.ARRIVAL, "arrival");
  };
  const queueStart = (rep: Replica) => {
    if (rep.busy || rep.startPending) return;
    rep.startPending = true;
    q.push(now, Priority.STEP_START, "step-start", rep.index);
  };

  const arrive = (spec: RequestSpec) => {
    const i = indexOf.get(spec.id) as number;
    if (status[i] !== PENDING) throw new Error(`INV-2: request ${spec.id} arrived twice`);
    status[i] = IN_FLIGHT;
    const chat = spec.kind === "chat";
    const ids = chat ? tok.chat(spec.messages ?? []) : tok.completion(spec.prompt ?? "");
    records[i] = {
      id: spec.id,
      ...(spec.stage !== undefined ? { stage: spec.stage } : {}),
      ...(isWarmup(spec, workload) ? { warmup: true } : {}),
      start: now,
      end: now,
      chunkTimes: EMPTY_TIMES,
      chunkTokens: EMPTY_TOKENS,
      promptTokens: ids.length,
      completionTokens: 0,
    };
    observer?.onArrive?.(now, records[i]);
    const f: RequestFacts = {
      requestId: spec.id,
      model: o.fleet.model,
      prompt: chat
        ? { kind: "chat", messages: spec.messages ?? [] }
        : { kind: "completion", prompt: spec.prompt ?? "" },
      maxTokens: spec.maxTokens,
      stream: true,
      priority: priorityOf(objectives, spec.tags?.objective),
      ...(spec.sessionId !== undefined ? { sessionId: spec.sessionId } : {}),
      ...(withTokenIds ? { tokenIds: ids } : {}),
      // A tagged request's SLOs, as the gateway reads x-llm-d-slo-ttft-ms / -tpot-ms.
      ...(spec.tags?.sloTtftMs !== undefined ? { sloTtftMs: spec.tags.sloTtftMs } : {}),
      ...(spec.tags?.sloTpotMs !== undefined ? { sloTpotMs: spec.tags.sloTpotMs } : {}),
      ...(spec.origin !== undefined && o.locality ? { locality: { [o.locality.label]: spec.origin } } : {}),
    };
    if (flow !== null) {
      const rej = flow.enqueue(flow.request(spec, ids.length, now), now, candidates);
      if (rej !== null) return drop(i, `http_${rej.status}`, rej.message, rej.status, rej.reason);
      facts[i] = f;
      tokens[i] = ids;
      return pumpFlow();
    }
    const adm = admission.admit(f, candidates, now);
    if (!adm.admitted) return drop(i, `http_${adm.status}`, adm.message, adm.status, adm.reason);
    route(i, f, ids);
  };

  /** Flow control lets go what it may now; while anything waits, its TTL sweep stays queued. */
  let sweepQueued = false;
  const pumpFlow = () => {
    if (flow === null) return;
    for (const d of flow.dispatch(now, candidates)) {
      const i = indexOf.get(d.id) as number;
      route(i, facts[i] as RequestFacts, tokens[i] as number[]);
    }
    if (flow.controller.size > 0 && !sweepQueued) {
      sweepQueued = true;
      q.push(now + FLOW_SWEEP_S, Priority.ARRIVAL, "flow-sweep");
    }
  };
  const sweepFlow = () => {
    sweepQueued = false;
    const f = flow as FlowSim;
    for (const e of f.expire(now, candidates)) {
      const i = indexOf.get(e.id) as number;
      const r = e.rejection;
      drop(i, `http_${r.status}`, r.message, r.status, r.reason);
    }
    pumpFlow();
  };

  /** Schedules an admitted request and sends it on to its replica. */
  const route = (i: number, f: RequestFacts, ids: number[]) => {
    const spec = specs[i];
    const g = gws.nextGateway();
    const scheduler = scheds[g];
    gwOf[i] = g;
    const result = scheduler.schedule(f, candidates, now);
    observer?.onSchedule?.(now, f, candidates, result.target?.id ?? null);
    if (result.failure !== null || result.target === null) {
      const st = result.failure?.status ?? 503;
      return drop(i, `http_${st}`, result.failure?.message ?? "no target", st);
    }
    const rep = byId.get(result.target.id);
    if (rep === undefined) throw new Error(`scheduler picked unknown endpoint ${result.target.id}`);
    scheduler.onPicked(f, result, now);
    gws.touched(g, now);
    facts[i] = f;
    tokens[i] = ids;
    const prefill = pd?.route(i, spec.id, result, byEndpoint) ?? null;
    flow?.placed(spec.id, (prefill ?? rep).state.id);
    records[i].endpoint = rep.state.id;
    const hop = o.locality ? oneWayDelay(o.locality, spec.origin, rep.state.labels) : 0;
    if (hop > 0) records[i].networkDelay = hop;
    q.push(now + o.gatewayDelay + hop, Priority.DELIVER, "deliver", (prefill ?? rep).index, i);
  };

  const deliver = (e: SimEvent) => {
    const i = e.request;
    const rep = replicas[e.replica];
    const spec = specs[i];
    const ids = tokens[i] as number[];
    const leg = pd?.leg(i) ?? "whole";
    try {
      rep.engine.addRequest(
        leg === "prefill"
          ? pd!.prefillRequest(spec.id, ids)
          : leg === "decode"
            ? pd!.decodeRequest(spec.id, ids, spec.maxTokens)
            : { id: spec.id, promptTokenIds: ids, maxTokens: spec.maxTokens, ignoreEos: true },
        now,
      );
    } catch (err) {
      if (!(err instanceof EngineInputError)) throw err;
      scheds[gwOf[i]].onResponseComplete(facts[i] as RequestFacts, rep.state.id, now);
      pd?.forget(i, spec.id);
      return drop(i, "http_400", err.message, 400);
    }
    // A prefill leg's prompt is kept for its decode leg.
    if (leg !== "prefill") tokens[i] = undefined;
    queueStart(rep);
  };

  const finish = (i: number, rep: Replica, rec: EngineRecord) => {
    const r = records[i];
    const m = rec.tokenTimes.length;
    r.end = now;
    r.chunkTimes = rep.timeline.tokenTimes(rec.tokenTimes);
    r.chunkTokens = oneTokenChunks(m);
    r.completionTokens = rec.outputTokenIds.length;
    // A decode leg's transferred tokens are not prefix-cache hits.
    r.cachedTokens = rec.cachedTokens - (rec.externalTokens ?? 0);
    scheds[gwOf[i]].onResponseComplete(facts[i] as RequestFacts, rep.state.id, now, {
      outputTokens: r.completionTokens,
    });
    gws.touched(gwOf[i], now);
    counters.completed++;
    resolve(i);
    if (flow?.finished(specs[i].id, { promptTokens: r.promptTokens, outputTokens: r.completionTokens }))
      pumpFlow();
  };

  let pumpAfterStep = false;
  const stepEnd = (rep: Replica) => {
    const res = rep.endStep();
    observer?.onStepEnd?.(now, rep.index, res);
    if (precise.length > 0 && res.kvEvents !== null) {
      kvPending[rep.index].push(res.kvEvents);
      q.push(now + kvDelay, Priority.KV_EVENTS, "kv-events", rep.index);
    }
    const at = rep.outputIndices(res.outputs, indexOf);
    for (let k = 0; k < res.outputs.length; k++) {
      const out = res.outputs[k];
      const i = at[k];
      if (i >= n) {
        // A prefill leg: its token is not the client's.
        (pd as PdRun).prefillOutput(i - n, out, now);
        continue;
      }
      if (started[i] === 0) {
        started[i] = 1;
        scheds[gwOf[i]].onResponseStarted(facts[i] as RequestFacts, rep.state.id, now);
        if (flow?.prefilled(specs[i].id)) pumpAfterStep = true;
      }
      if (out.record !== undefined) finish(i, rep, out.record);
    }
    rep.publish();
    if (hasRunnable(rep)) queueStart(rep);
    // A long prefill ended: flow control's prefill reserve may let a held request go.
    if (pumpAfterStep) {
      pumpAfterStep = false;
      pumpFlow();
    }
  };

  /** The replica's oldest pending batch reaches the precise indexes (batches of one replica keep their order). */
  const applyKvEvents = (rep: Replica) => {
    const pending = kvPending[rep.index];
    const head = kvHead[rep.index]++;
    const batch = pending[head];
    if (head + 1 === pending.length) {
      pending.length = 0;
      kvHead[rep.index] = 0;
    } else if (head >= 1023) {
      // A delay longer than a step keeps batches queued: drop the applied ones now and then.
      pending.splice(0, head + 1);
      kvHead[rep.index] = 0;
    }
    for (const p of precise) for (const ev of batch.events) p.index.applyEvent(rep.state.id, ev);
    counters.kvEventBatches++;
  };

  const scrape = () => {
    let lo = Number.POSITIVE_INFINITY;
    let hi = 0;
    let sum = 0;
    for (const rep of live) {
      const m = rep.scrape(now);
      observer?.onScrape?.(now, rep.index, m);
      lo = Math.min(lo, m.kvCacheUsagePercent);
      hi = Math.max(hi, m.kvCacheUsagePercent);
      sum += m.kvCacheUsagePercent;
    }
    kvTicks.min += lo;
    kvTicks.max += hi;
    kvTicks.mean += sum / live.size;
    kvTicks.peak = Math.max(kvTicks.peak, hi);
    kvTicks.count++;
    counters.scrapes++;
    // k × interval rather than repeated addition, so scrape times carry no accumulated error.
    q.push(++scrapeTick * o.scrapeInterval, Priority.SCRAPE, "scrape");
    // utilization-detector's saturation moves with the scrape.
    if (flow !== null && flow.controller.size > 0) pumpFlow();
  };

  /** Engine request ids of CPU-tier loads in flight, by the index their offload-done event carries. */
  const offloadIds: (string | undefined)[] = [];
  const freeSlots: number[] = [];
  const control: FleetControl = {
    replicas,
    poolOf,
    add(pool) {
      const rep = new Replica(replicas.length, withEvents(pools[pool]), o.seed, memo, storage);
      replicas.push(rep);
      poolOf.push(pool);
      kvPending.push([]);
      kvHead.push(0);
      byEndpoint.set(rep.state.id, rep.index);
      byId.set(rep.state.id, rep);
      live.add(rep);
      for (const p of precise) p.index.setEndpointModel(rep.state.id, o.fleet.model);
      rep.scrape(now);
      candidates.push(rep.state);
      return rep.index;
    },
    setServing(i, serving) {
      const st = replicas[i].state;
      const at = candidates.indexOf(st);
      if (serving && at < 0) candidates.push(st);
      else if (!serving && at >= 0) candidates.splice(at, 1);
    },
    retire(i) {
      live.delete(replicas[i]);
    },
  };
  if (o.membership !== undefined) q.push(o.membership.start, Priority.SCRAPE, "membership");
  q.push(0, Priority.SCRAPE, "scrape");
  // Measurements taken between requests (Scheduler.refresh, e.g. the locality filter's saturation):
  // every gateway's, at the shortest period any asks for, on the virtual clock as the gateway's timer.
  const periods = scheds.map((s) => s.refreshIntervalS).filter((p): p is number => p !== null && p > 0);
  const refreshS = periods.length > 0 ? Math.min(...periods) : null;
  let refreshTick = 0;
  if (refreshS !== null) q.push(0, Priority.REFRESH, "refresh");
  queueArrival();
  while (resolved < n) {
    const e = q.pop();
    if (e === undefined)
      throw new Error(`INV-3: fleet run stalled at t=${now}: ${n - resolved} requests unresolved`);
    if (e.time < now) throw new Error(`INV-1: event at t=${e.time} after t=${now}`);
    now = e.time;
    counters.events++;
    observer?.onEvent?.(e);
    switch (e.kind) {
      case "step-end":
        stepEnd(replicas[e.replica]);
        break;
      case "kv-events":
        applyKvEvents(replicas[e.replica]);
        break;
      case "scrape":
        scrape();
        break;
      case "refresh":
        for (const s of scheds) s.refresh(now);
        q.push(++refreshTick * (refreshS as number), Priority.REFRESH, "refresh");
        break;
      case "sync-flush":
      case "sync-deliver":
        gws.handle(e, now);
        break;
      case "membership": {
        const next = (o.membership as FleetMembership).wake(now, control);
        if (next !== undefined) q.push(Math.max(next, now), Priority.SCRAPE, "membership");
        break;
      }
      case "arrival":
        if (e.time === nextArrivalAt) nextArrivalAt = Number.POSITIVE_INFINITY;
        for (const s of arrivals.takeDue(now)) arrive(s.spec);
        queueArrival();
        break;
      case "deliver":
        deliver(e);
        break;
      case "flow-sweep":
        sweepFlow();
        break;
      case "kv-start":
        (pd as PdRun).startTransfer(replicas[e.replica], e.request, now);
        break;
      case "kv-done": {
        const d = replicas[e.replica];
        const p = (pd as PdRun).transferDone(d, e.request, now, specs[e.request].id);
        d.publish();
        p.publish();
        queueStart(d);
        if (hasRunnable(p)) queueStart(p);
        break;
      }
      case "offload-done": {
        const rep = replicas[e.replica];
        const id = offloadIds[e.request] as string;
        offloadIds[e.request] = undefined;
        freeSlots.push(e.request);
        rep.engine.completeRemoteKv(id, now, true);
        rep.publish();
        queueStart(rep);
        break;
      }
      case "step-start": {
        const rep = replicas[e.replica];
        rep.startPending = false;
        if (!rep.busy && hasRunnable(rep)) {
          const end = rep.startStep(now);
          if (end !== null) q.push(end, Priority.STEP_END, "step-end", rep.index);
          else {
            // Blocked on blocks that wait for CPU-tier stores: step again when they are freed.
            const free = rep.engine.nextOffloadFree();
            if (free !== null) {
              rep.startPending = true;
              q.push(Math.max(now, free), Priority.STEP_START, "step-start", rep.index);
            }
          }
          // CPU-tier loads this step started end at their modelled time (the caller completes them).
          for (const l of rep.inFlight?.offloadLoads ?? []) {
            const slot = freeSlots.pop() ?? offloadIds.length;
            offloadIds[slot] = l.requestId;
            q.push(l.readyAt, Priority.DELIVER, "offload-done", rep.index, slot);
          }
          // Decode legs this step parked pull their KV from now on (vLLM starts the load with the step).
          const parked = rep.inFlight?.remoteKvNeeded;
          if (parked !== undefined) (pd as PdRun).afterStep(rep, parked, now);
        }
        break;
      }
    }
  }
  for (const rep of replicas) {
    counters.steps += rep.steps;
    counters.prefillTokens += rep.prefillTokens;
    counters.decodeTokens += rep.decodeTokens;
    if (rep.busy || rep.engine.hasUnfinishedRequests() || rep.engine.stats().numHeldRequests > 0)
      throw new Error(`INV-2: replica ${rep.state.id} still has work after every request resolved`);
  }
  return {
    records,
    stageStarts: workload.stages.map((s) => arrivals.stageStart(s.index)),
    fleet: fleetResult(replicas, kvTicks),
    counters,
    endTime: now,
    ...(pd !== null ? { pd: pd.summary() } : {}),
    ...(gws.count > 1 ? { gateways: { count: gws.count, syncBatchesMerged: gws.merged } } : {}),
    ...(storage !== undefined ? { storage: storageSummary(storage, replicas) } : {}),
  };
}

/** The replica has a request a step can run (not only decode legs waiting for their KV). */
function hasRunnable(rep: Replica): boolean {
  if (!rep.engine.hasUnfinishedRequests()) return false;
  const s = rep.engine.stats();
  return s.numRequestsRunning + s.numRequestsWaiting - s.numRequestsWaitingDeferred > 0;
}
