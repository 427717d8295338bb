/**
 * session-affinity-scorer and session-affinity-filter (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/filter/sessionaffinity/`).
 * Strategy encoded_endpoint_header (default): the gateway decodes x-session-token (base64 of an
 * endpoint id, which it writes back on every response) into RequestFacts.sessionToken; the scorer
 * gives that endpoint 1 and others 0, the filter keeps only it when present (else all).
 * Strategy session_id (alias session_id_header): server-side binding sessionId → endpoint made
 * after each pick, dropped after evictionTtlSeconds unused (swept every evictionSweepSeconds,
 * lazily, on the `now` passed in). An unbound session, or one whose endpoint is not a candidate,
 * scores 1 on the candidate with the fewest bound sessions (ties rotate in id order).
 */
import { z } from "zod";
import { spec } from "../plugin-spec.ts";
import { ScoreBuffer } from "../scores.ts";
import type {
  CycleState,
  EndpointState,
  Filter,
  PluginStats,
  PreRequestHook,
  ScheduleResult,
  Scorer,
  TypedName,
} from "../types.ts";

const ttl = z.number().nonnegative();
const sweep = z.number().positive();

export const sessionParams = z.strictObject({
  strategy: z
    .enum(["encoded_endpoint_header", "session_id", "session_id_header"])
    .default("encoded_endpoint_header"),
  /** Header the gateway reads (and, for encoded_endpoint_header, writes); informational here. */
  headerName: z.string().min(1).optional(),
  /** Profile whose target a binding records (e.g. prefill); default the primary profile. */
  profileName: z.string().min(1).optional(),
  evictionTtlSeconds: ttl.default(300),
  evictionSweepSeconds: sweep.default(10),
  sessionIdConfig: z
    .strictObject({
      sources: z
        .array(z.strictObject({ header: z.string().optional(), attribute: z.string().optional() }))
        .optional(),
      evictionTtlSeconds: ttl.optional(),
      evictionSweepSeconds: sweep.optional(),
    })
    .optional(),
});
export type SessionParams = z.output<typeof sessionParams>;

interface Binding {
  endpointId: string;
  lastSeen: number;
}

export class SessionAffinity implements PreRequestHook {
  readonly typedName: TypedName;
  readonly #bindings = new Map<string, Binding>();
  readonly #perEndpoint = new Map<string, number>();
  readonly #byId: boolean;
  readonly #ttl: number;
  readonly #sweepEvery: number;
  #lastSweep = Number.NEGATIVE_INFINITY;
  #cursor = 0;
  /** Told of every session_id binding this plugin makes (gateway replicas share them: sync.ts). */
  onBind: ((sessionId: string, endpointId: string, now: number) => void) | null = null;

  constructor(
    type: string,
    name: string,
    readonly params: SessionParams,
  ) {
    this.typedName = { type, name };
    this.#byId = params.strategy !== "encoded_endpoint_header";
    this.#ttl = params.sessionIdConfig?.evictionTtlSeconds ?? params.evictionTtlSeconds;
    this.#sweepEvery = params.sessionIdConfig?.evictionSweepSeconds ?? params.evictionSweepSeconds;
  }

