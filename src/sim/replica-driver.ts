/**
 * Runs one Engine in scaled real time for the simulated replica: simNow = wall elapsed × timeScale.
 *
 * Steps run back to back in simulated time (the next step starts at the previous endTime, or at the
 * arrival time when the engine was idle). A step's outputs are due at its endTime and are handed to
 * the request sinks when the scaled wall clock reaches it, never earlier, with one timer per step at
 * most. When the process falls behind, simulated time is not stretched: the engine's timeline stays as
 * computed, and how late each delivery was (in simulated seconds) is recorded as lag.
 */
import type { Engine } from "../engine/engine.ts";
import type {
  EngineRequest,
  FinishReason,
  RemoteKvNeed,
  RequestRecord,
  StepResult,
} from "../engine/types.ts";

/** One delivery to a request: the tokens one step produced for it. */
export interface DriverOutput {
  newTokenIds: number[];
  finishReason: FinishReason | null;
  /** Set when the request finished. */
  record?: RequestRecord;
  /** Simulated time the output was due (the step's endTime). */
  time: number;
}

/** Where a request's outputs go (the HTTP layer). Called from timers; exceptions are contained. */
export interface RequestSink {
  onOutput(out: DriverOutput): void;
  /** The engine refused the request after a delayed admission (e.g. EngineInputError). */
  onError(err: Error): void;
}

export interface RequestHandle {
  readonly id: string;
  /** Aborts the request if it is still running (client went away); frees its blocks. Idempotent. */
  cancel(): void;
}

export interface LagStats {
  /** Lag of the latest delivery, simulated seconds; 0 while idle. */
  current: number;
  max: number;
}

export interface DriverOptions {
  /** Simulated seconds per wall second (> 0). */
  timeScale: number;
  /** Monotonic wall clock in milliseconds (default performance.now). */
  wallMs?: () => number;
  /** Called at each step's delivery, with its lag in simulated seconds. */
  onStep?: (step: StepResult, lag: number) => void;
  /** Called when a request finishes or is aborted; `receivedAt` is when the server got it (sim s). */
  onFinish?: (record: RequestRecord, receivedAt: number) => void;
  /** P/D consumer: a step parked requests to wait for remote KV, at engine time `time` (its start). */
  onRemoteKvNeeded?: (needs: RemoteKvNeed[], time: number) => void;
  /** Diagnostics (e.g. a stalled engine). */
  log?: (line: string) => void;
}

interface Entry {
  sink: RequestSink;
  receivedAt: number;
  /** Pending admission timer when the request is held back (fault extra latency). */
  delay: NodeJS.Timeout | null;
  inEngine: boolean;
}

/** Steps delivered per timer turn before yielding to I/O. */
const MAX_STEPS_PER_TURN = 256;

export class ReplicaDriver {
  readonly engine: Engine;
  readonly timeScale: number;
  readonly lag: LagStats = { current: 0, max: 0 };
  private readonly wallMs: () => number;
  private readonly wallStart: number;
  private readonly opts: DriverOptions;
  private readonly entries = new Map<string, Entry>();
  /** Computed step whose outputs are not delivered yet. */
  private pending: StepResult | null = null;
  private timer: NodeJS.Timeout | null = null;
  private immediate: NodeJS.Immediate | null = null;
  /** End of the last delivered step: the engine's clock never goes back before it. */
  private lastEnd = 0;
  /** Latest arrival while idle: the first step starts there. */
  private wakeAt = 0;
  private stalled = false;
  /** Timers waiting for CPU-tier copies to end. */
  private readonly waits = new Set<NodeJS.Timeout>();
  private closed = false;

  constructor(engine: Engine, opts: DriverOptions) {
    if (!(opts.timeScale > 0) || !Number.isFinite(opts.timeScale)) throw new Error("timeScale must be > 0");
    this.engine = engine;
    this.timeScale = opts.timeScale;
    this.opts = opts;
    this.wallMs = opts.wallMs ?? (() => performance.now());
    this.wallStart = this.wallMs();
  }

  /** Simulated seconds since the driver started. */
  simNow(): number {
    return ((this.wallMs() - this.wallStart) / 1000) * this.timeScale;
  }

  /** Requests the driver is streaming (held back, waiting or running). */
  get inFlight(): number {
    return this.entries.size;
  }

  /** True while a step is computed and waiting for its due time. */
  get busy(): boolean {
    return this.pending !== null;
  }

