/**
 * Parser for the Prometheus text exposition format 0.0.4, as emitted by vLLM (prometheus_client),
 * SGLang and prom-client. Hand-written line scanner (prom-line-scanner.ts; the scraper runs it every
 * 50–200 ms per endpoint); histogram and summary series keep every label set, which is why this
 * exists instead of the npm parser (parse-prometheus-text-format 1.1.1 drops the labels, `_sum` and `_count`
 * of labelled
 * histograms, and vLLM's histograms always carry labels). The accessors for gauges and
 * histograms (prom-accessors.ts) and the data model (prom-families.ts) are re-exported here.
 * Format facts: https://prometheus.io/docs/instrumenting/exposition_formats/ (text format 0.0.4).
 */
import { type MetricType, type PromFamilies, type PromFamily, seriesBase } from "./prom-families.ts";
import { LineError, LineScanner } from "./prom-line-scanner.ts";

export {
  first,
  gauge,
  type HistogramData,
  histogram,
  type LabelFilter,
  samplesOf,
  sumOf,
} from "./prom-accessors.ts";
export type { MetricType, PromFamilies, PromFamily, PromSample } from "./prom-families.ts";
export { parseValue } from "./prom-number.ts";

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

/**
 * Parses an exposition. Strict (default): the first malformed line throws PromParseError.
 * Lenient: malformed lines are skipped and counted; everything else is kept. `keep`: only samples
 * whose name it accepts are parsed, the others are skipped before their labels are read (the
 * scraper needs a handful of a replica's ~400 series, 10-20 times a second per replica).
 */
export function parsePromText(
  text: string,
  opts: { lenient?: boolean; keep?: (sampleName: string) => boolean } = {},
): PromParseResult {
  const p = new LineScanner(text);
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
      } else if (opts.keep === undefined || opts.keep(p.peekName())) {
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
