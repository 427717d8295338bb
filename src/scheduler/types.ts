/**
 * Scheduler contracts: the endpoint and request facts the scheduler works on, the plugin
 * extension points (mirroring llm-d's EPP framework interfaces, llm-d/llm-d-router@ebab6879
 * pkg/epp/framework/interface/), and the
 * shape of a scheduling result. Pure data and interfaces only; implementations live in plugins/.
 */
import type { Rng } from "./rng.ts";

/** Model-server metrics as scraped by the data layer (vLLM names, vllm/v1/metrics/loggers.py). */
export interface EndpointMetrics {
  waitingQueueSize: number;
  runningRequestsSize: number;
  /** 0..1 (vllm:kv_cache_usage_perc). */
  kvCacheUsagePercent: number;
  /** Tokens per KV block (vllm:cache_config_info{block_size}). */
  cacheBlockSize?: number;
  /** GPU KV blocks (vllm:cache_config_info{num_gpu_blocks}). */
  cacheNumBlocks?: number;
  /**
   * CPU-tier KV blocks of GPU block size (vllm:cache_config_info{num_cpu_blocks} when numeric). vLLM's
   * OffloadingConnector leaves that label "None" (its size is cpu_bytes_to_use, in bytes), so with it
   * this stays unset.
   */
  cacheNumCpuBlocks?: number;
  /**
   * LoRA adapters with running requests (vllm:lora_requests_info{running_lora_adapters}, latest
   * series; llm-d Metrics.ActiveModels). Absent when the server reports no LoRA state.
   */
  activeModels?: readonly string[];
  /** LoRA adapters with waiting requests (waiting_lora_adapters; llm-d WaitingModels). */
  waitingModels?: readonly string[];
  /** Adapters one batch may use (max_lora, vLLM --max-loras; llm-d MaxActiveModels). */
  maxActiveModels?: number;
  /**
   * Simulated seconds per wall second of a kvgate simulated replica (kvgate:sim_time_scale); absent
   * for real servers. Durations measured against it are multiplied by it to be in the replica's time.
   */
  simTimeScale?: number;
  /** When these values were scraped: seconds, same clock as `now`. */
  updateTime: number;
}

export interface EndpointState {
  /** "host:port"; the identity used everywhere (indexes, session tokens, headers). */
  id: string;
  address: string;
  labels: Record<string, string>;
  /** null until the first successful scrape. */
  metrics: EndpointMetrics | null;
}

/** A chat content part; only `text` parts carry text, others are hashed as placeholders. */
export interface ChatContentPart {
  type: string;
  text?: string;
  [k: string]: unknown;
}

export interface ChatMessage {
  role: string;
  content?: string | ChatContentPart[] | null;
}

export type PromptInput =
  | { kind: "completion"; prompt: string | string[] | number[] | number[][] }
  | { kind: "chat"; messages: ChatMessage[]; tools?: unknown };

/** What the gateway knows about a request when it asks for an endpoint. */
export interface RequestFacts {
  requestId: string;
  /** Target model (after any rewrite). */
  model: string;
  prompt: PromptInput;
  /** vLLM cache_salt; mixed into the first prefix block hash. */
  cacheSalt?: string;
  maxTokens?: number;
  stream: boolean;
  /** From the objective mapping (x-llm-d-inference-objective); < 0 is sheddable. */
  priority: number;
  /** Decoded x-session-token (encoded_endpoint_header strategy): an endpoint id. */
  sessionToken?: string;
  /** x-session-id (session_id strategy). */
  sessionId?: string;
  /** Real token ids when a tokenizer is configured; replaces the 4-byte pseudo-tokens. */
  tokenIds?: number[];
  /** x-llm-d-slo-ttft-ms (alias x-slo-ttft-ms): the request's TTFT SLO, ms, when a positive number. */
  sloTtftMs?: number;
  /** x-llm-d-slo-tpot-ms (alias x-slo-tpot-ms): the request's TPOT SLO, ms, when a positive number. */
  sloTpotMs?: number;
  /** SLO header values that were ignored, and why (shown by /explain). */
  sloHeaderNotes?: string[];
  /**
   * Where the request entered (locality label → value), for locality-filter; set only by trusted
   * callers (the fleet simulator's regional gateways), never from headers. Default: the filter's origin.
   */
  locality?: Record<string, string>;
}

