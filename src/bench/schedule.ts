/**
 * When each request of a workload starts, as completions come in: open-loop requests at their
 * arrival time, `after` requests (closed-loop users, multi-turn turns) at their dependency's
 * completion + delay, and barriered stages (inference-perf) once the previous stage has drained
 * plus the interval. Pure and clock-free: the live driver feeds it wall-derived workload seconds,
 * the fleet simulator its virtual time.
 */
import type { RequestSpec, Workload } from "./workloads/types.ts";

export interface Scheduled {
  spec: RequestSpec;
  /** Start time in workload seconds. */
  time: number;
}

interface Entry extends Scheduled {
  seq: number;
}

/** Binary min-heap on (time, seq). */
class Heap {
  readonly #a: Entry[] = [];
  get size(): number {
    return this.#a.length;
  }
  peek(): Entry | undefined {
    return this.#a[0];
  }
  #less(i: number, j: number): boolean {
    const x = this.#a[i];
    const y = this.#a[j];
    return x.time < y.time || (x.time === y.time && x.seq < y.seq);
  }
  #swap(i: number, j: number): void {
    const t = this.#a[i];
    this.#a[i] = this.#a[j];
    this.#a[j] = t;
  }
  push(e: Entry): void {
    const a = this.#a;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.#less(i, p)) break;
      this.#swap(i, p);
      i = p;
    }
  }
  pop(): Entry | undefined {
    const a = this.#a;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && this.#less(l, m)) m = l;
        if (r < a.length && this.#less(r, m)) m = r;
        if (m === i) break;
        this.#swap(i, m);
        i = m;
      }
    }
    return top;
  }
}

export class ArrivalScheduler {
  readonly #w: Workload;
  readonly #heap = new Heap();
  readonly #seq = new Map<string, number>();
  readonly #dependents = new Map<string, RequestSpec[]>();
  readonly #completedAt = new Map<string, number>();
  /** Per stage: requests not yet completed, and requests waiting for the stage to open. */
  readonly #remaining: number[];
  readonly #waiting: RequestSpec[][];
  readonly #stageStart: Array<number | undefined>;
  #released = 0;

  constructor(workload: Workload) {
    this.#w = workload;
    const nStages = workload.stages.length;
    this.#remaining = new Array(nStages).fill(0);
    this.#waiting = Array.from({ length: nStages }, () => []);
    this.#stageStart = new Array(nStages).fill(undefined);
    const ids = new Set(workload.requests.map((r) => r.id));
    for (const [i, r] of workload.requests.entries()) {
      this.#seq.set(r.id, i);
      if (r.stage !== undefined) this.#remaining[r.stage]++;
      if (r.after && ids.has(r.after.id)) {
        const list = this.#dependents.get(r.after.id);
        if (list) list.push(r);
        else this.#dependents.set(r.after.id, [r]);
      } else if (r.stage !== undefined && workload.stageBarrier) this.#waiting[r.stage].push(r);
      else this.#push(r, r.arrivalTime);
    }
    if (workload.stageBarrier) this.#openStage(0, 0);
    else for (const s of workload.stages) this.#stageStart[s.index] = s.start;
  }

  #push(spec: RequestSpec, time: number): void {
    this.#heap.push({ spec, time, seq: this.#seq.get(spec.id) ?? 0 });
  }

  /** Opens stage i at `at` and releases its open-loop requests; empty stages cascade. */
  #openStage(i: number, at: number): void {
    const stages = this.#w.stages;
    while (i < stages.length && this.#stageStart[i] === undefined) {
      this.#stageStart[i] = at;
      const offset = at - stages[i].start;
      for (const r of this.#waiting[i]) this.#push(r, r.arrivalTime + offset);
      this.#waiting[i] = [];
      if (this.#remaining[i] > 0) return;
      at += this.#w.stageBarrier?.interval ?? 0;
      i++;
    }
  }

  /** Earliest start time known now; undefined when everything left waits on completions. */
  nextTime(): number | undefined {
    return this.#heap.peek()?.time;
  }

  /** Removes and returns the requests due at or before `now`, in start order. */
  takeDue(now: number): Scheduled[] {
    const out: Scheduled[] = [];
    for (let e = this.#heap.peek(); e && e.time <= now; e = this.#heap.peek()) {
      this.#heap.pop();
      out.push({ spec: e.spec, time: e.time });
    }
    this.#released += out.length;
    return out;
  }

  /** Records that a request finished (or failed) at `now`, releasing what depended on it. */
  complete(id: string, now: number): void {
    if (this.#completedAt.has(id)) return;
    this.#completedAt.set(id, now);
    for (const d of this.#dependents.get(id) ?? []) this.#push(d, now + (d.after?.delay ?? 0));
    this.#dependents.delete(id);
    const stage = this.#w.requests[this.#seq.get(id) ?? -1]?.stage;
    if (stage === undefined) return;
    this.#remaining[stage]--;
    if (this.#remaining[stage] === 0 && this.#w.stageBarrier)
      this.#openStage(stage + 1, now + this.#w.stageBarrier.interval);
  }

  /** Start time of stage i (nominal, or when its barrier opened); undefined if not yet open. */
  stageStart(i: number): number | undefined {
    return this.#stageStart[i];
  }

  /** Requests released so far. */
  get released(): number {
    return this.#released;
  }

  /** True when every request has been released. */
  get done(): boolean {
    return this.#released >= this.#w.requests.length;
  }
}
