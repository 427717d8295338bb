/**
 * One resource kept in sync with the API server by list + watch (the Kubernetes reflector
 * pattern), over @kubernetes/client-node's `Watch`: list, then watch from the list's
 * resourceVersion with bookmarks; a watch the server ends is resumed from the last
 * resourceVersion seen (events or BOOKMARKs); `410 Gone` / an ERROR event with code 410 (the
 * version was compacted away) re-lists; other failures retry with exponential backoff. A 404 on the
 * list (the CRD is not installed) is logged once and retried slowly. Objects are parsed on arrival;
 * one that does not parse is logged and left out, never thrown.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Watch } from "@kubernetes/client-node";
import { describeKubeError, statusOf } from "./errors.ts";
import { isRecord } from "./objects.ts";

export interface ListResult {
  items: unknown[];
  resourceVersion: string;
}

export interface ReflectorOptions<T> {
  /** For log lines, e.g. "Pods in namespace llm". */
  what: string;
  /** The collection's URL path, e.g. `/api/v1/namespaces/llm/pods`. */
  path: string;
  list: () => Promise<ListResult>;
  watch: Watch;
  fieldSelector?: string;
  parse: (obj: unknown) => T;
  log: (line: string) => void;
  /** After a list replaced the cache, or an event changed it. */
  onChange: () => void;
  /** First and largest delay between failed attempts. Defaults 500 and 30000 ms. */
  backoffMs?: { initial: number; max: number };
  /** Delay before listing again a resource whose CRD is not installed. Default 30000 ms. */
  absentRetryMs?: number;
  /** Server-side watch timeout (the server ends the watch; it is resumed). Default 300 s. */
  watchTimeoutSeconds?: number;
}

type WatchEnd =
  | { kind: "closed"; events: number }
  | { kind: "gone"; events: number }
  | { kind: "error"; err: unknown };

export class Reflector<T> {
  readonly #o: ReflectorOptions<T>;
  readonly #objects = new Map<string, T>();
  /** name → resourceVersion of an object that failed to parse, so it is logged once per version. */
  readonly #rejected = new Map<string, string>();
  #rv = "";
  #stopped = false;
  #abort: AbortController | null = null;
  readonly #sleepAbort = new AbortController();
  #synced = false;
  #absent = false;
  #loop: Promise<void> | null = null;
  #lastFailure: string | null = null;

  constructor(opts: ReflectorOptions<T>) {
    this.#o = opts;
  }

  /** True after the first list succeeded (or found the CRD absent). */
  get synced(): boolean {
    return this.#synced;
  }
  /** The last list answered 404: the resource type is not installed. */
  get absent(): boolean {
    return this.#absent;
  }
  values(): IterableIterator<T> {
    return this.#objects.values();
  }
  get size(): number {
    return this.#objects.size;
  }

