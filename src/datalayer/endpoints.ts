/**
 * The endpoint set: parsed from `--endpoints host:port,...` or from an endpoints file (YAML list of
 * `{address, labels?, kvEvents?, kvEventsReplay?}` or `{endpoints: [...]}`), validated with errors
 * that name the entry and field. A file source re-reads the file when it changes (fs.watch on its
 * directory plus a stat poll, because editors replace files and some filesystems never report
 * events); a bad edit keeps the previous set and reports the error. Changes are emitted as
 * add/remove/update events.
 */
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { type FileWatch, watchFile } from "./file-watch.ts";

export interface EndpointSpec {
  /** "host:port", the identity used by the scheduler, metrics and admin API. */
  id: string;
  host: string;
  port: number;
  labels: Record<string, string>;
  /** vLLM KV-events publisher, `tcp://host:port`, or null. */
  kvEvents: string | null;
  /**
   * vLLM's KV-events replay socket (`replay_endpoint`), `tcp://host:port`, when the file gives one;
   * otherwise precise mode derives it from the host and the producer's replaySocketPort, if set.
   */
  kvEventsReplay?: string;
}

export class EndpointConfigError extends Error {
  override name = "EndpointConfigError";
}

const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;
const IPV6 = /^[0-9A-Fa-f:.]+$/;

/** What to do about a host part that is not a hostname or IPv4 address. */
function hostAdvice(host: string): string {
  if (host.includes("/")) return "write host:port without a path, e.g. 127.0.0.1:8000";
  if (host.includes(":")) return "write an IPv6 address in brackets, e.g. [::1]:8000";
  return "use a hostname (letters, digits, '-' and '.') or an IPv4 address, e.g. 127.0.0.1:8000";
}

/** Parses "host:port" or "[v6]:port"; throws EndpointConfigError naming `where`. */
export function parseHostPort(text: string, where: string): { host: string; port: number; id: string } {
  const s = text.trim();
  // A URL where host:port belongs ("http://10.0.0.7:8000", or without a port): say so, whatever follows.
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(s)?.[0];
  if (scheme !== undefined)
    throw new EndpointConfigError(
      `${where}: "${text}" is not host:port; write it without the "${scheme}" scheme, e.g. 127.0.0.1:8000`,
    );
  let host: string;
  let portText: string;
  if (s.startsWith("[")) {
    const close = s.indexOf("]");
    if (close < 0 || s[close + 1] !== ":")
      throw new EndpointConfigError(`${where}: "${text}" is not [ipv6]:port`);
    host = s.slice(1, close);
    portText = s.slice(close + 2);
    if (!IPV6.test(host) || !host.includes(":"))
      throw new EndpointConfigError(`${where}: "${host}" is not an IPv6 address`);
  } else {
    const colon = s.lastIndexOf(":");
    if (colon <= 0)
      throw new EndpointConfigError(`${where}: "${text}" is not host:port (e.g. 10.0.0.7:8000)`);
    host = s.slice(0, colon);
    portText = s.slice(colon + 1);
    if (!HOSTNAME.test(host))
      throw new EndpointConfigError(
        `${where}: "${host}" is not a valid hostname or IPv4; ${hostAdvice(host)}`,
      );
  }
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : Number.NaN;
  if (!(port >= 1 && port <= 65535))
    throw new EndpointConfigError(`${where}: port "${portText}" must be an integer in [1, 65535]`);
  host = host.toLowerCase();
  const id = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  return { host, port, id };
}

function checkDuplicates(list: EndpointSpec[], where: (i: number) => string): void {
  const seen = new Map<string, number>();
  list.forEach((e, i) => {
    const prev = seen.get(e.id);
    if (prev !== undefined)
      throw new EndpointConfigError(`${where(i)}: ${e.id} is listed twice (also ${where(prev)})`);
    seen.set(e.id, i);
  });
}

/** `--endpoints a:1,b:2`: at least one address, no duplicates. */
export function parseEndpointList(list: string): EndpointSpec[] {
  const parts = list
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
  if (parts.length === 0) throw new EndpointConfigError("--endpoints: give at least one host:port");
  const out = parts.map((p, i) => {
    const { host, port, id } = parseHostPort(p, `--endpoints[${i}]`);
    return { id, host, port, labels: {}, kvEvents: null };
  });
  checkDuplicates(out, (i) => `--endpoints[${i}]`);
  return out;
}

