/**
 * Flow control's settings (resolved from the flowControl section by flow-config.ts), its requests,
 * outcomes (llm-d-router `pkg/epp/flowcontrol/types/outcomes.go` names) and queue views.
 */
import type { FairnessSettings, OrderingKind, UsageLimitSettings } from "./policies.ts";

export interface BandTemplate {
  /** 0 = the default (5000 requests, 1 GB), as llm-d. */
  maxRequests: number;
  maxBytes: number;
  fairness: FairnessSettings;
  ordering: OrderingKind;
}
export interface BandSettings extends BandTemplate {
  priority: number;
}

export interface FlowControlSettings {
  /** Global limits over every band; 0 = unlimited. */
  maxRequests: number;
  maxBytes: number;
  /** Queue-wait budget in seconds while the pool has endpoints / has none; 0 = no limit. */
  defaultRequestTTL: number;
  noEndpointRequestTTL: number;
  bands: BandSettings[];
  defaultBand: BandTemplate;
  /** Template for unconfigured priorities < 0; null = defaultBand. */
  defaultNegativeBand: BandTemplate | null;
  usageLimit: UsageLimitSettings;
  /** Idle flows are forgotten after this many seconds (llm-d: 5 min). */
  flowGcAfter: number;
}

export const DEFAULT_BAND_MAX_REQUESTS = 5000;
export const DEFAULT_BAND_MAX_BYTES = 1_000_000_000;

export interface FlowRequest {
  id: string;
  fairnessId: string;
  priority: number;
  bytes: number;
  /** When the gateway received it (seconds). */
  receivedAt: number;
  /** Prompt tokens (exact or estimated), charged to the flow at dispatch. */
  promptTokens: number;
  /** TTFT SLO in ms (slo-deadline ordering). */
  sloTtftMs?: number;
  /** Per-request queue TTL in seconds; default the config's. */
  ttl?: number;
}

export type DroppedReason =
  | "rejected-saturated"
  | "rejected-no-endpoints"
  | "rejected-ttl-expired"
  | "rejected-shutting-down";
export type QueueOutcome =
  | "Dispatched"
  | "RejectedCapacity"
  | "RejectedNoEndpoints"
  | "RejectedOther"
  | "EvictedTTL"
  | "EvictedNoEndpoints"
  | "EvictedContextCancelled";

export interface Rejection {
  status: 429 | 503;
  reason: DroppedReason;
  outcome: QueueOutcome;
  message: string;
}
export interface Left {
  request: FlowRequest;
  /** Seconds spent queued. */
  waited: number;
  outcome: QueueOutcome;
}
export interface Expired extends Left {
  rejection: Rejection;
}

export interface FlowView {
  fairnessId: string;
  depth: number;
  bytes: number;
  oldestAgeSeconds: number;
  servedTokens: number;
  /** Dispatched and not yet finished. */
  inflight: number;
  virtualCounter?: number;
  /** Long prefills dispatched without their first token yet (bands with a prefill reserve). */
  longPrefillsPending?: number;
}
export interface FlowsView {
  queued: number;
  bytes: number;
  bands: Array<{
    priority: number;
    fairness: FairnessSettings["kind"];
    ordering: OrderingKind;
    depth: number;
    bytes: number;
    flows: FlowView[];
  }>;
}
