/**
 * The I/O half of leader election (`--ha-enable-leader-election`): one attempt per retry period
 * reads the Lease, asks lease.ts what to do, and creates or replaces it with the read's
 * resourceVersion (a 409 means another replica wrote first: this attempt failed). isLeader() and a
 * `change` event tell the ext_proc server whether to report SERVING. stop() releases the lease
 * (holderIdentity cleared, 1 s duration) so a standby takes over at once, as controller-runtime's
 * LeaderElectionReleaseOnCancel does for llm-d-router.
 */
import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { hostname } from "node:os";
import { CoordinationV1Api, type KubeConfig, V1MicroTime } from "@kubernetes/client-node";
import { describeKubeError, statusOf } from "./errors.ts";
import {
  checkTimings,
  DEFAULT_LEASE_TIMINGS,
  type LeaseRecord,
  type LeaseTimings,
  nextStep,
  type Observation,
  observe,
  releaseRecord,
  stillLeader,
} from "./lease.ts";

export interface LeaderElectorOptions {
  kubeConfig: KubeConfig;
  namespace: string;
  /** The Lease's name (lease.ts leaseName() gives llm-d-router's). */
  name: string;
  /** Default: the pod's hostname (its name) plus a random suffix, as controller-runtime makes it. */
  identity?: string;
  timings?: Partial<LeaseTimings>;
  /** Wall clock in ms (Lease times are wall times). Default Date.now. */
  now?: () => number;
  log?: (line: string) => void;
}

export interface LeaderElectorEvents {
  change: [boolean];
}

interface ReadLease {
  record: LeaseRecord;
  resourceVersion: string;
}

function timeMs(v: unknown): number | null {
  if (v instanceof Date) return v.getTime();
  if (typeof v === "string") {
    const t = Date.parse(v);
    return Number.isFinite(t) ? t : null;
  }
  return null;
}

export class LeaderElector extends EventEmitter<LeaderElectorEvents> {
  readonly identity: string;
  readonly timings: LeaseTimings;
  readonly #api: CoordinationV1Api;
  readonly #ns: string;
  readonly #name: string;
  readonly #now: () => number;
  readonly #log: (line: string) => void;
  #obs: Observation | null = null;
  #leader = false;
  #lastRenewMs = 0;
  #timer: NodeJS.Timeout | null = null;
  #running: Promise<void> | null = null;
  #stopped = false;

  constructor(o: LeaderElectorOptions) {
    super();
    this.identity = o.identity ?? `${hostname()}_${randomUUID()}`;
    this.timings = { ...DEFAULT_LEASE_TIMINGS, ...o.timings };
    checkTimings(this.timings);
    this.#api = o.kubeConfig.makeApiClient(CoordinationV1Api);
    this.#ns = o.namespace;
    this.#name = o.name;
    this.#now = o.now ?? Date.now;
    this.#log = o.log ?? ((l) => console.error(l));
  }

  isLeader(): boolean {
    return this.#leader;
  }

  /** Starts trying every retry period. */
  start(): void {
    if (this.#timer || this.#stopped) return;
    const loop = () => {
      this.#running = this.tick().finally(() => {
        this.#running = null;
        if (!this.#stopped) this.#timer = setTimeout(loop, this.timings.retryPeriodMs);
      });
    };
    this.#timer = setTimeout(loop, 0);
  }