const NO_PROMPT: PromptInput = { kind: "completion", prompt: "" };

/**
 * The facts without the prompt and its token ids: what the gateway keeps of a request while its
 * response streams, and passes to the response hooks.
 */
export function withoutPrompt(facts: RequestFacts): RequestFacts {
  return { ...facts, prompt: NO_PROMPT, tokenIds: undefined };
}

/** A typed key into the per-request CycleState. */
export interface DataKey<T> {
  readonly name: string;
  /** Phantom field carrying the value type; never set. */
  readonly _type?: T;
}

export function dataKey<T>(name: string): DataKey<T> {
  return { name };
}

/** Families of producer-written data. A consumer names the producer instance it reads. */
export type DataFamily = "prefix-match-info" | "inflight-load" | "latency-prediction-info";

export function familyKey<T>(family: DataFamily, producerName: string): DataKey<T> {
  return dataKey<T>(`${family}/${producerName}`);
}

/** Positions of endpoints in one list, by id (first occurrence); −1 when absent. */
export interface EndpointPositions {
  indexOf(endpointId: string): number;
  /** Changes whenever the positions do (the list was re-indexed). */
  readonly version: number;
}

/** Per-request scratch shared by producers and scheduling plugins (llm-d CycleState). */
export interface CycleState {
  readonly request: RequestFacts;
  readonly now: number;
  readonly rng: Rng;
  /** All candidates handed to schedule(), before any filter. */
  readonly candidates: readonly EndpointState[];
  /**
   * Positions by id in `endpoints` (the candidates or a list derived from them), for plugins that
   * look up a few known endpoints instead of scanning all; null when no index is kept for that
   * list (then scan). Indexes persist across requests while lists hold the same objects.
   */
  positions(endpoints: readonly EndpointState[]): EndpointPositions | null;
  get<T>(key: DataKey<T>): T | undefined;
  set<T>(key: DataKey<T>, value: T): void;
  /** Computes a value once per request and caches it under `key`. */
  memo<T>(key: DataKey<T>, compute: () => T): T;
  /** Results of profiles already run in this cycle (for profile handlers and deciders). */
  readonly profileResults: ReadonlyMap<string, ProfileResult>;
}

export interface TypedName {
  readonly type: string;
  readonly name: string;
}

export interface PluginStats {
  [metric: string]: number;
}

export interface Plugin {
  readonly typedName: TypedName;
  /** Data keys this plugin writes into the CycleState. */
  produces?(): DataKey<unknown>[];
  /** Data keys this plugin reads; a required key without a producer fails construction. */
  consumes?(): { required: DataKey<unknown>[]; optional?: DataKey<unknown>[] };
  /** Counters for metrics (e.g. prefix index size and hit ratio). */
  stats?(): PluginStats;
  /** Drop per-endpoint state for endpoints no longer in the pool. */
  retainEndpoints?(pool: ReadonlySet<string>): void;
  /** What the plugin knows of one endpoint, for the admin API's GET /endpoints. */
  endpointView?(endpointId: string): Record<string, unknown>;
  /** What the plugin did in this cycle (e.g. a fallback and why), for /explain; undefined = nothing. */
  explain?(cycle: CycleState): Record<string, unknown> | undefined;
  /**
   * Between requests: takes a measurement the plugin would otherwise take on a request (the
   * locality filter's saturation), so requests read it instead. The gateway calls it on a timer
   * every `refreshIntervalS`, the fleet simulator at the same period in virtual time.
   */
  refresh?(now: number): void;
  /** How often refresh() wants calling, seconds; absent or null: never. */
  readonly refreshIntervalS?: number | null;
}

export interface Filter extends Plugin {
  /**
   * Returns a subset of `endpoints` (same objects), possibly the same array object as an earlier
   * call's: nobody mutates a filter's result.
   */
  filter(cycle: CycleState, endpoints: readonly EndpointState[]): readonly EndpointState[];
}

