/**
 * Parses vLLM's `--kv-events-config` JSON for the simulated replica, with vLLM's field names, defaults and
 * strictness (vLLM v0.26.0 vllm/config/kv_events.py `KVEventsConfig`), and offsets
 * endpoints per data-parallel rank as vLLM's `ZmqEventPublisher.offset_endpoint_port` does.
 *
 * Unknown keys are rejected: vLLM's `@config` decorator makes a pydantic dataclass with extra="forbid"
 * (vllm/config/utils.py), and older releases built it with `KVEventsConfig(**json.loads(arg))`, which
 * also fails on an unknown keyword. Types are checked strictly (JSON booleans, integers, strings);
 * pydantic's lax coercions such as "10" → 10 are not reproduced.
 */

import { z } from "zod";

export interface KvEventsConfig {
  enableKvCacheEvents: boolean;
  /** Resolved as vLLM's __post_init__ does: "zmq" when enabled and unset, else "null". */
  publisher: "zmq" | "null";
  endpoint: string;
  replayEndpoint: string | null;
  /** Batches kept for replay. */
  bufferSteps: number;
  /** Send high-water mark of the PUB socket. */
  hwm: number;
  /** vLLM's in-process queue bound; the simulator encodes synchronously and keeps no such queue. */
  maxQueueSize: number;
  topic: string;
}

export class KvEventsConfigError extends Error {
  readonly code = "KVG_ERR_KV_EVENTS_CONFIG";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KvEventsConfigError";
  }
}

const count = z.int().min(0);

const schema = z.strictObject({
  enable_kv_cache_events: z.boolean().default(false),
  publisher: z.enum(["null", "zmq"]).nullable().default(null),
  endpoint: z.string().default("tcp://*:5557"),
  replay_endpoint: z.string().nullable().default(null),
  buffer_steps: count.default(10_000),
  hwm: count.default(100_000),
  max_queue_size: count.default(100_000),
  topic: z.string().default(""),
});

/** Parses the JSON text given to `--kv-events-config`. Throws KvEventsConfigError naming what is wrong. */
export function parseKvEventsConfig(json: string): KvEventsConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new KvEventsConfigError(`--kv-events-config is not valid JSON: ${(err as Error).message}`, {
      cause: err,
    });
  }
  return kvEventsConfigFromObject(raw);
}

/** Validates an already-parsed object (snake_case keys, as in vLLM) and applies vLLM's defaults. */
export function kvEventsConfigFromObject(raw: unknown): KvEventsConfig {
  const r = schema.safeParse(raw);
  if (!r.success) {
    const problems = r.error.issues.map((issue) => {
      if (issue.code === "unrecognized_keys") {
        return `unknown field(s) ${issue.keys.join(", ")} (vLLM's KVEventsConfig forbids extra fields)`;
      }
      const path = issue.path.length > 0 ? issue.path.join(".") : "(root)";
      return `${path}: ${issue.message}`;
    });
    throw new KvEventsConfigError(`invalid --kv-events-config: ${problems.join("; ")}`);
  }
  const c = r.data;
  return {
    enableKvCacheEvents: c.enable_kv_cache_events,
    publisher: c.publisher ?? (c.enable_kv_cache_events ? "zmq" : "null"),
    endpoint: c.endpoint,
    replayEndpoint: c.replay_endpoint,
    bufferSteps: c.buffer_steps,
    hwm: c.hwm,
    maxQueueSize: c.max_queue_size,
    topic: c.topic,
  };
}

/** True when vLLM would start a ZMQ publisher for this config (EventPublisherFactory.create). */
export function publishesEvents(cfg: KvEventsConfig): boolean {
  return cfg.enableKvCacheEvents && cfg.publisher === "zmq";
}

/**
 * The endpoint a data-parallel rank uses, as vLLM computes it: rank 0 and empty/null endpoints unchanged;
 * anything containing "inproc" gets a `_dp<rank>` suffix; anything containing "tcp" gets its port (after
 * the last colon) increased by the rank. vLLM raises for other transports (ipc) and non-numeric ports
 * (e.g. `tcp://*:*`) when rank > 0; so does this.
 */
export function offsetEndpointPort(endpoint: string, rank: number): string;
export function offsetEndpointPort(endpoint: string | null, rank: number): string | null;
export function offsetEndpointPort(endpoint: string | null, rank: number): string | null {
  if (!endpoint || rank === 0) return endpoint;
  if (endpoint.includes("inproc")) return `${endpoint}_dp${rank}`;
  if (endpoint.includes("tcp")) {
    const colon = endpoint.lastIndexOf(":");
    if (colon < 0) return endpoint;
    const port = endpoint.slice(colon + 1);
    if (!/^\d+$/.test(port)) {
      throw new KvEventsConfigError(
        `cannot offset endpoint ${endpoint} for rank ${rank}: port is not a number`,
      );
    }
    return `${endpoint.slice(0, colon)}:${Number(port) + rank}`;
  }
  throw new KvEventsConfigError(`invalid endpoint ${endpoint}: must contain 'inproc' or 'tcp'`);
}
