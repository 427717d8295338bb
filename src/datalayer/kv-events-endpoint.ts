/**
 * What precise mode subscribes to per endpoint and the counters it keeps: the KV-events endpoint
 * description, how it is derived from the endpoint set and precise-prefix-cache-producer's ports, and
 * the per-endpoint statistics of the subscriber (kv-events-subscriber.ts).
 */

export interface KvEventsEndpoint {
  /** The endpoint id the scheduler uses ("host:port"). */
  id: string;
  /** vLLM's KV-events PUB address, `tcp://host:port`. */
  address: string;
  /** vLLM's replay ROUTER address (`replay_endpoint`), or null for none. */
  replayAddress?: string | null;
  /** Model the endpoint serves (seeds event-side keys). Default: the topic's model (`kv@<pod>@<model>`), else "". */
  model?: string;
}

/**
 * The subscription for an endpoint of the pool: its `kvEvents` address if the endpoint set gives one,
 * else `tcp://<host>:<socketPort>` (llm-d's pod discovery); replay on the same host's replaySocketPort.
 * `ports` is precise-prefix-cache-producer's `kvEvents`.
 */
export function kvEventsEndpointFor(
  ep: { id: string; host: string; kvEvents: string | null },
  ports: { socketPort: number; replaySocketPort: number | null },
  model?: string,
): KvEventsEndpoint {
  const host = ep.host.includes(":") ? `[${ep.host}]` : ep.host;
  return {
    id: ep.id,
    address: ep.kvEvents ?? `tcp://${host}:${ports.socketPort}`,
    replayAddress: ports.replaySocketPort === null ? null : `tcp://${host}:${ports.replaySocketPort}`,
    ...(model === undefined ? {} : { model }),
  };
}

export interface KvEndpointStats {
  /** Last applied seq, or null before the first message. */
  lastSeq: number | null;
  batches: number;
  events: number;
  blocks: number;
  gaps: number;
  replays: number;
  replayFailures: number;
  /** Replays whose first seq was past the one asked for. */
  historyLost: number;
  /** Seq went backwards. */
  restarts: number;
  /** After the connection dropped, the stream did not continue at last + 1: reset and rebuilt. */
  reconnectResets: number;
  /** Times the endpoint's entries were dropped (gap without replay, failed replay, lost history, restart). */
  resets: number;
  /** Live messages skipped because a replay had applied them already. */
  duplicates: number;
  garbage: number;
  /** Events of a kind this decoder does not know (skipped by the codec). */
  unknownEvents: number;
}

export type KvSubscriberStats = Omit<KvEndpointStats, "lastSeq"> & {
  endpoints: Record<string, KvEndpointStats>;
};

export function newStats(): KvEndpointStats {
  return {
    lastSeq: null,
    batches: 0,
    events: 0,
    blocks: 0,
    gaps: 0,
    replays: 0,
    replayFailures: 0,
    historyLost: 0,
    restarts: 0,
    reconnectResets: 0,
    resets: 0,
    duplicates: 0,
    garbage: 0,
    unknownEvents: 0,
  };
}
