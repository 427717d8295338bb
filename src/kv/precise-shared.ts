/**
 * The precise index's longest-prefix match when a shared tier (a filesystem every endpoint reaches)
 * holds copies: a block counts for a candidate if the candidate holds it or a shared tier's
 * pseudo-endpoint does, at the better of the two weights; a candidate the index never heard from gets
 * the shared run alone. Simpler and slower than PreciseIndex.match's walk: per block one pass over its
 * holders plus one over the candidates still matching. Pure.
 */
import type { EntryStore } from "./precise-store.ts";
import { NIL, SPEC } from "./precise-store.ts";
import type { PrefixMatches } from "./precise-types.ts";

/** Per-endpoint lookup scratch of the index: tag[ep] = base + blocks matched, score[ep] the sum. */
export interface MatchScratch {
  tag: Int32Array;
  score: Float64Array;
  base: number;
}

export function matchWithShared(
  store: EntryStore,
  weight: Float64Array,
  sharedEps: ReadonlySet<number>,
  k32: ArrayLike<number>,
  lo: number,
  hi: number,
  n: number,
  eps: Int32Array,
  now: number,
  scratch: MatchScratch,
  out: PrefixMatches,
): PrefixMatches {
  const m = eps.length;
  const { tag, score, base } = scratch;
  const alive: number[] = [];
  for (let j = 0; j < m; j++) {
    const ep = eps[j];
    if (ep < 0 || tag[ep] === base) continue;
    tag[ep] = base;
    score[ep] = 0;
    alive.push(ep);
  }
  const s = store;
  const keyTab = s.keys;
  const { eLink, eExp } = s;
  // Candidates the index has never heard from (-1) hold nothing locally: they get the shared run.
  let unknown = false;
  for (let j = 0; j < m; j++) if (eps[j] < 0) unknown = true;
  let sharedAlive = unknown;
  let sharedBlocks = 0;
  let sharedScore = 0;
  let k = NIL;
  for (let i = 0; i < n && (alive.length > 0 || sharedAlive); i++) {
    k = i === 0 ? keyTab.find(k32[lo], k32[hi]) : keyTab.findNext(k, k32[2 * i + lo], k32[2 * i + hi]);
    if (k === NIL) break;
    const want = base + i;
    let sharedW = 0;
    for (let e = keyTab.rec[4 * k + 2]; e !== NIL; e = eLink[2 * e]) {
      const epf = eLink[2 * e + 1];
      if (sharedEps.has(epf & 0xffffff)) sharedW = Math.max(sharedW, weight[epf >>> 24]);
    }
    if (sharedAlive && sharedW > 0) {
      sharedBlocks++;
      sharedScore += sharedW;
    } else sharedAlive = false;
    for (let e = keyTab.rec[4 * k + 2]; e !== NIL; e = eLink[2 * e]) {
      const epf = eLink[2 * e + 1];
      const ep = epf & 0xffffff;
      if (tag[ep] !== want) continue;
      const f = epf >>> 24;
      const w = Math.max(f === SPEC && eExp[e] <= now ? 0 : weight[f], sharedW);
      if (w <= 0) continue;
      tag[ep] = want + 1;
      score[ep] += w;
    }
    let live = 0;
    for (const ep of alive) {
      if (tag[ep] === want && sharedW > 0) {
        tag[ep] = want + 1;
        score[ep] += sharedW;
      }
      if (tag[ep] === want + 1) alive[live++] = ep;
    }
    alive.length = live;
  }
  if (out.pos.length < m) out.grow(m);
  let c = 0;
  for (let j = 0; j < m; j++) {
    const ep = eps[j];
    if (ep < 0) {
      if (sharedBlocks === 0) continue;
      out.pos[c] = j;
      out.blocks[c] = sharedBlocks;
      out.scores[c++] = sharedScore;
      continue;
    }
    if (tag[ep] <= base) continue;
    out.pos[c] = j;
    out.blocks[c] = tag[ep] - base;
    out.scores[c++] = score[ep];
  }
  out.count = c;
  return out;
}