const ENTRY_KEYS = new Set(["address", "labels", "kvEvents", "kvEventsReplay"]);
const LABEL_KEY = /^(?:[A-Za-z0-9.-]{1,253}\/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$/;

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function parseEntry(raw: unknown, where: string): EndpointSpec {
  if (typeof raw === "string") {
    const { host, port, id } = parseHostPort(raw, where);
    return { id, host, port, labels: {}, kvEvents: null };
  }
  if (!isRecord(raw))
    throw new EndpointConfigError(
      `${where}: expected {address, labels?, kvEvents?, kvEventsReplay?} or "host:port"`,
    );
  for (const k of Object.keys(raw))
    if (!ENTRY_KEYS.has(k))
      throw new EndpointConfigError(
        `${where}: unknown field "${k}" (allowed: address, labels, kvEvents, kvEventsReplay)`,
      );
  if (typeof raw.address !== "string")
    throw new EndpointConfigError(`${where}.address: required, a "host:port" string`);
  const { host, port, id } = parseHostPort(raw.address, `${where}.address`);
  const labels: Record<string, string> = {};
  if (raw.labels !== undefined && raw.labels !== null) {
    if (!isRecord(raw.labels))
      throw new EndpointConfigError(`${where}.labels: expected a map of string to string`);
    for (const [k, v] of Object.entries(raw.labels)) {
      if (!LABEL_KEY.test(k))
        throw new EndpointConfigError(`${where}.labels: "${k}" is not a valid label key`);
      if (typeof v !== "string")
        throw new EndpointConfigError(`${where}.labels.${k}: value must be a string (quote it in YAML)`);
      labels[k] = v;
    }
  }
  const kvEvents = tcpAddress(raw.kvEvents, `${where}.kvEvents`);
  const kvEventsReplay = tcpAddress(raw.kvEventsReplay, `${where}.kvEventsReplay`);
  const spec: EndpointSpec = { id, host, port, labels, kvEvents };
  if (kvEventsReplay !== null) spec.kvEventsReplay = kvEventsReplay;
  return spec;
}

/** A `tcp://host:port` field (normalised), or null when absent. */
function tcpAddress(v: unknown, where: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "string" || !v.startsWith("tcp://"))
    throw new EndpointConfigError(`${where}: expected "tcp://host:port"`);
  return `tcp://${parseHostPort(v.slice("tcp://".length), where).id}`;
}

/** Parses endpoints-file text; `origin` (the path) prefixes error messages. An empty list is valid. */
export function parseEndpointsFile(text: string, origin: string): EndpointSpec[] {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new EndpointConfigError(`${origin}: not valid YAML: ${(err as Error).message.split("\n")[0]}`);
  }
  let list: unknown;
  if (doc === null || doc === undefined) list = [];
  else if (Array.isArray(doc)) list = doc;
  else if (isRecord(doc) && "endpoints" in doc) {
    for (const k of Object.keys(doc))
      if (k !== "endpoints") throw new EndpointConfigError(`${origin}: unknown top-level field "${k}"`);
    list = doc.endpoints ?? [];
  } else throw new EndpointConfigError(`${origin}: expected a list of endpoints or {endpoints: [...]}`);
  if (!Array.isArray(list)) throw new EndpointConfigError(`${origin}: endpoints must be a list`);
  const out = list.map((e, i) => parseEntry(e, `${origin}: endpoints[${i}]`));
  checkDuplicates(out, (i) => `${origin}: endpoints[${i}]`);
  return out;
}

export interface EndpointDiff {
  added: EndpointSpec[];
  removed: EndpointSpec[];
  /** Same id, different labels, kvEvents or kvEventsReplay. */
  updated: EndpointSpec[];
}

const sameSpec = (a: EndpointSpec, b: EndpointSpec) =>
  a.kvEvents === b.kvEvents &&
  (a.kvEventsReplay ?? null) === (b.kvEventsReplay ?? null) &&
  JSON.stringify(a.labels) === JSON.stringify(b.labels);

