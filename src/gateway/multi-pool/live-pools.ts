/**
 * The pools file, live: the PoolSet in use now, replaced when the file changes (watched) or on the
 * admin API's POST /reload. A reload parses and checks the new file and builds only the pools whose
 * entries changed (an unchanged entry keeps its running Gateway: scrapes, prefix index, in-flight
 * load); only when all of that succeeds does the new set take over, and the pools it dropped drain
 * and close. A file that does not parse, or a pool that cannot be built, leaves the old pools
 * serving and is reported (log line, the reload's HTTP answer, kvgate_front_door_pools_reloads_total)
 * with what to fix. Reloads run one at a time.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { type FileWatch, watchFile } from "../../datalayer/file-watch.ts";
import { GatewayError, sendError } from "../errors.ts";
import { createPoolSet, type DiscoveryOptions } from "./build-pools.ts";
import type { PoolSet, SharedPoolOptions } from "./pool-set.ts";
import { loadPoolsFile, type PoolsFile } from "./pools-file.ts";

export type PoolsReload = { ok: true; pools: string[] } | { ok: false; error: string };

export interface LivePoolsOptions {
  shared: SharedPoolOptions;
  kube?: DiscoveryOptions;
  /** Extra checks of a parsed file (e.g. what kvgate epp cannot honour); throws saying what to change. */
  check?: (spec: PoolsFile) => void;
  /** Stat-poll period of the file watch (tests shorten it). Default 1000 ms. */
  pollMs?: number;
}

export class LivePools {
  readonly path: string | null;
  #current: PoolSet;
  readonly #opts: LivePoolsOptions;
  readonly #log: (line: string) => void;
  #chain: Promise<unknown> = Promise.resolve();
  #watch: FileWatch | null = null;
  #closed = false;

  constructor(current: PoolSet, path: string | null, opts: LivePoolsOptions) {
    this.#current = current;
    this.path = path;
    this.#opts = opts;
    this.#log = opts.shared.log ?? ((l) => console.error(l));
  }

  /** The pools serving now. */
  get current(): PoolSet {
    return this.#current;
  }

  /** Starts the current pools, and watches the file (when there is one). */
  start(): void {
    this.#current.start();
    if (this.path && !this.#watch)
      this.#watch = watchFile(this.path, () => void this.reload(), { pollMs: this.#opts.pollMs });
  }

  /** Re-reads the file; on any error the current pools stay. */
  reload(): Promise<PoolsReload> {
    const next = this.#chain
      .then(() => this.#reload())
      .catch((err: Error) => {
        this.#log(`kvgate: pools reload failed: ${err.stack ?? err}`);
        return { ok: false as const, error: `internal error: ${err.message}; see the log` };
      });
    this.#chain = next;
    return next;
  }

  async #reload(): Promise<PoolsReload> {
    if (this.#closed) return { ok: false, error: "the front is shutting down" };
    if (!this.path) return { ok: false, error: "these pools were not read from a file; nothing to reload" };
    const old = this.#current;
    let next: PoolSet;
    try {
      const spec = loadPoolsFile(this.path);
      this.#opts.check?.(spec);
      next = await createPoolSet(spec, this.#opts.shared, this.#opts.kube, old);
    } catch (err) {
      const error = `${(err as Error).message}; the previous pools (${[...old.pools.keys()].join(", ")}) keep serving`;
      this.#log(`kvgate: pools file rejected: ${error}`);
      old.metrics.reloads.inc({ result: "rejected" });
      return { ok: false, error };
    }
    if (this.#closed) {
      await next.close(new Set(old.pools.values()));
      return { ok: false, error: "the front is shutting down" };
    }
    this.#current = next;
    next.start();
    old
      .close(new Set(next.pools.values()))
      .catch((err: Error) => this.#log(`kvgate: closing replaced pools: ${err.message}`));
    next.metrics.reloads.inc({ result: "ok" });
    const pools = [...next.pools.keys()];
    this.#log(`kvgate: pools file reloaded from ${this.path}: ${pools.join(", ")}`);
    return { ok: true, pools };
  }

  /** The admin routes: POST /reload here, everything else the current set's. */
  handleAdmin(req: IncomingMessage, res: ServerResponse, getOnly = false): void {
    const path = (req.url ?? "/").split("?")[0];
    if (path !== "/reload" || req.method !== "POST" || getOnly) {
      this.#current.handleAdmin(req, res, getOnly);
      return;
    }
    req.resume();
    void this.reload().then((r) => {
      if (!r.ok) return sendError(res, new GatewayError(400, `pools file not reloaded: ${r.error}`));
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(r));
    });
  }

  /** Stops watching, waits for a reload under way, closes the pools. */
  async close(): Promise<void> {
    this.#closed = true;
    this.#watch?.close();
    await this.#chain;
    await this.#current.close();
  }
}