  /**
   * The engine's "now" for an event happening now: while a step is pending, the engine is already at
   * that step's end, and anything arriving late (behind real-scaled time) joins at that boundary.
   */
  private engineNow(): number {
    const now = this.simNow();
    if (this.pending) return Math.min(now, this.pending.endTime);
    return Math.max(now, this.lastEnd);
  }

  /**
   * Hands a request to the engine (after `delay` simulated seconds when given). Throws the engine's
   * EngineInputError synchronously when admitted at once; after a delay, errors go to `sink.onError`.
   */
  submit(req: EngineRequest, sink: RequestSink, opts: { delay?: number } = {}): RequestHandle {
    if (this.closed) throw new Error("replica is shutting down");
    if (this.entries.has(req.id)) throw new Error(`duplicate request id ${req.id}`);
    const entry: Entry = { sink, receivedAt: this.simNow(), delay: null, inEngine: false };
    const delay = opts.delay ?? 0;
    if (delay > 0) {
      this.entries.set(req.id, entry);
      const due = entry.receivedAt + delay;
      const wait = () => {
        const ms = Math.ceil(((due - this.simNow()) / this.timeScale) * 1000);
        if (ms > 0) {
          entry.delay = setTimeout(wait, ms);
          return;
        }
        entry.delay = null;
        try {
          this.admit(req, entry);
        } catch (err) {
          this.entries.delete(req.id);
          safe(() => sink.onError(err as Error), this.opts.log);
        }
      };
      wait();
    } else {
      this.admit(req, entry);
      this.entries.set(req.id, entry);
    }
    return { id: req.id, cancel: () => this.cancel(req.id) };
  }

  private admit(req: EngineRequest, entry: Entry): void {
    const now = this.engineNow();
    this.engine.addRequest(req, now);
    entry.inEngine = true;
    this.stalled = false;
    if (!this.pending && !this.timer) {
      this.wakeAt = Math.max(this.wakeAt, now);
      this.schedulePump();
    }
  }

  /** Aborts a request: frees its blocks in the engine and drops its undelivered outputs. */
  cancel(id: string): void {
    const entry = this.entries.get(id);
    if (!entry) return;
    this.entries.delete(id);
    if (entry.delay) clearTimeout(entry.delay);
    if (!entry.inEngine) return;
    const record = this.engine.abort(id, this.engineNow());
    if (record) safe(() => this.opts.onFinish?.(record, entry.receivedAt), this.opts.log);
    // An abort can unblock a stalled engine (blocks freed).
    if (this.stalled && this.engine.hasUnfinishedRequests()) {
      this.stalled = false;
      this.wakeAt = Math.max(this.wakeAt, this.engineNow());
      this.schedulePump();
    }
  }

  /**
   * Runs `fn` on the engine at the engine's current time — an event from outside a step (a KV
   * transfer ended, held blocks were freed, a lease ran out) — then resumes stepping in case that
   * gave the engine work or blocks.
   */
  act<T>(fn: (engine: Engine, now: number) => T): T {
    const v = fn(this.engine, this.engineNow());
    if (!this.closed && !this.pending && !this.timer && this.engine.hasUnfinishedRequests()) {
      this.stalled = false;
      this.wakeAt = Math.max(this.wakeAt, this.engineNow());
      this.schedulePump();
    }
    return v;
  }

  /** Delivers the final record of a request the engine ended outside a step (a failed KV load). */
  finishOutside(record: RequestRecord): void {
    const entry = this.entries.get(record.id);
    if (!entry) return;
    this.entries.delete(record.id);
    safe(() => this.opts.onFinish?.(record, entry.receivedAt), this.opts.log);
    const out: DriverOutput = {
      newTokenIds: [],
      finishReason: record.finishReason,
      record,
      time: record.finishTime ?? this.engineNow(),
    };
    safe(() => entry.sink.onOutput(out), this.opts.log);
  }

  private schedulePump(): void {
    if (this.immediate || this.closed) return;
    this.immediate = setImmediate(this.pump);
  }

  private arm(dueSim: number): void {
    const dueWall = this.wallStart + (dueSim / this.timeScale) * 1000;
    const ms = Math.max(0, Math.ceil(dueWall - this.wallMs()));
    this.timer = setTimeout(this.pump, ms);
  }