export type ScorerCategory = "affinity" | "distribution" | "balance";

export interface Scorer extends Plugin {
  readonly category: ScorerCategory;
  /**
   * Scores index-aligned with `endpoints` (a map in llm-d; an array here avoids hashing on the
   * hot path). Values are meant to lie in [0,1]; the framework clamps and maps NaN to 0. The
   * array may be one the scorer reuses on its next call: callers read it before calling again.
   */
  score(cycle: CycleState, endpoints: readonly EndpointState[]): ArrayLike<number>;
}

export interface Picker extends Plugin {
  /** Indices into `endpoints`, best first, no duplicates; empty only if `endpoints` is empty. */
  pick(cycle: CycleState, endpoints: readonly EndpointState[], scores: Float64Array): number[];
}

/** Runs before scheduling, once per request, writing facts several plugins read. */
export interface DataProducer extends Plugin {
  produce(cycle: CycleState, candidates: readonly EndpointState[]): void;
}

/** After the pick: learn from the decision, count in-flight load. */
export interface PreRequestHook extends Plugin {
  preRequest(cycle: CycleState, result: ScheduleResult, now: number): void;
}

/**
 * Runs after the data producers and before any profile (llm-d's Admitter, requestcontrol.Admitter):
 * may refuse the request outright.
 */
export interface Admitter extends Plugin {
  /** null admits; otherwise why the request cannot be admitted. */
  admit(cycle: CycleState, candidates: readonly EndpointState[]): string | null;
}

/** What the gateway saw of a finished response, for plugins that learn from it. */
export interface ResponseInfo {
  /** Output tokens (usage.completion_tokens, or one per streamed event without a usage block). */
  outputTokens?: number;
}

/**
 * Response events. `req` is the picked request's facts; the gateway passes them without the prompt
 * (an empty completion prompt, no token ids), which it does not keep while a response streams.
 */
export interface ResponseHooks extends Plugin {
  /** First response chunk seen from `endpointId` (the endpoint that actually served). */
  onResponseStarted?(req: RequestFacts, endpointId: string, now: number): void;
  /** Response finished or aborted. Always called once per picked request. */
  onResponseComplete?(req: RequestFacts, endpointId: string, now: number, info?: ResponseInfo): void;
  /** Set when the plugin wants ResponseInfo.outputTokens (the gateway then scans responses for usage). */
  readonly wantsResponseUsage?: boolean;
}

/** The profiles a handler can run, by name. */
export interface ProfileView {
  readonly name: string;
}

export interface ProfileHandler extends Plugin {
  /** Names of profiles to run next, given those already run; empty ends the loop. */
  pickProfiles(cycle: CycleState, profiles: ReadonlyMap<string, ProfileView>): string[];
  /** Which profile's result is the primary (the request's destination). */
  primaryProfile(cycle: CycleState): string;
  /** What the handler decided beyond which profiles ran (P/D: the decision and why). */
  outcome?(cycle: CycleState): HandlerOutcome | undefined;
}

/** A profile handler's decision for one request, for the gateway, metrics and /explain. */
export interface HandlerOutcome {
  /**
   * llm-d's `disagg_decision_total` decision_type: "decode-only", "prefill-decode" or
   * "aggregated-fallback" (llm-d-router pkg/epp/framework/plugins/scheduling/profilehandler/disagg/metrics.go).
   */
  readonly decision: string;
  /** Why, in words. */
  readonly reason: string;
  /** The endpoint that runs the prefill leg, when the request is disaggregated. */
  readonly prefillTarget: EndpointState | null;
  /**
   * P/D: the decider wanted a remote prefill but no prefill endpoint could take it. The gateway's
   * prefill-failure policy decides: a local prefill on the decode target, or a 503.
   */
  readonly prefillUnavailable?: boolean;
}

/** A P/D decider: whether to run the prefill stage for this request. */
export interface Decider extends Plugin {
  decide(cycle: CycleState, decodeTarget: EndpointState): boolean;
}

