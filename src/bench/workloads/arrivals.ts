/**
 * Arrival processes and their application to generated requests. Open loop: constant, Poisson,
 * gamma (vllm bench serve's burstiness: shape = burstiness, scale = 1/(rate·burstiness)) and
 * stages (an inference-perf style QPS sweep, floor(rate × duration) requests per stage). Closed
 * loop: a fixed number of users, each starting its next request when the previous one finishes;
 * those start times are left to the scheduler as `after` dependencies. Pure: seeds in, times out.
 */
import { exponential, gamma, type Rng, streamRng } from "./sampling.ts";
import type { RequestSpec, StageInfo } from "./types.ts";

export type RateProcess = "constant" | "poisson" | "gamma";

export interface StageSpec {
  rate: number;
  duration: number;
  warmup?: boolean;
}

export type ArrivalSpec =
  | { type: "constant"; rate: number }
  | { type: "poisson"; rate: number }
  | { type: "gamma"; rate: number; burstiness: number }
  | {
      type: "closed";
      users: number;
      thinkTime?: number;
      rampUp?: number;
      /** Each user's first `warmup` requests are sent but not measured (their prefixes are cold). */
      warmup?: number;
    }
  | {
      type: "stages";
      process?: RateProcess;
      burstiness?: number;
      stages: StageSpec[];
      /** Wait for the previous stage to finish before starting the next (inference-perf). */
      barrier?: boolean;
      /** Pause between stages in seconds (with or without barrier). */
      interval?: number;
      /** Rescale each stage's arrivals so the last one lands at count/rate (vllm bench serve). Default true. */
      fit?: boolean;
    };

/** floor(rate × duration), robust to float error such as 0.1 × 30 = 2.9999…. */
export function stageCount(rate: number, duration: number): number {
  return Math.floor(rate * duration + 1e-9);
}

/** n inter-arrival gaps of a rate process; burstiness only matters for gamma (1 = Poisson). */
export function interArrivalGaps(
  rng: Rng,
  process: RateProcess,
  rate: number,
  n: number,
  burstiness = 1,
): number[] {
  if (!(rate > 0) || !Number.isFinite(rate)) throw new RangeError(`arrival rate must be > 0, got ${rate}`);
  if (!(burstiness > 0)) throw new RangeError(`burstiness must be > 0, got ${burstiness}`);
  const gaps = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    if (process === "constant") gaps[i] = 1 / rate;
    else if (process === "poisson") gaps[i] = exponential(rng, rate);
    else gaps[i] = gamma(rng, burstiness, 1 / (rate * burstiness));
  }
  return gaps;
}

/**
 * n arrival times from `start`. Constant: start, start + 1/rate, …. Random processes: cumulative
 * gaps; with `fit`, rescaled so the last arrival is at start + n/rate (vllm bench serve).
 */
export function arrivalTimes(
  rng: Rng,
  process: RateProcess,
  rate: number,
  n: number,
  opts: { start?: number; burstiness?: number; fit?: boolean } = {},
): number[] {
  const start = opts.start ?? 0;
  if (process === "constant") return Array.from({ length: n }, (_, i) => start + i / rate);
  const gaps = interArrivalGaps(rng, process, rate, n, opts.burstiness);
  const out = new Array<number>(n);
  let t = 0;
  for (let i = 0; i < n; i++) out[i] = t += gaps[i];
  const scale = opts.fit && n > 0 ? n / rate / t : 1;
  for (let i = 0; i < n; i++) out[i] = start + out[i] * scale;
  return out;
}

/** Where units (single requests or whole sessions) start. */
export interface ArrivalPlan {
  /** Open loop: one slot per unit. Closed loop: empty (users chain their own requests). */
  slots: Array<{ time: number; stage?: number }>;
  stages: StageInfo[];
  stageBarrier?: { interval: number };
  closed?: { users: number; thinkTime: number; rampUp: number; warmup: number };
  /** Number of units the generator must produce. */
  units: number;
}

function checkPositive(name: string, v: number, allowZero = false): void {
  if (!Number.isFinite(v) || v < 0 || (!allowZero && v === 0))
    throw new RangeError(`${name} must be ${allowZero ? "≥ 0" : "> 0"}, got ${v}`);
}

/**
 * Plans arrivals. `numUnits` is required for constant/poisson/gamma/closed; stages decide their
 * own count and ignore it (pass it to cap the total).
 */
