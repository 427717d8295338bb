/**
 * Number parsing for the Prometheus text format: sample values (decimal with exponent, NaN, ±Inf,
 * parsed without slicing in the common case) and integer millisecond timestamps.
 */

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
export function parseNumber(s: string, start: number, end: number): number | undefined {
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

/** An integer millisecond timestamp; undefined if malformed or not a safe integer. */
export function parseTimestamp(tok: string): number | undefined {
  if (!/^-?\d+$/.test(tok)) return undefined;
  const v = Number(tok);
  return Number.isSafeInteger(v) ? v : undefined;
}
