/**
 * Autoscaling in the fleet simulator: a membership controller for runFleet (fleet.ts) that runs an
 * autoscaling policy (src/autoscale) in virtual time. Every `sampleInterval` seconds it samples the
 * gateway's traffic and each pool's replicas (the scraped vLLM gauges and each GPU's busy share)
 * for the policy; every policy interval it asks for each pool's desired count and acts on it:
 *   - up: new replicas are asked for at once and join the router's candidates `startupDelay`
 *     seconds later (the model load), with a cold cache;
 *   - down: replicas still starting are cancelled first (newest first, as a Deployment removes
 *     unready pods first), then serving ones stop getting new requests — the least loaded first —
 *     and leave when they have finished what they hold (drained).
 * A replica costs GPU time from the moment it is asked for until it has drained (or is cancelled),
 * × its tensor parallelism: the GPU-seconds meter.
 */

import {
  type AutoscalePolicy,
  emptyTrafficSample,
  type PoolRole,
  type PoolSample,
  type ReplicaSample,
  type Sample,
} from "../../autoscale/types.ts";
import type { RequestRecord } from "../../bench/metrics.ts";
import { requestMetrics } from "../../bench/request-metrics.ts";
import type { StepResult } from "../../engine/types.ts";
import type { FleetControl, FleetMembership, FleetObserver } from "./fleet.ts";

export interface ManagedPool {
  name: string;
  role: PoolRole;
  /** GPUs per replica (tensor parallelism). */
  gpus: number;
  /** Replicas serving at t = 0 (already loaded). */
  initial: number;
}

/** One change of a pool's asked-for count. */
export interface ScalingAction {
  time: number;
  pool: string;
  from: number;
  to: number;
  reason: string;
}

/** The pool sizes over time, one point per change. */
export interface SizePoint {
  time: number;
  pool: string;
  ready: number;
  starting: number;
  draining: number;
}

interface Starting {
  pool: number;
  askedAt: number;
  readyAt: number;
}

interface Serving {
  replica: number;
  askedAt: number;
  drainingSince: number | null;
}

export class AutoscaleController implements FleetMembership, FleetObserver {
  readonly start = 0;
  readonly actions: ScalingAction[] = [];
  readonly sizes: SizePoint[] = [];
  readonly decisions: { time: number; pool: string; desired: number; reason: string }[] = [];
  /** GPU-seconds of replicas already gone (cancelled or drained). */
  #gpuSecondsDone = 0;
  #starting: Starting[] = [];
  /** Per pool, its serving and draining replicas. */
  readonly #serving: Serving[][];
  /** GPU busy seconds per replica (from step start and end times). */
  readonly #busy: number[] = [];
  readonly #busyAtSample: number[] = [];
  #traffic = emptyTrafficSample();
  #lastSample = 0;
  #nextSample: number;
  #nextDecision: number;
  #lastPools: PoolSample[] = [];

  constructor(
    readonly pools: readonly ManagedPool[],
    readonly policy: AutoscalePolicy,
    readonly startupDelay: number,
    readonly sampleInterval = 2,
  ) {
    if (!(startupDelay >= 0)) throw new RangeError(`startupDelay must be ≥ 0, got ${startupDelay}`);
    if (!(sampleInterval > 0)) throw new RangeError(`sampleInterval must be > 0, got ${sampleInterval}`);
    this.#serving = pools.map(() => []);
    let r = 0;
    for (const [k, p] of pools.entries())
      for (let j = 0; j < p.initial; j++)
        this.#serving[k].push({ replica: r++, askedAt: 0, drainingSince: null });
    this.#nextSample = sampleInterval;
    this.#nextDecision = policy.interval;
  }

  // Observer: the traffic and GPU busy time the samples are made of.
  onArrive(_now: number, r: RequestRecord): void {
    this.#traffic.arrivals++;
    this.#traffic.inputTokens += r.promptTokens;
  }
  onResolved(_now: number, r: RequestRecord): void {
    if (r.error !== undefined) return;
    const m = requestMetrics(r, false);
    const t = this.#traffic;
    t.completions++;
    t.outputTokens += r.completionTokens;
    t.completedInputTokens += r.promptTokens;
    t.cachedTokens += r.cachedTokens ?? 0;
    if (m.ttft !== undefined) {
      t.ttfts.push(m.ttft);
      t.tpots.push(m.tpot ?? 0);
    }
  }
  onStepEnd(_now: number, replica: number, res: StepResult): void {
    this.#busy[replica] = (this.#busy[replica] ?? 0) + (res.endTime - res.startTime);
  }

