/**
 * Parser for the Prometheus text exposition format 0.0.4, as emitted by vLLM (prometheus_client),
 * SGLang and prom-client, plus small accessors for gauges and histograms. Hand-written line scanner
 * (the scraper runs it every 50–200 ms per endpoint); histogram and summary series keep every label
 * set, which is why this exists instead of the npm parser (see node-ecosystem.md §5).
 * Format facts: https://prometheus.io/docs/instrumenting/exposition_formats/ (text format 0.0.4).
 */

export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped";

export interface PromSample {
  /** The full sample name, e.g. `vllm:time_to_first_token_seconds_bucket`. */
  name: string;
  labels: Record<string, string>;
  value: number;
  timestampMs?: number;
}

export interface PromFamily {
  name: string;
  type: MetricType;
  help: string;
  /** In exposition order; histogram `_bucket`/`_sum`/`_count` and summary series included. */
  samples: PromSample[];
}

/** Families keyed by family name, in order of first appearance. */
export type PromFamilies = Map<string, PromFamily>;

export interface PromParseResult {
  families: PromFamilies;
  /** Lines dropped in lenient mode (always 0 in strict mode, which throws instead). */
  skippedLines: number;
  /** The first few errors of the skipped lines (at most 5), for logging. */
  errors: PromParseError[];
}

/** A malformed line; `line` is 1-based. */
export class PromParseError extends Error {
  override name = "PromParseError";
  readonly line: number;
  constructor(line: number, message: string) {
    super(`line ${line}: ${message}`);
    this.line = line;
  }
}

const TYPES = new Set<string>(["counter", "gauge", "histogram", "summary", "untyped"]);
const MAX_KEPT_ERRORS = 5;

/** A line-local failure; converted to PromParseError with the line number by the caller. */
class LineError {
  constructor(readonly message: string) {}
}

