/**
 * The shapes every workload generator produces: request specs with text (the gateway and replicas
 * tokenize text), nominal arrival times in workload seconds, and optional dependencies for
 * closed-loop users and multi-turn sessions, whose start times only the driver (or the fleet
 * simulator) can know. Pure types, no I/O.
 */
import type { ChatMessage } from "../../engine/tokenizer.ts";

export type RequestKind = "chat" | "completion";

/**
 * Start after another request finishes: at its completion (success or failure) + `delay` seconds.
 * Used by closed-loop users (next request when the previous one ends) and multi-turn sessions.
 */
export interface AfterDependency {
  id: string;
  delay: number;
}

export interface RequestSpec {
  id: string;
  /**
   * Nominal start, seconds from the run start. Exact for open-loop requests; for requests with
   * `after` it is only an estimate (the scheduler uses the dependency instead).
   */
  arrivalTime: number;
  after?: AfterDependency;
  kind: RequestKind;
  /** Completion prompt (kind "completion"). */
  prompt?: string;
  /** Chat thread (kind "chat"). */
  messages?: ChatMessage[];
  /** Prompt length the generator aimed at, in simulator-tokenizer tokens (text only, no template). */
  promptTokensApprox: number;
  maxTokens: number;
  /** Requests of one group share their prefix text. */
  groupId?: number;
  /** Tokens of the prefix this request shares with its group (written to traces as prefix_length). */
  prefixTokens?: number;
  sessionId?: string;
  /** 1-based turn within a session, or the request's index within a closed-loop user. */
  turn?: number;
  /** Index into Workload.stages. */
  stage?: number;
  /**
   * Sent but not measured: a closed-loop user's first requests (arrival `warmup`), whose prefixes
   * no router can have cached. Requests of a warm-up stage are warm-up too (isWarmup).
   */
  warmup?: boolean;
  /** The region the request enters at (the fleet simulator's locality section). */
  origin?: string;
  /** Who sends it and what it is promised (a `mix` workload's stream; mix.ts): sent as headers. */
  tags?: RequestTags;
}

/** A request's tenant, objective and SLOs: sent as llm-d's headers, reported per tenant and priority. */
export interface RequestTags {
  /** The mix stream it came from. */
  stream: string;
  /** Fairness id (x-gateway-inference-fairness-id). */
  tenant?: string;
  /** InferenceObjective name (x-gateway-inference-objective). */
  objective?: string;
  /** TTFT / TPOT objectives in ms (x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms). */
  sloTtftMs?: number;
  sloTpotMs?: number;
}

/** One load stage (a step of a QPS sweep). Times in workload seconds. */
export interface StageInfo {
  index: number;
  rate: number;
  duration: number;
  /** Nominal start: sum of the previous stages' durations (plus intervals when barriered). */
  start: number;
  /** Number of requests generated for the stage: floor(rate × duration) as inference-perf does. */
  count: number;
  /** Warm-up stages are reported on their own and left out of the run's aggregates. */
  warmup: boolean;
}

export interface Workload {
  /** Workload name as given in the spec (e.g. "shared-prefix"). */
  name: string;
  seed: number;
  requests: RequestSpec[];
  stages: StageInfo[];
  /**
   * inference-perf semantics: a stage starts only after every request of the previous stage has
   * finished, plus `interval` seconds. Absent: stages follow each other on the nominal timeline.
   */
  stageBarrier?: { interval: number };
  /** Human-readable notes (interpretation of a preset, fleet it was designed for). */
  notes?: string[];
}

/** Whether `spec` is warm-up: marked itself, or in a warm-up stage. Its record is not measured. */
export function isWarmup(spec: RequestSpec, workload: Pick<Workload, "stages">): boolean {
  return spec.warmup === true || (spec.stage !== undefined && workload.stages[spec.stage]?.warmup === true);
}