  /** One acquire-or-renew attempt (the timer calls this; tests call it directly). */
  async tick(): Promise<void> {
    if (this.#stopped) return;
    let read: ReadLease | null;
    try {
      read = await this.#read();
    } catch (err) {
      this.#failed(
        `cannot read Lease ${this.#ns}/${this.#name}: ${describeKubeError(err, "get, create and update on leases (coordination.k8s.io)")}`,
      );
      return;
    }
    const now = this.#now();
    this.#obs = observe(this.#obs, read?.record ?? null, now);
    const step = nextStep(this.#obs, this.identity, now, this.timings);
    if (step.kind === "wait") {
      if (this.#leader) this.#log(`kvgate: leader election: ${step.holder} holds the lease now; standing by`);
      this.#set(false);
      return;
    }
    try {
      if (step.kind === "create") await this.#create(step.record);
      else await this.#replace(step.record, read?.resourceVersion ?? "");
    } catch (err) {
      const conflict = statusOf(err) === 409;
      this.#failed(
        conflict
          ? `Lease ${this.#ns}/${this.#name} changed under us (409); retrying`
          : `cannot write Lease ${this.#ns}/${this.#name}: ${describeKubeError(err, "get, create and update on leases (coordination.k8s.io)")}`,
      );
      return;
    }
    if (!this.#leader) this.#log(`kvgate: leader election: ${this.identity} is now the leader`);
    this.#lastRenewMs = now;
    this.#set(true);
  }

  /** Stops trying and releases the lease if held. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#running;
    if (!this.#leader) return;
    this.#set(false);
    try {
      const read = await this.#read();
      const rel = releaseRecord(read?.record ?? null, this.identity, this.#now());
      if (read && rel) await this.#replace(rel, read.resourceVersion);
    } catch (err) {
      this.#log(
        `kvgate: leader election: could not release the lease (it expires by itself): ${describeKubeError(err, "get, create and update on leases (coordination.k8s.io)")}`,
      );
    }
  }

  #failed(why: string): void {
    if (this.#leader && !stillLeader(this.#lastRenewMs, this.#now(), this.timings)) {
      this.#log(
        `kvgate: leader election: lost the lease, no renewal for ${this.timings.renewDeadlineMs} ms (${why})`,
      );
      this.#set(false);
    } else if (!this.#leader) {
      this.#log(`kvgate: leader election: ${why}`);
    }
  }

  #set(leader: boolean): void {
    if (leader === this.#leader) return;
    this.#leader = leader;
    this.emit("change", leader);
  }

  async #read(): Promise<ReadLease | null> {
    let lease: Awaited<ReturnType<CoordinationV1Api["readNamespacedLease"]>>;
    try {
      lease = await this.#api.readNamespacedLease({ name: this.#name, namespace: this.#ns });
    } catch (err) {
      if (statusOf(err) === 404) return null;
      throw err;
    }
    const s = lease.spec ?? {};
    return {
      resourceVersion: lease.metadata?.resourceVersion ?? "",
      record: {
        holderIdentity: s.holderIdentity ?? "",
        leaseDurationSeconds: s.leaseDurationSeconds ?? 0,
        acquireTimeMs: timeMs(s.acquireTime),
        renewTimeMs: timeMs(s.renewTime),
        leaseTransitions: s.leaseTransitions ?? 0,
      },
    };
  }

  #body(r: LeaseRecord, resourceVersion?: string) {
    return {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { name: this.#name, namespace: this.#ns, ...(resourceVersion ? { resourceVersion } : {}) },
      spec: {
        holderIdentity: r.holderIdentity,
        leaseDurationSeconds: r.leaseDurationSeconds,
        // MicroTime: the API server wants six fractional digits, which V1MicroTime writes.
        ...(r.acquireTimeMs !== null ? { acquireTime: new V1MicroTime(r.acquireTimeMs) } : {}),
        ...(r.renewTimeMs !== null ? { renewTime: new V1MicroTime(r.renewTimeMs) } : {}),
        leaseTransitions: r.leaseTransitions,
      },
    };
  }

  async #create(r: LeaseRecord): Promise<void> {
    await this.#api.createNamespacedLease({ namespace: this.#ns, body: this.#body(r) });
  }

  async #replace(r: LeaseRecord, resourceVersion: string): Promise<void> {
    await this.#api.replaceNamespacedLease({
      name: this.#name,
      namespace: this.#ns,
      body: this.#body(r, resourceVersion),
    });
  }
}