export interface ProfileResult {
  /** Chosen endpoint, or null when filters emptied the set. */
  readonly target: EndpointState | null;
  /** Further endpoints for failover: other picks first, then the rest by score (ties by id). */
  readonly fallbacks: EndpointState[];
  /**
   * How many endpoints the picker chose (its maxNumOfEndpoints, or fewer): the target and the first
   * picked − 1 fallbacks. The ext_proc server lists exactly these, as llm-d's endpoint picker does.
   */
  readonly picked: number;
  /** Why there is no target. */
  readonly failure: string | null;
}

export type DropReason = "rejected-no-endpoints" | "rejected-saturated";

export interface ScheduleFailure {
  /**
   * 503 when there were no candidates; 429 when filters removed all (llm-d's scheduler_profile.go);
   * 500 when an admitter refused the request (llm-d's director answers an Admitter's denial with
   * errcommon.Internal, and no dropped-reason header).
   */
  status: 429 | 500 | 503;
  reason: DropReason | null;
  message: string;
}

export interface ScorerExplanation {
  name: string;
  type: string;
  raw: number;
  weight: number;
  weighted: number;
}

export interface CandidateExplanation {
  id: string;
  /** Sum of weighted scores; null when a filter removed the candidate. */
  total: number | null;
  scores: ScorerExplanation[];
  /** Name of the filter that removed it, or null. */
  removedBy: string | null;
}

export interface ProfileExplanation {
  candidates: CandidateExplanation[];
  filters: string[];
  picker: string;
  picked: string[];
  failure: string | null;
}

export interface Explanation {
  requestId: string;
  profilesRun: string[];
  primaryProfile: string;
  /** The profile handler's decision (P/D: decode-only or prefill-decode, and why). */
  decision?: { decision: string; reason: string; prefillTarget: string | null };
  /** The admitter that refused the request, and why. */
  denied?: { admitter: string; reason: string };
  /** Per plugin name, what it did in this cycle (fallbacks, predictions), when it says. */
  plugins?: Record<string, Record<string, unknown>>;
  profiles: Record<string, ProfileExplanation>;
}

export interface ScheduleResult {
  readonly requestId: string;
  readonly primaryProfile: string;
  readonly profiles: Readonly<Record<string, ProfileResult>>;
  /** The primary profile's target (convenience). */
  readonly target: EndpointState | null;
  readonly failure: ScheduleFailure | null;
  /** The profile handler's decision (P/D handlers), when it reports one. */
  readonly outcome?: HandlerOutcome;
  readonly explanation?: Explanation;
  /** The request's cycle state, handed back to hooks by onPicked. */
  readonly cycle: CycleState;
}

export interface ScheduleOptions {
  /**
   * Keep per-candidate scores in the result. An explaining call draws from a copy of the
   * scheduler's RNG, so it does not change later picks (the admin API's /explain).
   */
  explain?: boolean;
}

export function isFilter(p: Plugin): p is Filter {
  return typeof (p as Partial<Filter>).filter === "function";
}
export function isScorer(p: Plugin): p is Scorer {
  return typeof (p as Partial<Scorer>).score === "function";
}
export function isPicker(p: Plugin): p is Picker {
  return typeof (p as Partial<Picker>).pick === "function";
}
export function isProducer(p: Plugin): p is DataProducer {
  return typeof (p as Partial<DataProducer>).produce === "function";
}
export function isPreRequest(p: Plugin): p is PreRequestHook {
  return typeof (p as Partial<PreRequestHook>).preRequest === "function";
}
export function isAdmitter(p: Plugin): p is Admitter {
  return typeof (p as Partial<Admitter>).admit === "function";
}
export function isResponseHooks(p: Plugin): p is ResponseHooks {
  const r = p as Partial<ResponseHooks>;
  return typeof r.onResponseStarted === "function" || typeof r.onResponseComplete === "function";
}
export function isProfileHandler(p: Plugin): p is ProfileHandler {
  return typeof (p as Partial<ProfileHandler>).pickProfiles === "function";
}
export function isDecider(p: Plugin): p is Decider {
  return typeof (p as Partial<Decider>).decide === "function";
}