  /** Index of the endpoint this request is pinned to among `endpoints`, or -1. */
  protected boundIndex(cycle: CycleState, endpoints: readonly EndpointState[]): number {
    const req = cycle.request;
    let target: string | undefined;
    if (!this.#byId) target = req.sessionToken;
    else if (req.sessionId) {
      this.#sweep(cycle.now);
      target = this.#bindings.get(req.sessionId)?.endpointId;
    }
    if (target === undefined || target === "") return -1;
    for (let i = 0; i < endpoints.length; i++) if (endpoints[i].id === target) return i;
    return -1;
  }

  /** session_id only: the candidate with the fewest bound sessions, ties rotating in id order. */
  protected leastBoundIndex(endpoints: readonly EndpointState[]): number {
    const order = endpoints.map((_, i) => i).sort((a, b) => (endpoints[a].id < endpoints[b].id ? -1 : 1));
    let min = Number.POSITIVE_INFINITY;
    const ties: number[] = [];
    for (const i of order) {
      const c = this.#perEndpoint.get(endpoints[i].id) ?? 0;
      if (c < min) {
        min = c;
        ties.length = 0;
      }
      if (c === min) ties.push(i);
    }
    return ties[this.#cursor++ % ties.length];
  }

  protected get bySessionId(): boolean {
    return this.#byId;
  }

  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void {
    const sid = cycle.request.sessionId;
    if (!this.#byId || !sid) return;
    const profile = this.params.profileName ?? result.primaryProfile;
    const target = result.profiles[profile]?.target;
    if (!target) return;
    this.bind(sid, target.id, now);
    this.onBind?.(sid, target.id, now);
  }

  /** Binds a session to an endpoint (after a pick, or a peer gateway's binding); session_id only. */
  bind(sid: string, endpointId: string, now: number): void {
    if (!this.#byId) return;
    const prev = this.#bindings.get(sid);
    this.#bindings.set(sid, { endpointId, lastSeen: now });
    if (prev?.endpointId === endpointId) return;
    if (prev) this.#count(prev.endpointId, -1);
    this.#count(endpointId, 1);
  }

  retainEndpoints(pool: ReadonlySet<string>): void {
    for (const [sid, b] of this.#bindings) {
      if (pool.has(b.endpointId)) continue;
      this.#bindings.delete(sid);
      this.#count(b.endpointId, -1);
    }
  }

  stats(): PluginStats {
    return { sessions: this.#bindings.size };
  }

  #sweep(now: number): void {
    if (now - this.#lastSweep < this.#sweepEvery) return;
    this.#lastSweep = now;
    if (this.#ttl <= 0) return;
    for (const [sid, b] of this.#bindings) {
      if (now - b.lastSeen <= this.#ttl) continue;
      this.#bindings.delete(sid);
      this.#count(b.endpointId, -1);
    }
  }

  #count(id: string, d: number): void {
    const v = (this.#perEndpoint.get(id) ?? 0) + d;
    if (v > 0) this.#perEndpoint.set(id, v);
    else this.#perEndpoint.delete(id);
  }
}

export class SessionAffinityScorer extends SessionAffinity implements Scorer {
  readonly category = "affinity" as const;

  constructor(name: string, params: SessionParams) {
    super("session-affinity-scorer", name, params);
  }

  readonly #out = new ScoreBuffer();

  score(cycle: CycleState, endpoints: readonly EndpointState[]): Float64Array {
    const out = this.#out.get(endpoints.length);
    if (endpoints.length === 0) return out;
    let i = this.boundIndex(cycle, endpoints);
    if (i < 0 && this.bySessionId) i = this.leastBoundIndex(endpoints);
    if (i >= 0) out[i] = 1;
    return out;
  }
}

export class SessionAffinityFilter extends SessionAffinity implements Filter {
  constructor(name: string, params: SessionParams) {
    super("session-affinity-filter", name, params);
  }

  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[] {
    const i = this.boundIndex(cycle, endpoints);
    return i < 0 ? endpoints : [endpoints[i]];
  }
}

export const sessionScorerSpec = spec({
  type: "session-affinity-scorer",
  stability: "stable",
  kind: "scorer",
  summary: "Scores 1 for the endpoint the request's session is pinned to.",
  params: sessionParams,
  factory: (name, p) => new SessionAffinityScorer(name, p),
});

export const sessionFilterSpec = spec({
  type: "session-affinity-filter",
  stability: "stable",
  kind: "filter",
  summary: "Keeps only the endpoint the request's session is pinned to, when it is a candidate.",
  params: sessionParams,
  factory: (name, p) => new SessionAffinityFilter(name, p),
});
