/**
 * The data layer as one object: the endpoint source (static list or watched file) feeds the
 * Datastore and the Scraper, so endpoints added or removed by a file edit start or stop being
 * scraped and routed to. The gateway only talks to this.
 */
import type { Datastore, DatastoreOptions } from "./datastore.ts";
import { Datastore as Store } from "./datastore.ts";
import type { EndpointSource, EndpointSpec, ReloadOutcome } from "./endpoints.ts";
import { Scraper, type ScraperOptions } from "./scraper.ts";

export interface DataLayerOptions {
  store?: DatastoreOptions;
  scraper?: ScraperOptions;
  /**
   * Called after the endpoint set changed: an endpoint added or removed, or an entry's labels or
   * kvEvents address changed (e.g. to prune per-endpoint scheduler state, or resubscribe KV events).
   */
  onEndpointsChanged?: (ids: ReadonlySet<string>) => void;
}

export class DataLayer {
  readonly source: EndpointSource;
  readonly store: Datastore;
  readonly scraper: Scraper;
  readonly #onChanged: (ids: ReadonlySet<string>) => void;
  readonly #listeners: Array<[string, (spec: EndpointSpec) => void]>;

  constructor(source: EndpointSource, opts: DataLayerOptions = {}) {
    this.source = source;
    this.store = new Store(opts.store);
    this.scraper = new Scraper(this.store, opts.scraper);
    this.#onChanged = opts.onEndpointsChanged ?? (() => {});
    for (const spec of source.current()) this.#add(spec);
    this.#listeners = [
      [
        "add",
        (s) => {
          this.#add(s);
          this.#changed();
        },
      ],
      [
        "update",
        (s) => {
          this.store.upsert(s);
          this.#changed();
        },
      ],
      [
        "remove",
        (s) => {
          this.store.remove(s.id);
          this.scraper.remove(s.id);
          this.#changed();
        },
      ],
    ];
    for (const [ev, fn] of this.#listeners) source.on(ev as "add", fn);
  }

  #add(spec: EndpointSpec): void {
    this.store.upsert(spec);
    this.scraper.add(spec);
  }

  #changed(): void {
    this.#onChanged(new Set(this.store.all().map((r) => r.spec.id)));
  }

  start(): void {
    this.scraper.start();
  }

  /** Re-reads the endpoints file (static lists: no-op). */
  reload(): ReloadOutcome {
    return this.source.reload();
  }

  async close(): Promise<void> {
    for (const [ev, fn] of this.#listeners) this.source.off(ev as "add", fn);
    this.source.close();
    await this.scraper.close();
  }
}
