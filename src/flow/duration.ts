/** Go-style duration strings ("200ms", "2s", "1m30s", "1.5s") as used in llm-d config, to seconds. */

const UNITS: Record<string, number> = { ns: 1e-9, us: 1e-6, µs: 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
const PART = /(\d+(?:\.\d+)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;

/** Seconds, or null when `text` is not a duration. "0" is allowed, as in Go. */
export function parseDuration(text: string): number | null {
  if (text === "0") return 0;
  if (text.length === 0) return null;
  let total = 0;
  PART.lastIndex = 0;
  while (PART.lastIndex < text.length) {
    const m = PART.exec(text);
    if (m === null) return null;
    total += Number(m[1]) * UNITS[m[2]];
  }
  return total;
}
