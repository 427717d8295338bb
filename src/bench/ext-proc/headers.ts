/**
 * Header handling as Envoy's ext_proc filter does it: HTTP/1 headers to the `HeaderMap` it sends
 * (lower-cased keys, pseudo-headers first, every value in `raw_value`), and a `HeaderMutation` applied
 * under the filter's default mutation rules (envoyproxy/envoy
 * `source/extensions/filters/http/ext_proc/mutation_utils.cc` and
 * `source/extensions/filters/common/mutation_rules/mutation_rules.cc`):
 *   - `set_headers` reads `raw_value` only (Envoy's `send_header_raw_value` default): a server that
 *     writes `value` alone sets the header to the empty string, exactly as Envoy would;
 *     both set is an error;
 *   - `host`, `:authority`, `:method`, `:scheme` and `x-envoy-*` may not be set or removed, and no
 *     `:`-header may be removed: such entries are ignored, not errors;
 *   - in the streamed body modes (`dropContentLength`) a `content-length` in `set_headers` is skipped,
 *     because the filter cannot vouch for a length the processor may still change;
 *   - `append` (deprecated BoolValue) adds a value; otherwise the header is replaced.
 */
import type { HeaderMutation, HeaderValue } from "./protos.ts";

/** Headers as the proxy holds them: lower-case name → values (pseudo-headers included). */
export type HeaderList = Map<string, string[]>;

const ROUTING = new Set(["host", ":authority", ":method", ":scheme"]);
const VALID_NAME = /^:?[!#$%&'*+\-.^_`|~0-9a-z]+$/;
// biome-ignore lint/suspicious/noControlCharactersInRegex: rejecting control characters is the point
const INVALID_VALUE = /[\u0000-\u0008\u000a-\u001f\u007f]/;

/** Hop-by-hop headers a proxy never forwards (RFC 9110 §7.6.1), plus HTTP/1 framing. */
export const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** Node's raw header pairs → a HeaderList with the pseudo-headers Envoy's HTTP/1 codec adds. */
export function requestHeaderList(
  method: string,
  path: string,
  rawHeaders: string[],
  scheme = "http",
): HeaderList {
  const list: HeaderList = new Map();
  let authority = "";
  const rest: [string, string][] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === "host") authority = rawHeaders[i + 1]!;
    else rest.push([name, rawHeaders[i + 1]!]);
  }
  list.set(":authority", [authority]);
  list.set(":path", [path]);
  list.set(":method", [method]);
  list.set(":scheme", [scheme]);
  for (const [name, value] of rest) add(list, name, value);
  return list;
}

/** An upstream response's status and headers → a HeaderList (`:status` first). */
export function responseHeaderList(status: number, headers: Record<string, string | string[] | undefined>) {
  const list: HeaderList = new Map([[":status", [String(status)]]]);
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) add(list, name.toLowerCase(), v);
  }
  return list;
}

function add(list: HeaderList, name: string, value: string): void {
  const values = list.get(name);
  if (values) values.push(value);
  else list.set(name, [value]);
}

/** The `config.core.v3.HeaderMap` Envoy sends: one entry per value, `raw_value` bytes. */
export function toHeaderMap(list: HeaderList): { headers: HeaderValue[] } {
  const headers: HeaderValue[] = [];
  for (const [key, values] of list) {
    for (const v of values) headers.push({ key, raw_value: Buffer.from(v, "latin1") });
  }
  return { headers };
}

/** First value of a header, or undefined. */
export function first(list: HeaderList, name: string): string | undefined {
  return list.get(name)?.[0];
}

function mayMutate(name: string): boolean {
  return !ROUTING.has(name) && !name.startsWith("x-envoy");
}

export interface MutationOutcome {
  /** Set when Envoy would fail the request (a 500 local reply from the filter). */
  error?: string;
  /** Entries Envoy would ignore under its default rules (for tests and logs). */
  ignored: string[];
}

/** Applies `mutation` to `list` in place, as Envoy does; see the module comment. */
export function applyHeaderMutation(
  list: HeaderList,
  mutation: HeaderMutation | undefined,
  dropContentLength: boolean,
): MutationOutcome {
  const ignored: string[] = [];
  if (!mutation) return { ignored };
  for (const raw of mutation.remove_headers ?? []) {
    const name = raw.toLowerCase();
    if (!VALID_NAME.test(name)) return { error: "Invalid character in remove_headers mutation.", ignored };
    if (name.startsWith(":") || !mayMutate(name)) ignored.push(name);
    else list.delete(name);
  }
  for (const option of mutation.set_headers ?? []) {
    const header = option.header;
    if (!header) continue;
    const name = header.key.toLowerCase();
    if (dropContentLength && name === "content-length") {
      ignored.push(name);
      continue;
    }
    const raw = header.raw_value ?? Buffer.alloc(0);
    if (header.value && raw.length > 0) {
      return { error: "Only one of value or raw_value in the HeaderValue message should be set.", ignored };
    }
    const value = raw.toString("latin1");
    if (!VALID_NAME.test(name) || INVALID_VALUE.test(value)) {
      return { error: "Invalid character in set_headers mutation.", ignored };
    }
    if (!mayMutate(name)) {
      ignored.push(name);
      continue;
    }
    if (option.append?.value && list.has(name)) list.get(name)!.push(value);
    else list.set(name, [value]);
  }
  return { ignored };
}

/** A HeaderList → headers for an HTTP/1 message: no pseudo-headers, no hop-by-hop headers. */
export function toHttp1Headers(
  list: HeaderList,
  drop: Iterable<string> = [],
): Record<string, string | string[]> {
  const skip = new Set(drop);
  const out: Record<string, string | string[]> = {};
  for (const [name, values] of list) {
    if (name.startsWith(":") || HOP_BY_HOP.has(name) || skip.has(name)) continue;
    out[name] = values.length === 1 ? values[0]! : [...values]; // undici wants single values as strings
  }
  return out;
}