export function diffEndpoints(prev: readonly EndpointSpec[], next: readonly EndpointSpec[]): EndpointDiff {
  const before = new Map(prev.map((e) => [e.id, e]));
  const after = new Map(next.map((e) => [e.id, e]));
  const diff: EndpointDiff = { added: [], removed: [], updated: [] };
  for (const e of next) {
    const old = before.get(e.id);
    if (!old) diff.added.push(e);
    else if (!sameSpec(old, e)) diff.updated.push(e);
  }
  for (const e of prev) if (!after.has(e.id)) diff.removed.push(e);
  return diff;
}

export interface EndpointSourceEvents {
  add: [EndpointSpec];
  remove: [EndpointSpec];
  update: [EndpointSpec];
  /** A reload that failed; the previous set stays. */
  error: [Error];
}

export type ReloadOutcome = { ok: true; diff: EndpointDiff } | { ok: false; error: string };

export interface FileSourceOptions {
  /** Stat-poll period; 0 disables polling (fs.watch only). Default 1000. */
  pollMs?: number;
  /** Coalesces bursts of change notifications. Default 30. */
  debounceMs?: number;
  log?: (line: string) => void;
}

/** The current endpoint set, static or backed by a watched file. */
export class EndpointSource extends EventEmitter<EndpointSourceEvents> {
  #specs: EndpointSpec[];
  readonly path: string | null;
  #lastText: string | null = null;
  #watch: FileWatch | null = null;
  #log: (line: string) => void;
  #closed = false;

  private constructor(specs: EndpointSpec[], path: string | null, log: (line: string) => void) {
    super();
    this.#specs = specs;
    this.path = path;
    this.#log = log;
  }

  static fromList(list: string | EndpointSpec[]): EndpointSource {
    const specs = typeof list === "string" ? parseEndpointList(list) : list;
    return new EndpointSource(specs, null, () => {});
  }

  /** Reads and parses the file now (throws on a bad file) and starts watching it. */
  static fromFile(path: string, opts: FileSourceOptions = {}): EndpointSource {
    const abs = resolve(path);
    let text: string;
    try {
      text = readFileSync(abs, "utf8");
    } catch (err) {
      throw new EndpointConfigError(
        `${path}: cannot read endpoints file: ${(err as Error).message}; check the path`,
      );
    }
    const src = new EndpointSource(
      parseEndpointsFile(text, path),
      abs,
      opts.log ?? ((l) => console.error(l)),
    );
    src.#lastText = text;
    src.#watch = watchFile(abs, () => src.reload(), { pollMs: opts.pollMs, debounceMs: opts.debounceMs });
    return src;
  }

  current(): readonly EndpointSpec[] {
    return this.#specs;
  }

  /** Re-reads the file (no-op for a static list). A bad file keeps the old set. */
  reload(): ReloadOutcome {
    const none: EndpointDiff = { added: [], removed: [], updated: [] };
    if (!this.path || this.#closed) return { ok: true, diff: none };
    let text: string;
    try {
      text = readFileSync(this.path, "utf8");
    } catch (err) {
      return this.#fail(
        new EndpointConfigError(
          `${this.path}: cannot read endpoints file: ${(err as Error).message}; check the path`,
        ),
      );
    }
    if (text === this.#lastText) return { ok: true, diff: none };
    let next: EndpointSpec[];
    try {
      next = parseEndpointsFile(text, this.path);
    } catch (err) {
      return this.#fail(err as Error);
    }
    this.#lastText = text;
    return { ok: true, diff: this.replace(next) };
  }

  /** Replaces the set and emits the differences. */
  replace(next: EndpointSpec[]): EndpointDiff {
    const diff = diffEndpoints(this.#specs, next);
    this.#specs = next;
    for (const e of diff.removed) this.emit("remove", e);
    for (const e of diff.added) this.emit("add", e);
    for (const e of diff.updated) this.emit("update", e);
    if (this.path && (diff.added.length || diff.removed.length || diff.updated.length))
      this.#log(
        `kvgate: endpoints reloaded from ${this.path}: +${diff.added.length} -${diff.removed.length} ~${diff.updated.length}`,
      );
    return diff;
  }

  close(): void {
    this.#closed = true;
    this.#watch?.close();
    this.#watch = null;
  }

  #fail(err: Error): ReloadOutcome {
    this.#log(
      `kvgate: endpoints file rejected, keeping the previous ${this.#specs.length} endpoint(s): ${err.message}`,
    );
    if (this.listenerCount("error") > 0) this.emit("error", err);
    return { ok: false, error: err.message };
  }
}