  /** GPU-seconds up to `now` (replicas still up counted to now). */
  gpuSeconds(now: number): number {
    let s = this.#gpuSecondsDone;
    for (const st of this.#starting) s += (now - st.askedAt) * this.pools[st.pool].gpus;
    for (const [k, list] of this.#serving.entries())
      for (const r of list) s += (now - r.askedAt) * this.pools[k].gpus;
    return s;
  }

  wake(now: number, ctl: FleetControl): number | undefined {
    if (this.sizes.length === 0) this.#recordSizes(now);
    // Replicas whose model finished loading join the candidates.
    const due = this.#starting.filter((s) => s.readyAt <= now);
    if (due.length > 0) {
      this.#starting = this.#starting.filter((s) => s.readyAt > now);
      for (const s of due)
        this.#serving[s.pool].push({ replica: ctl.add(s.pool), askedAt: s.askedAt, drainingSince: null });
      this.#recordSizes(now);
    }
    if (now >= this.#nextSample - 1e-9) {
      this.#retireDrained(now, ctl);
      this.#sample(now, ctl);
      this.#nextSample = now + this.sampleInterval;
    }
    if (now >= this.#nextDecision - 1e-9) {
      this.#decide(now, ctl);
      this.#nextDecision = now + this.policy.interval;
    }
    let next = Math.min(this.#nextSample, this.#nextDecision);
    for (const s of this.#starting) next = Math.min(next, s.readyAt);
    return next;
  }

  #retireDrained(now: number, ctl: FleetControl): void {
    for (const [k, list] of this.#serving.entries()) {
      const keep: Serving[] = [];
      for (const r of list) {
        const rep = ctl.replicas[r.replica];
        const idle =
          r.drainingSince !== null &&
          !rep.busy &&
          !rep.engine.hasUnfinishedRequests() &&
          rep.engine.stats().numHeldRequests === 0;
        if (!idle) {
          keep.push(r);
          continue;
        }
        // It left when its last step ended (or when it was told to drain, if it held nothing).
        const gone = Math.max(r.drainingSince as number, Math.min(now, lastStepEnd(rep.timeline, now)));
        this.#gpuSecondsDone += (gone - r.askedAt) * this.pools[k].gpus;
        ctl.retire(r.replica);
      }
      if (keep.length !== list.length) {
        this.#serving[k] = keep;
        this.#recordSizes(now);
      }
    }
  }

  #sample(now: number, ctl: FleetControl): void {
    const period = now - this.#lastSample;
    const pools = this.pools.map((p, k): PoolSample => {
      const serving = this.#serving[k].filter((r) => r.drainingSince === null);
      const replicas = serving.map((r): ReplicaSample => {
        const m = ctl.replicas[r.replica].state.metrics;
        const busy = (this.#busy[r.replica] ?? 0) - (this.#busyAtSample[r.replica] ?? 0);
        return {
          kvUsage: m?.kvCacheUsagePercent ?? 0,
          waiting: m?.waitingQueueSize ?? 0,
          running: m?.runningRequestsSize ?? 0,
          busy: period > 0 ? Math.min(1, busy / period) : 0,
        };
      });
      const starting = this.#starting.filter((s) => s.pool === k).length;
      return {
        name: p.name,
        role: p.role,
        ready: serving.length,
        starting,
        target: serving.length + starting,
        replicas,
      };
    });
    for (let i = 0; i < ctl.replicas.length; i++) this.#busyAtSample[i] = this.#busy[i] ?? 0;
    if (period > 0) {
      const s: Sample = { now, period, traffic: this.#traffic, pools };
      this.policy.observe(s);
    }
    this.#traffic = emptyTrafficSample();
    this.#lastSample = now;
    this.#lastPools = pools;
  }

  #decide(now: number, ctl: FleetControl): void {
    const pools = this.#lastPools;
    if (pools.length === 0) return;
    for (const d of this.policy.decide(now, pools)) {
      const k = this.pools.findIndex((p) => p.name === d.pool);
      const ps = pools[k];
      this.decisions.push({ time: now, pool: d.pool, desired: d.desired, reason: d.reason });
      if (d.desired === ps.target) continue;
      this.actions.push({ time: now, pool: d.pool, from: ps.target, to: d.desired, reason: d.reason });
      if (d.desired > ps.target) {
        for (let j = ps.target; j < d.desired; j++)
          this.#starting.push({ pool: k, askedAt: now, readyAt: now + this.startupDelay });
      } else {
        let remove = ps.target - d.desired;
        // Cancel the newest starting replicas first.
        for (let j = this.#starting.length - 1; j >= 0 && remove > 0; j--) {
          if (this.#starting[j].pool !== k) continue;
          this.#gpuSecondsDone += (now - this.#starting[j].askedAt) * this.pools[k].gpus;
          this.#starting.splice(j, 1);
          remove--;
        }
        // Then drain the least loaded serving replicas.
        const serving = this.#serving[k].filter((r) => r.drainingSince === null);
        const load = (r: Serving) => {
          const m = ctl.replicas[r.replica].state.metrics;
          return (m?.runningRequestsSize ?? 0) + (m?.waitingQueueSize ?? 0);
        };
        serving.sort((a, b) => load(a) - load(b) || b.replica - a.replica);
        for (const r of serving.slice(0, remove)) {
          r.drainingSince = now;
          ctl.setServing(r.replica, false);
        }
      }
      // Update the pool as the next decision will see it.
      const serving = this.#serving[k].filter((r) => r.drainingSince === null).length;
      const starting = this.#starting.filter((s) => s.pool === k).length;
      pools[k] = { ...ps, ready: serving, starting, target: serving + starting };
    }
    this.#recordSizes(now);
  }

  #recordSizes(now: number): void {
    for (const [k, p] of this.pools.entries()) {
      const list = this.#serving[k];
      const point: SizePoint = {
        time: now,
        pool: p.name,
        ready: list.filter((r) => r.drainingSince === null).length,
        starting: this.#starting.filter((s) => s.pool === k).length,
        draining: list.filter((r) => r.drainingSince !== null).length,
      };
      const last = [...this.sizes].reverse().find((s) => s.pool === p.name);
      if (
        last &&
        last.ready === point.ready &&
        last.starting === point.starting &&
        last.draining === point.draining
      )
        continue;
      this.sizes.push(point);
    }
  }
}

/** The end of a replica's last step at or before `now` (0 if it never stepped). */
function lastStepEnd(timeline: { last(): number | undefined }, now: number): number {
  const t = timeline.last();
  return t === undefined ? 0 : Math.min(t, now);
}
