/**
 * "Did you mean" for config errors: the known names closest to a misspelt one by edit distance
 * (Levenshtein, case-insensitive), so a typo in a plugin type, parameter or pluginRef gets the
 * likely intended name instead of a bare "unknown".
 */

/** Levenshtein distance between a and b (insert, delete, substitute each cost 1). */
export function editDistance(a: string, b: string): number {
  if (a === b) return 0;
  if (a.length === 0) return b.length;
  if (b.length === 0) return a.length;
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  let cur = new Array<number>(b.length + 1);
  for (let i = 1; i <= a.length; i++) {
    cur[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const sub = prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1);
      cur[j] = Math.min(sub, prev[j] + 1, cur[j - 1] + 1);
    }
    [prev, cur] = [cur, prev];
  }
  return prev[b.length];
}

/**
 * Up to `max` candidates within a distance of about a third of the name's length (at least 2),
 * nearest first, ties in candidate order. Empty when nothing is close.
 */
export function closestNames(name: string, candidates: Iterable<string>, max = 3): string[] {
  const needle = name.toLowerCase();
  const limit = Math.max(2, Math.floor(needle.length / 3));
  const scored: { c: string; d: number; i: number }[] = [];
  let i = 0;
  for (const c of new Set(candidates)) {
    const d = editDistance(needle, c.toLowerCase());
    if (c !== name && d <= limit) scored.push({ c, d, i });
    i++;
  }
  scored.sort((x, y) => x.d - y.d || x.i - y.i);
  return scored.slice(0, max).map((s) => s.c);
}

/** ` Did you mean "a" or "b"?` (leading space), or "" when nothing is close. */
export function didYouMean(name: string, candidates: Iterable<string>): string {
  const near = closestNames(name, candidates);
  if (near.length === 0) return "";
  const quoted = near.map((n) => `"${n}"`);
  const list = quoted.length === 1 ? quoted[0] : `${quoted.slice(0, -1).join(", ")} or ${quoted.at(-1)}`;
  return ` Did you mean ${list}?`;
}