  start(): void {
    this.#loop ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#sleepAbort.abort();
    this.#abort?.abort();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const { initial, max } = this.#o.backoffMs ?? { initial: 500, max: 30_000 };
    let delay = initial;
    while (!this.#stopped) {
      // List.
      let listed: ListResult;
      try {
        listed = await this.#o.list();
        if (!Array.isArray(listed.items)) throw new Error("the list response has no items array");
      } catch (err) {
        if (this.#stopped) return;
        if (statusOf(err) === 404) {
          if (!this.#absent)
            this.#o.log(
              `kvgate: ${this.#o.what}: not found on the API server (CRD not installed?); skipping it, retrying every ${Math.round((this.#o.absentRetryMs ?? 30_000) / 1000)} s`,
            );
          this.#absent = true;
          this.#synced = true;
          this.#rejected.clear();
          if (this.#objects.size > 0) {
            this.#objects.clear();
            this.#o.onChange();
          }
          await this.#sleep(this.#o.absentRetryMs ?? 30_000);
        } else {
          this.#failure(
            `list failed: ${describeKubeError(err, `get, list and watch on ${this.#o.what}`)}`,
            delay,
          );
          await this.#sleep(delay);
          delay = Math.min(max, delay * 2);
        }
        continue;
      }
      if (this.#absent) this.#o.log(`kvgate: ${this.#o.what}: now served by the API server`);
      this.#absent = false;
      this.#recovered("listed");
      delay = initial;
      this.#replace(listed);
      this.#synced = true;
      this.#o.onChange();
      // Watch from the list's version until the version is gone.
      while (!this.#stopped) {
        const end = await this.#watchOnce();
        if (this.#stopped) return;
        if (end.kind === "gone" || (end.kind === "error" && statusOf(end.err) === 410)) {
          this.#o.log(`kvgate: ${this.#o.what}: resourceVersion ${this.#rv} expired (410); listing again`);
          this.#rv = "";
          // Expired at once, right after a list: pause so a confused server is not hammered.
          if (end.kind === "error" || end.events <= 1) await this.#sleep(initial);
          break;
        }
        if (end.kind === "closed") {
          if (end.events > 0) {
            this.#recovered("watching");
            delay = initial;
          }
          // A server that ends watches at once must not be hammered in a tight loop.
          if (end.events === 0) await this.#sleep(initial);
          continue;
        }
        const err = end.err;
        // The resource type went away (CRD deleted): the list says so, once, and clears the cache.
        if (statusOf(err) === 404) break;
        const timeout = err instanceof Error && err.name === "TimeoutError";
        if (!timeout) {
          this.#failure(
            `watch failed: ${describeKubeError(err, `get, list and watch on ${this.#o.what}`)}`,
            delay,
          );
          await this.#sleep(delay);
          delay = Math.min(max, delay * 2);
        }
      }
    }
  }

  #recovered(doing: string): void {
    if (this.#lastFailure !== null) this.#o.log(`kvgate: ${this.#o.what}: ${doing} again after failures`);
    this.#lastFailure = null;
  }

  /** Logs a failure unless it is the one logged last (a bad config would repeat it forever). */
  #failure(what: string, delay: number): void {
    if (what !== this.#lastFailure)
      this.#o.log(
        `kvgate: ${this.#o.what}: ${what}; retrying with backoff (now ${delay} ms), quiet until it changes`,
      );
    this.#lastFailure = what;
  }

  #replace(listed: ListResult): void {
    this.#objects.clear();
    for (const item of listed.items) this.#put(item);
    this.#rv = listed.resourceVersion;
  }

  /** Parses and stores one object; false if it was rejected. */
  #put(obj: unknown): boolean {
    const meta = isRecord(obj) && isRecord(obj.metadata) ? obj.metadata : null;
    const name = meta && typeof meta.name === "string" ? meta.name : null;
    if (name === null) {
      this.#o.log(`kvgate: ${this.#o.what}: skipping an object without metadata.name`);
      return false;
    }
    try {
      this.#objects.set(name, this.#o.parse(obj));
      this.#rejected.delete(name);
      return true;
    } catch (err) {
      const rv = typeof meta?.resourceVersion === "string" ? meta.resourceVersion : "";
      if (this.#rejected.get(name) !== rv)
        this.#o.log(`kvgate: ${this.#o.what}: skipping malformed object: ${(err as Error).message}`);
      this.#rejected.set(name, rv);
      // A bad new version replaces the good old one: what the cluster says now cannot be used.
      this.#objects.delete(name);
      return false;
    }
  }

  #watchOnce(): Promise<WatchEnd> {
    return new Promise<WatchEnd>((resolve) => {
      let gone = false;
      let done = false;
      let events = 0;
      const params: Record<string, string | number | boolean> = {
        resourceVersion: this.#rv,
        allowWatchBookmarks: true,
        timeoutSeconds: this.#o.watchTimeoutSeconds ?? 300,
      };
      if (this.#o.fieldSelector) params.fieldSelector = this.#o.fieldSelector;
      const onEvent = (type: string, obj: unknown) => {
        if (this.#stopped) return;
        events++;
        const meta = isRecord(obj) && isRecord(obj.metadata) ? obj.metadata : null;
        if (type === "ERROR") {
          const code = isRecord(obj) ? obj.code : undefined;
          if (code === 410) gone = true;
          else
            this.#o.log(
              `kvgate: ${this.#o.what}: watch ERROR event: ${isRecord(obj) ? String(obj.message ?? code) : "?"}`,
            );
          return;
        }
        if (meta && typeof meta.resourceVersion === "string") this.#rv = meta.resourceVersion;
        if (type === "BOOKMARK") return;
        if (type === "ADDED" || type === "MODIFIED") {
          const had = this.#objects.has(String(meta?.name));
          if (this.#put(obj) || had) this.#o.onChange();
        } else if (type === "DELETED") {
          const name = meta && typeof meta.name === "string" ? meta.name : null;
          this.#rejected.delete(String(name));
          if (name !== null && this.#objects.delete(name)) this.#o.onChange();
        } else this.#o.log(`kvgate: ${this.#o.what}: ignoring a watch event of type ${JSON.stringify(type)}`);
      };
      const onDone = (err: unknown) => {
        done = true;
        this.#abort = null;
        if (gone) resolve({ kind: "gone", events });
        else if (err) resolve({ kind: "error", err });
        else resolve({ kind: "closed", events });
      };
      this.#o.watch.watch(this.#o.path, params, onEvent, onDone).then(
        (ctrl) => {
          if (this.#stopped) ctrl.abort();
          else if (!done) this.#abort = ctrl;
        },
        (err) => resolve({ kind: "error", err }),
      );
    });
  }

  async #sleep(ms: number): Promise<void> {
    try {
      await sleep(ms, undefined, { signal: this.#sleepAbort.signal });
    } catch {
      // aborted by stop()
    }
  }
}