// Character classes by char code.
const isSpace = (c: number) => c === 32 || c === 9;
const isNameStart = (c: number) => (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c === 95 || c === 58;
const isNameChar = (c: number) => isNameStart(c) || (c >= 48 && c <= 57);
const isLabelStart = (c: number) => (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c === 95;
const isLabelChar = (c: number) => isLabelStart(c) || (c >= 48 && c <= 57);

/**
 * Parses an exposition. Strict (default): the first malformed line throws PromParseError.
 * Lenient: malformed lines are skipped and counted; everything else is kept.
 */
export function parsePromText(text: string, opts: { lenient?: boolean } = {}): PromParseResult {
  const p = new Parser(text);
  const families: PromFamilies = new Map();
  const typed = new Set<string>();
  const errors: PromParseError[] = [];
  let skipped = 0;
  let lastName = "";
  let lastFamily: PromFamily | undefined;
  let lineNo = 0;
  let pos = text.charCodeAt(0) === 0xfeff ? 1 : 0;
  while (pos <= text.length) {
    let end = text.indexOf("\n", pos);
    if (end < 0) end = text.length;
    lineNo++;
    let lineEnd = end;
    if (lineEnd > pos && text.charCodeAt(lineEnd - 1) === 13) lineEnd--;
    try {
      p.reset(pos, lineEnd);
      p.skipSpaces();
      if (p.atEnd()) {
        // blank line
      } else if (p.peek() === 35 /* # */) {
        const c = p.comment();
        if (c) {
          lastName = "";
          if (c.kind === "TYPE") {
            if (!TYPES.has(c.text)) throw new LineError(`unknown metric type "${c.text}"`);
            if (typed.has(c.name)) throw new LineError(`second TYPE line for ${c.name}`);
            typed.add(c.name);
          }
          let fam = families.get(c.name);
          if (!fam) {
            fam = { name: c.name, type: "untyped", help: "", samples: [] };
            families.set(c.name, fam);
          }
          if (c.kind === "HELP") fam.help = c.text;
          else fam.type = c.text as MetricType;
        }
      } else {
        const s = p.sample();
        let fam = s.name === lastName ? lastFamily : undefined;
        if (!fam) {
          fam = resolveFamily(families, s.name);
          lastName = s.name;
          lastFamily = fam;
        }
        fam.samples.push(s);
      }
    } catch (e) {
      if (!(e instanceof LineError)) throw e;
      const err = new PromParseError(lineNo, e.message);
      if (!opts.lenient) throw err;
      skipped++;
      if (errors.length < MAX_KEPT_ERRORS) errors.push(err);
    }
    pos = end + 1;
  }
  return { families, skippedLines: skipped, errors };
}

/** The family a sample belongs to: its own name, or the histogram/summary/counter it is a series of. */
function resolveFamily(families: PromFamilies, name: string): PromFamily {
  const own = families.get(name);
  if (own) return own;
  const base = seriesBase(name);
  if (base !== undefined) {
    const f = families.get(base.name);
    if (f && base.types.includes(f.type)) return f;
  }
  const nf: PromFamily = { name, type: "untyped", help: "", samples: [] };
  families.set(name, nf);
  return nf;
}

const SUFFIXES: Array<[string, MetricType[]]> = [
  ["_bucket", ["histogram"]],
  ["_sum", ["histogram", "summary"]],
  ["_count", ["histogram", "summary"]],
  ["_total", ["counter"]],
  ["_created", ["histogram", "summary", "counter"]],
];

function seriesBase(name: string): { name: string; types: MetricType[] } | undefined {
  for (const [suffix, types] of SUFFIXES) {
    if (name.length > suffix.length && name.endsWith(suffix)) {
      return { name: name.slice(0, name.length - suffix.length), types };
    }
  }
  return undefined;
}

/** Scanner over one line [pos, end) of the text. */
class Parser {
  private pos = 0;
  private end = 0;
  constructor(private readonly s: string) {}

  reset(pos: number, end: number): void {
    this.pos = pos;
    this.end = end;
  }
  atEnd(): boolean {
    return this.pos >= this.end;
  }
  peek(): number {
    return this.s.charCodeAt(this.pos);
  }
  skipSpaces(): void {
    while (this.pos < this.end && isSpace(this.s.charCodeAt(this.pos))) this.pos++;
  }

  /** `# HELP name text` / `# TYPE name type`; other comments give null. */
  comment(): { kind: "HELP" | "TYPE"; name: string; text: string } | null {
    this.pos++; // '#'
    this.skipSpaces();
    const kind = this.word();
    if (kind !== "HELP" && kind !== "TYPE") return null;
    this.skipSpaces();
    if (this.atEnd() || !isNameStart(this.peek())) throw new LineError(`${kind} line without a metric name`);
    const name = this.metricName();
    if (!this.atEnd() && !isSpace(this.peek())) throw new LineError(`bad character in metric name ${name}`);
    this.skipSpaces();
    if (kind === "HELP") return { kind, name, text: this.helpText() };
    const type = this.word();
    this.skipSpaces();
    if (type === "" || !this.atEnd()) throw new LineError(`TYPE line for ${name} needs exactly one type`);
    return { kind, name, text: type };
  }

  /** The characters up to the next space or the end of the line. */
  private word(): string {
    const start = this.pos;
    while (this.pos < this.end && !isSpace(this.s.charCodeAt(this.pos))) this.pos++;
    return this.s.slice(start, this.pos);
  }

  /** HELP text with `\\` and `\n` escapes; other backslashes are kept as is. */
  private helpText(): string {
    const raw = this.s.slice(this.pos, this.end);
    return raw.indexOf("\\") < 0 ? raw : raw.replace(/\\([\\n])/g, (_, c) => (c === "n" ? "\n" : "\\"));
  }

  private metricName(): string {
    const start = this.pos;
    this.pos++;
    while (this.pos < this.end && isNameChar(this.s.charCodeAt(this.pos))) this.pos++;
    return this.s.slice(start, this.pos);
  }

  sample(): PromSample {
    if (!isNameStart(this.peek())) throw new LineError("expected a metric name");
    const name = this.metricName();
    this.skipSpaces();
    const labels: Record<string, string> = {};
    if (!this.atEnd() && this.peek() === 123 /* { */) {
      this.pos++;
      this.labelSet(labels);
      this.skipSpaces();
    } else if (!this.atEnd() && !isSpace(this.s.charCodeAt(this.pos - 1))) {
      throw new LineError(`bad character after metric name ${name}`);
    }
    if (this.atEnd()) throw new LineError(`sample ${name} has no value`);
    const vStart = this.pos;
    while (this.pos < this.end && !isSpace(this.s.charCodeAt(this.pos))) this.pos++;
    const value = parseNumber(this.s, vStart, this.pos);
    if (value === undefined) throw new LineError(`bad value for ${name}`);
    this.skipSpaces();
    if (this.atEnd()) return { name, labels, value };
    const tsTok = this.word();
    this.skipSpaces();
    if (!this.atEnd()) throw new LineError(`text after the timestamp of ${name}`);
    const ts = parseTimestamp(tsTok);
    if (ts === undefined) throw new LineError(`bad timestamp for ${name}`);
    return { name, labels, value, timestampMs: ts };
  }

  private readonly lineKeys: string[] = [];
  /** After `{`: `name="value"` pairs separated by commas, optional trailing comma, then `}`. */
  private labelSet(labels: Record<string, string>): void {
    const s = this.s;
    const end = this.end;
    const keys = this.lineKeys;
    let nKeys = 0;
    let i = this.pos;
    for (;;) {
      while (i < end && isSpace(s.charCodeAt(i))) i++;
      if (i >= end) throw new LineError("unterminated label set");
      if (s.charCodeAt(i) === 125 /* } */) {
        this.pos = i + 1;
        return;
      }
      const start = i;
      if (!isLabelStart(s.charCodeAt(i))) throw new LineError("expected a label name");
      while (i < end && isLabelChar(s.charCodeAt(i))) i++;
      const key = s.slice(start, i);
      while (i < end && isSpace(s.charCodeAt(i))) i++;
      if (i >= end || s.charCodeAt(i) !== 61 /* = */) throw new LineError(`expected = after label ${key}`);
      i++;
      while (i < end && isSpace(s.charCodeAt(i))) i++;
      if (i >= end || s.charCodeAt(i) !== 34 /* " */) throw new LineError(`expected " after ${key}=`);
      // The value: up to the closing quote, with escapes \\, \" and \n.
      let value = "";
      let run = ++i;
      for (;;) {
        if (i >= end) throw new LineError("unterminated label value");
        const c = s.charCodeAt(i);
        if (c === 34) break;
        if (c !== 92) {
          i++;
          continue;
        }
        const n = s.charCodeAt(i + 1);
        if (i + 1 >= end) throw new LineError("unterminated label value");
        value += s.slice(run, i);
        if (n === 92) value += "\\";
        else if (n === 34) value += '"';
        else if (n === 110) value += "\n";
        else throw new LineError(`bad escape \\${s[i + 1]} in a label value`);
        i += 2;
        run = i;
      }
      value += s.slice(run, i++);
      for (let k = 0; k < nKeys; k++) if (keys[k] === key) throw new LineError(`duplicate label ${key}`);
      keys[nKeys++] = key;
      // A plain assignment to "__proto__" would set the prototype instead of a property.
      if (key === "__proto__") {
        Object.defineProperty(labels, key, { value, enumerable: true, writable: true, configurable: true });
      } else labels[key] = value;
      while (i < end && isSpace(s.charCodeAt(i))) i++;
      if (i >= end) throw new LineError("unterminated label set");
      const c = s.charCodeAt(i);
      if (c === 44 /* , */) i++;
      else if (c !== 125) throw new LineError(`expected , or } after label ${key}`);
    }
  }
}

const SPECIAL_VALUES = new Map<string, number>([
  ...["nan"].map((k): [string, number] => [k, Number.NaN]),
  ...["inf", "+inf", "infinity", "+infinity"].map((k): [string, number] => [k, Infinity]),
  ...["-inf", "-infinity"].map((k): [string, number] => [k, -Infinity]),
]);
const POW10 = Array.from({ length: 23 }, (_, k) => 10 ** k);

/** A float as Go's ParseFloat takes it in this format: decimal with exponent, NaN, ±Inf (any case). */
export function parseValue(tok: string): number | undefined {
  return parseNumber(tok, 0, tok.length);
}

/**
 * Parses s[start, end) without slicing in the common case: up to 15 significant digits and a
 * decimal exponent within ±22 are exact doubles, so one division or multiplication rounds
 * correctly (Clinger's fast path); anything else goes to Number().
 */
function parseNumber(s: string, start: number, end: number): number | undefined {
  let i = start;
  let c = s.charCodeAt(i);
  const neg = c === 45;
  if (neg || c === 43) i++;
  let m = 0;
  let digits = 0;
  let scale = 0;
  while (i < end && (c = s.charCodeAt(i)) >= 48 && c <= 57) {
    m = m * 10 + (c - 48);
    digits++;
    i++;
  }
  if (i < end && c === 46) {
    i++;
    while (i < end && (c = s.charCodeAt(i)) >= 48 && c <= 57) {
      m = m * 10 + (c - 48);
      digits++;
      scale++;
      i++;
    }
  }
  if (digits === 0)
    return end - start <= 9 ? SPECIAL_VALUES.get(s.slice(start, end).toLowerCase()) : undefined;
  let exp = 0;
  if (i < end && (c | 32) === 101 /* e */) {
    i++;
    c = s.charCodeAt(i);
    const expNeg = c === 45;
    if (expNeg || c === 43) i++;
    const expStart = i;
    while (i < end && (c = s.charCodeAt(i)) >= 48 && c <= 57) {
      if (exp < 100000) exp = exp * 10 + (c - 48);
      i++;
    }
    if (i === expStart) return undefined;
    if (expNeg) exp = -exp;
  }
  if (i !== end) return undefined;
  const e = exp - scale;
  if (digits > 15 || e < -22 || e > 22) return Number(s.slice(start, end));
  const v = e < 0 ? m / POW10[-e] : m * POW10[e];
  return neg ? -v : v;
}

function parseTimestamp(tok: string): number | undefined {
  if (!/^-?\d+$/.test(tok)) return undefined;
  const v = Number(tok);
  return Number.isSafeInteger(v) ? v : undefined;
}

// ---- accessors ----

/** Label filter: every listed label must equal the sample's (an absent label counts as ""). */
export type LabelFilter = Record<string, string>;

function matches(labels: Record<string, string>, filter: LabelFilter | undefined): boolean {
  if (!filter) return true;
  for (const k in filter) if ((Object.hasOwn(labels, k) ? labels[k] : "") !== filter[k]) return false;
  return true;
}

/** Samples whose name is exactly `sampleName` (a family name or a series like `x_count`) and match the filter. */
export function samplesOf(families: PromFamilies, sampleName: string, filter?: LabelFilter): PromSample[] {
  let fam = families.get(sampleName);
  if (!fam) {
    const base = seriesBase(sampleName);
    if (base) fam = families.get(base.name);
  }
  if (!fam) return [];
  const out: PromSample[] = [];
  for (const s of fam.samples) if (s.name === sampleName && matches(s.labels, filter)) out.push(s);
  return out;
}

/** Sum over every matching series (e.g. all DP engines of a replica); undefined if none matches. */
export function sumOf(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  const ss = samplesOf(families, name, filter);
  if (ss.length === 0) return undefined;
  let total = 0;
  for (const s of ss) total += s.value;
  return total;
}

/** The first matching series in exposition order; undefined if none matches. */
export function first(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  return samplesOf(families, name, filter)[0]?.value;
}

/**
 * A gauge or counter value: the SUM over the matching series, so a replica with several DP engines
 * reports its total queue. With one engine (the usual vLLM case) that is its single value. Use
 * `first` for a single series, e.g. an info metric.
 */
export function gauge(families: PromFamilies, name: string, filter?: LabelFilter): number | undefined {
  return sumOf(families, name, filter);
}

export interface HistogramData {
  /** [upper bound, cumulative count], ascending, +Inf last when present. */
  buckets: Array<[number, number]>;
  sum: number;
  count: number;
}

/**
 * A histogram family by its family name (without `_bucket`). Series matching the filter are merged:
 * counts at equal `le` and the sums/counts add up. Undefined if no bucket or count series matches.
 */
export function histogram(
  families: PromFamilies,
  name: string,
  filter?: LabelFilter,
): HistogramData | undefined {
  const byLe = new Map<number, number>();
  for (const s of samplesOf(families, `${name}_bucket`, filter)) {
    const le = parseValue(s.labels.le ?? "");
    if (le === undefined || Number.isNaN(le)) continue;
    byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  const sum = sumOf(families, `${name}_sum`, filter);
  const count = sumOf(families, `${name}_count`, filter);
  if (byLe.size === 0 && count === undefined) return undefined;
  const buckets = [...byLe.entries()].sort((a, b) => a[0] - b[0]);
  return { buckets, sum: sum ?? 0, count: count ?? byLe.get(Infinity) ?? 0 };
}
