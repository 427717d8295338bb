/**
 * Precise mode in the gateway: one KvEventsSubscriber per precise-prefix-cache-producer of the current
 * routing, each subscribed to every endpoint of the data layer and feeding that producer's index.
 *
 * `sync(producers, specs)` is the only mutator and is idempotent: it closes the subscribers of producers
 * no longer configured, creates one for each new producer, and makes each subscriber's endpoint set equal
 * `specs` (an endpoint's address is its `kvEvents` from the endpoints file, else its host and the
 * producer's socketPort; replay at its `kvEventsReplay`, else its host and the producer's
 * replaySocketPort when set, else none). An endpoint that leaves, or whose addresses change,
 * is unsubscribed at once, which also drops its index entries. The gateway calls it at start, whenever
 * the endpoint set changes, and after a config reload; `close()` on shutdown.
 */
import type { EndpointSpec } from "../datalayer/endpoints.ts";
import {
  type KvEndpointStats,
  type KvEventsEndpoint,
  KvEventsSubscriber,
  kvEventsEndpointFor,
} from "../datalayer/kv-events-subscriber.ts";
import { PrecisePrefixProducer } from "../scheduler/plugins/precise-prefix-cache-producer.ts";
import type { Scheduler } from "../scheduler/scheduler.ts";

/** The scheduler's precise-prefix-cache-producer instances, in config order. */
export function preciseProducers(scheduler: Scheduler): PrecisePrefixProducer[] {
  const out: PrecisePrefixProducer[] = [];
  for (const p of scheduler.plugins.values()) if (p instanceof PrecisePrefixProducer) out.push(p);
  return out;
}

/** One endpoint's subscription as the admin API and metrics show it. */
export interface KvEventsEndpointView extends KvEndpointStats {
  address: string;
  replayAddress: string | null;
  /** (block, endpoint) entries the producer's index holds for this endpoint, speculative ones included. */
  indexEntries: number;
}

export interface KvEventsFeedView {
  /** The producer's plugin name. */
  plugin: string;
  indexEntries: number;
  indexBytes: number;
  indexBytesPerEntry: number;
  endpoints: Record<string, KvEventsEndpointView>;
}

interface Feed {
  readonly producer: PrecisePrefixProducer;
  readonly subscriber: KvEventsSubscriber;
  /** Endpoint id → what it is subscribed to. */
  readonly subscribed: Map<string, KvEventsEndpoint>;
}

/** kvEventsEndpointFor, with the endpoints file's kvEventsReplay winning over host + replaySocketPort. */
function subscriptionFor(spec: EndpointSpec, producer: PrecisePrefixProducer): KvEventsEndpoint {
  const sub = kvEventsEndpointFor(spec, producer.kvEvents);
  return spec.kvEventsReplay === undefined ? sub : { ...sub, replayAddress: spec.kvEventsReplay };
}

const sameAddress = (a: KvEventsEndpoint, b: KvEventsEndpoint) =>
  a.address === b.address && (a.replayAddress ?? null) === (b.replayAddress ?? null);

export class KvEventsWiring {
  #feeds: Feed[] = [];
  readonly #pending = new Set<Promise<void>>();
  readonly #log: (line: string) => void;
  #closed = false;

  constructor(log: (line: string) => void) {
    this.#log = log;
  }

  /** Whether any producer is being fed (precise mode). */
  get active(): boolean {
    return this.#feeds.length > 0;
  }

  /** The live producer → subscriber pairs (for tests and debugging). */
  feeds(): ReadonlyArray<{ producer: PrecisePrefixProducer; subscriber: KvEventsSubscriber }> {
    return this.#feeds.map((f) => ({ producer: f.producer, subscriber: f.subscriber }));
  }

  /** Feeds exactly `producers`, each from exactly the endpoints in `specs`. */
  sync(producers: readonly PrecisePrefixProducer[], specs: readonly EndpointSpec[]): void {
    if (this.#closed) return;
    const next: Feed[] = [];
    for (const f of this.#feeds) {
      if (producers.includes(f.producer)) next.push(f);
      else this.#track(f.subscriber.close(), `closing the subscriber of ${f.producer.typedName.name}`);
    }
    for (const p of producers) {
      if (next.some((f) => f.producer === p)) continue;
      const name = p.typedName.name;
      next.push({
        producer: p,
        subscriber: new KvEventsSubscriber({
          index: p.index,
          topicFilter: p.kvEvents.topicFilter,
          log: (line) => this.#log(`kvgate: ${name}: ${line}`),
        }),
        subscribed: new Map(),
      });
    }
    this.#feeds = next;
    for (const f of next) this.#syncEndpoints(f, specs);
  }

  #syncEndpoints(f: Feed, specs: readonly EndpointSpec[]): void {
    const want = new Map(specs.map((s) => [s.id, subscriptionFor(s, f.producer)]));
    for (const [id, cur] of f.subscribed) {
      const w = want.get(id);
      if (w !== undefined && sameAddress(w, cur)) continue;
      f.subscribed.delete(id);
      this.#track(f.subscriber.removeEndpoint(id), `unsubscribing ${id}`);
    }
    for (const [id, w] of want) {
      if (f.subscribed.has(id)) continue;
      f.subscribed.set(id, w);
      this.#track(f.subscriber.addEndpoint(w), `subscribing ${id} at ${w.address}`, () => {
        if (f.subscribed.get(id) === w) f.subscribed.delete(id);
      });
    }
  }

  #track(p: Promise<void>, what: string, onError?: () => void): void {
    const q: Promise<void> = p
      .catch((err: Error) => {
        this.#log(`kvgate: kv-events: ${what} failed: ${err.message}`);
        onError?.();
      })
      .finally(() => this.#pending.delete(q));
    this.#pending.add(q);
  }

  /** Per producer: index size and each subscribed endpoint's counters. */
  views(): KvEventsFeedView[] {
    return this.#feeds.map((f) => {
      const idx = f.producer.index;
      const is = idx.stats();
      const stats = f.subscriber.stats().endpoints;
      const endpoints: Record<string, KvEventsEndpointView> = {};
      for (const [id, sub] of f.subscribed) {
        const s = stats[id];
        if (s === undefined) continue;
        endpoints[id] = {
          address: sub.address,
          replayAddress: sub.replayAddress ?? null,
          ...s,
          indexEntries: idx.endpointEntries(id),
        };
      }
      return {
        plugin: f.producer.typedName.name,
        indexEntries: is.entries,
        indexBytes: is.bytes,
        indexBytesPerEntry: is.bytesPerEntry,
        endpoints,
      };
    });
  }

  /** Closes every subscriber (index entries are kept) and waits for their loops. */
  async close(): Promise<void> {
    this.#closed = true;
    const feeds = this.#feeds;
    this.#feeds = [];
    for (const f of feeds) this.#track(f.subscriber.close(), "closing");
    while (this.#pending.size > 0) await Promise.all([...this.#pending]);
  }
}
