/**
 * One profile run: filters in order, then total[e] = Σ clamp(score, 0, 1)·weight over the scorers
 * (weights not normalised, llm-d/llm-d-router@ebab6879 pkg/epp/scheduling/scheduler_profile.go), then the
 * picker. Keeps what the failover list
 * and the explanation need; per-scorer raw scores are kept only when explaining.
 */
import type { CompiledProfile } from "./scheduler.ts";
import { zeroedScores } from "./scores.ts";
import type {
  CandidateExplanation,
  CycleState,
  EndpointState,
  ProfileExplanation,
  ProfileResult,
  ScorerExplanation,
} from "./types.ts";

export class ProfileRun implements ProfileResult {
  readonly name: string;
  readonly target: EndpointState | null;
  readonly failure: string | null = null;
  readonly #eps: readonly EndpointState[];
  readonly #totals: Float64Array;
  readonly #picks: number[];
  readonly #profile: CompiledProfile;
  readonly #candidates: readonly EndpointState[];
  readonly #removedBy: Map<string, string> | null;
  readonly #raw: Float64Array[] | null;
  #fallbacks: EndpointState[] | null = null;

  constructor(
    profile: CompiledProfile,
    cycle: CycleState,
    candidates: readonly EndpointState[],
    explain: boolean,
  ) {
    this.name = profile.name;
    this.#profile = profile;
    this.#candidates = candidates;
    this.#removedBy = explain ? new Map() : null;
    this.#raw = explain ? [] : null;
    let eps = candidates;
    if (eps.length === 0) this.failure = "no candidate endpoints";
    for (const f of profile.filters) {
      if (eps.length === 0) break;
      const next = f.filter(cycle, eps);
      if (this.#removedBy !== null && next.length !== eps.length) {
        const kept = new Set(next);
        for (const e of eps) if (!kept.has(e)) this.#removedBy.set(e.id, f.typedName.name);
      }
      eps = next;
      if (eps.length === 0)
        this.failure = `filter "${f.typedName.name}" removed every candidate; retry later, or check that the endpoints match this filter (POST /explain on the admin port shows which filter removed each one)`;
    }
    this.#eps = eps;
    const n = eps.length;
    const totals = zeroedScores(n);
    if (n > 0) {
      for (const { scorer, weight } of profile.scorers) {
        const s = scorer.score(cycle, eps);
        const kept = this.#raw !== null ? zeroedScores(n) : null;
        for (let i = 0; i < n; i++) {
          const v = s[i];
          const c = v > 0 ? Math.min(v, 1) : 0;
          totals[i] += c * weight;
          if (kept !== null) kept[i] = c;
        }
        if (kept !== null) this.#raw?.push(kept);
      }
    }
    this.#totals = totals;
    this.#picks =
      n === 0 ? [] : validPicks(profile.picker.pick(cycle, eps, totals), n, profile.picker.typedName.name);
    this.target = this.#picks.length > 0 ? eps[this.#picks[0]] : null;
  }

  get picked(): number {
    return this.#picks.length;
  }

  /** The picker's other picks, then every other surviving candidate by score (ties by id). */
  get fallbacks(): EndpointState[] {
    if (this.#fallbacks !== null) return this.#fallbacks;
    const picked = new Set(this.#picks);
    const rest: number[] = [];
    for (let i = 0; i < this.#eps.length; i++) if (!picked.has(i)) rest.push(i);
    const t = this.#totals;
    const eps = this.#eps;
    rest.sort((a, b) => t[b] - t[a] || (eps[a].id < eps[b].id ? -1 : eps[a].id > eps[b].id ? 1 : 0));
    this.#fallbacks = [...this.#picks.slice(1), ...rest].map((i) => eps[i]);
    return this.#fallbacks;
  }

  /** Total weighted score of a surviving candidate, or null. */
  totalOf(endpointId: string): number | null {
    const i = this.#eps.findIndex((e) => e.id === endpointId);
    return i < 0 ? null : this.#totals[i];
  }

  explain(): ProfileExplanation {
    const index = new Map<string, number>();
    for (let i = 0; i < this.#eps.length; i++) index.set(this.#eps[i].id, i);
    const raw = this.#raw ?? [];
    const candidates: CandidateExplanation[] = this.#candidates.map((e) => {
      const i = index.get(e.id);
      if (i === undefined)
        return { id: e.id, total: null, scores: [], removedBy: this.#removedBy?.get(e.id) ?? null };
      const scores: ScorerExplanation[] = this.#profile.scorers.map(({ scorer, weight }, k) => ({
        name: scorer.typedName.name,
        type: scorer.typedName.type,
        raw: raw[k]?.[i] ?? 0,
        weight,
        weighted: (raw[k]?.[i] ?? 0) * weight,
      }));
      return { id: e.id, total: this.#totals[i], scores, removedBy: null };
    });
    return {
      candidates,
      filters: this.#profile.filters.map((f) => f.typedName.name),
      picker: this.#profile.picker.typedName.name,
      picked: this.#picks.map((i) => this.#eps[i].id),
      failure: this.failure,
    };
  }
}

/** Picker output must be distinct in-range indices; anything else is a plugin bug. */
function validPicks(picks: number[], n: number, picker: string): number[] {
  if (picks.length === 1) {
    const i = picks[0];
    if (!Number.isInteger(i) || i < 0 || i >= n) {
      throw new Error(`picker "${picker}" returned invalid index ${i} for ${n} candidates`);
    }
    return picks;
  }
  const seen = new Set<number>();
  for (const i of picks) {
    if (!Number.isInteger(i) || i < 0 || i >= n || seen.has(i)) {
      throw new Error(`picker "${picker}" returned invalid index ${i} for ${n} candidates`);
    }
    seen.add(i);
  }
  if (picks.length === 0) throw new Error(`picker "${picker}" picked nothing from ${n} candidates`);
  return picks;
}
