/**
 * The line scanner of the Prometheus text parser: reads one line's comment (`# HELP`/`# TYPE`) or
 * sample (name, label set, value, timestamp) by char code, without regular expressions.
 */
import type { PromSample } from "./prom-families.ts";
import { parseNumber, parseTimestamp } from "./prom-number.ts";

/** A line-local failure; converted to PromParseError with the line number by the caller. */
export class LineError {
  constructor(readonly message: string) {}
}

// Character classes by char code.
const isSpace = (c: number) => c === 32 || c === 9;
const isNameStart = (c: number) => (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c === 95 || c === 58;
const isNameChar = (c: number) => isNameStart(c) || (c >= 48 && c <= 57);
const isLabelStart = (c: number) => (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c === 95;
const isLabelChar = (c: number) => isLabelStart(c) || (c >= 48 && c <= 57);

/** Scanner over one line [pos, end) of the text. */
export class LineScanner {
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
  /** The metric name at the current position, without moving ("" when none starts here). */
  peekName(): string {
    let i = this.pos;
    while (i < this.end && isNameChar(this.s.charCodeAt(i))) i++;
    return i > this.pos && isNameStart(this.s.charCodeAt(this.pos)) ? this.s.slice(this.pos, i) : "";
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