  /** Delivers every due step, computes the next ones, and arms a timer for the first not yet due. */
  private readonly pump = (): void => {
    this.timer = null;
    this.immediate = null;
    if (this.closed) return;
    for (let n = 0; n < MAX_STEPS_PER_TURN; n++) {
      if (this.pending) {
        const now = this.simNow();
        if (this.pending.endTime > now) {
          this.arm(this.pending.endTime);
          return;
        }
        const step = this.pending;
        this.pending = null;
        this.lastEnd = step.endTime;
        this.deliver(step, now - step.endTime);
      }
      if (!this.engine.hasUnfinishedRequests()) {
        this.lag.current = 0;
        return;
      }
      const start = Math.max(this.lastEnd, this.wakeAt);
      this.wakeAt = 0;
      const step = this.engine.step(start);
      const needs = step.remoteKvNeeded;
      if (needs) safe(() => this.opts.onRemoteKvNeeded?.(needs, step.startTime), this.opts.log);
      for (const l of step.offloadLoads ?? [])
        this.at(l.readyAt, (e, t) => e.completeRemoteKv(l.requestId, t, true));
      if (step.numScheduledRequests === 0 && step.outputs.length === 0 && !(step.endTime > step.startTime)) {
        // Nothing can run (no free blocks and nothing to preempt, or only requests waiting for
        // remote KV): wait for an arrival, an abort or a KV transfer.
        this.stalled = true;
        this.lastEnd = Math.max(this.lastEnd, step.endTime);
        if (step.kvEvents) safe(() => this.opts.onStep?.(step, 0), this.opts.log);
        // Blocks of finished requests wait for their CPU-tier stores: step again when they are freed.
        const free = this.engine.nextOffloadFree();
        if (free !== null) this.at(free, () => undefined);
        if (this.engine.stats().numRequestsWaiting > this.engine.waitingForRemoteKv().length)
          this.opts.log?.(`sim-replica: engine made no progress at t=${start.toFixed(3)}s; waiting`);
        return;
      }
      this.pending = step;
    }
    this.schedulePump();
  };

  private deliver(step: StepResult, lag: number): void {
    this.lag.current = lag;
    if (lag > this.lag.max) this.lag.max = lag;
    safe(() => this.opts.onStep?.(step, lag), this.opts.log);
    for (const out of step.outputs) {
      const entry = this.entries.get(out.requestId);
      if (!entry) continue;
      if (out.record) {
        this.entries.delete(out.requestId);
        const record = out.record;
        safe(() => this.opts.onFinish?.(record, entry.receivedAt), this.opts.log);
      }
      const o: DriverOutput = {
        newTokenIds: out.newTokenIds,
        finishReason: out.finishReason,
        time: step.endTime,
      };
      if (out.record) o.record = out.record;
      safe(() => entry.sink.onOutput(o), this.opts.log);
    }
  }

  /**
   * At simulated time `due` (a CPU-tier copy's end), runs `fn` on the engine at that time and steps
   * on from there, never earlier: the transfer's time is the engine's, not the wall clock's.
   */
  private at(due: number, fn: (engine: Engine, now: number) => unknown): void {
    const fire = () => {
      const ms = Math.ceil(((due - this.simNow()) / this.timeScale) * 1000);
      if (ms > 0 && !this.closed) {
        this.waits.delete(t);
        t = setTimeout(fire, ms);
        this.waits.add(t);
        return;
      }
      this.waits.delete(t);
      if (this.closed) return;
      this.wakeAt = Math.max(this.wakeAt, due);
      this.act((e, now) => fn(e, Math.max(now, due)));
    };
    let t = setTimeout(fire, Math.max(0, Math.ceil(((due - this.simNow()) / this.timeScale) * 1000)));
    this.waits.add(t);
  }

  /** Stops timers and aborts everything in flight; sinks get no further calls. */
  close(): void {
    if (this.closed) return;
    for (const w of this.waits) clearTimeout(w);
    this.waits.clear();
    for (const id of [...this.entries.keys()]) this.cancel(id);
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    if (this.immediate) clearImmediate(this.immediate);
    this.timer = null;
    this.immediate = null;
    this.pending = null;
  }
}

function safe(fn: () => void, log?: (line: string) => void): void {
  try {
    fn();
  } catch (err) {
    log?.(`sim-replica: callback failed: ${(err as Error).stack ?? err}`);
  }
}