export function planArrivals(spec: ArrivalSpec, numUnits: number | undefined, seed: number): ArrivalPlan {
  const rng = streamRng(seed, "arrivals");
  if (spec.type === "stages") {
    if (spec.stages.length === 0) throw new RangeError("stages: at least one stage is needed");
    const process = spec.process ?? "poisson";
    const interval = spec.interval ?? 0;
    checkPositive("stages.interval", interval, true);
    const stages: StageInfo[] = [];
    const slots: ArrivalPlan["slots"] = [];
    let start = 0;
    for (const [index, s] of spec.stages.entries()) {
      checkPositive(`stages[${index}].rate`, s.rate);
      checkPositive(`stages[${index}].duration`, s.duration);
      let count = stageCount(s.rate, s.duration);
      if (numUnits !== undefined) count = Math.max(0, Math.min(count, numUnits - slots.length));
      stages.push({ index, rate: s.rate, duration: s.duration, start, count, warmup: s.warmup ?? false });
      const times = arrivalTimes(rng, process, s.rate, count, {
        start,
        burstiness: spec.burstiness,
        fit: spec.fit ?? true,
      });
      for (const time of times) slots.push({ time, stage: index });
      start += s.duration + interval;
    }
    return {
      slots,
      stages,
      units: slots.length,
      ...(spec.barrier ? { stageBarrier: { interval } } : {}),
    };
  }
  if (numUnits === undefined || !Number.isInteger(numUnits) || numUnits < 0)
    throw new RangeError(`arrivals "${spec.type}" need a request count (numRequests)`);
  if (spec.type === "closed") {
    if (!Number.isInteger(spec.users) || spec.users < 1) throw new RangeError("closed.users must be ≥ 1");
    const thinkTime = spec.thinkTime ?? 0;
    const rampUp = spec.rampUp ?? 0;
    checkPositive("closed.thinkTime", thinkTime, true);
    checkPositive("closed.rampUp", rampUp, true);
    const warmup = spec.warmup ?? 0;
    if (!Number.isInteger(warmup) || warmup < 0)
      throw new RangeError(`closed.warmup must be a whole number of requests per user ≥ 0, got ${warmup}`);
    return {
      slots: [],
      stages: [],
      units: numUnits,
      closed: { users: spec.users, thinkTime, rampUp, warmup },
    };
  }
  const burstiness = spec.type === "gamma" ? spec.burstiness : 1;
  const times = arrivalTimes(rng, spec.type, spec.rate, numUnits, { burstiness });
  return { slots: times.map((time) => ({ time })), stages: [], units: numUnits };
}

/** A request before it is placed in time. */
export type RequestBody = Omit<RequestSpec, "id" | "arrivalTime" | "after" | "stage">;

/**
 * Places units in time and numbers the requests. Within a unit, each request after the first
 * starts `intraDelay` seconds after the previous one finishes. Closed loop: unit i belongs to user
 * i mod users, whose first request starts at rampUp·u/users and whose every later request starts
 * thinkTime after the user's previous request finishes; each user's first `warmup` requests are
 * marked warm-up.
 */
export function applyArrivals(units: RequestBody[][], plan: ArrivalPlan, intraDelay = 0): RequestSpec[] {
  const out: RequestSpec[] = [];
  const add = (body: RequestBody, fields: Pick<RequestSpec, "arrivalTime" | "after" | "stage">) => {
    const id = `r${out.length}`;
    out.push({ id, ...fields, ...body });
    return out[out.length - 1];
  };
  if (plan.closed) {
    const { users, thinkTime, rampUp, warmup } = plan.closed;
    const last = new Array<RequestSpec | undefined>(users);
    const turnOf = new Array<number>(users).fill(0);
    for (const [i, unit] of units.entries()) {
      const u = i % users;
      for (const [k, body] of unit.entries()) {
        const prev = last[u];
        const delay = k === 0 ? thinkTime : intraDelay;
        const spec = prev
          ? add(body, { arrivalTime: prev.arrivalTime + delay, after: { id: prev.id, delay } })
          : add(body, { arrivalTime: (rampUp * u) / users });
        turnOf[u]++;
        if (spec.turn === undefined) spec.turn = turnOf[u];
        if (turnOf[u] <= warmup) spec.warmup = true;
        last[u] = spec;
      }
    }
    return out;
  }
  if (units.length > plan.slots.length)
    throw new RangeError(`applyArrivals: ${units.length} units but ${plan.slots.length} arrival slots`);
  for (const [i, unit] of units.entries()) {
    const slot = plan.slots[i];
    let prev: RequestSpec | undefined;
    for (const body of unit) {
      const stage = slot.stage;
      prev = prev
        ? add(body, {
            arrivalTime: prev.arrivalTime + intraDelay,
            after: { id: prev.id, delay: intraDelay },
            stage,
          })
        : add(body, { arrivalTime: slot.time, stage });
      if (stage === undefined) delete prev.stage;
    }
  }
  return out;
}
