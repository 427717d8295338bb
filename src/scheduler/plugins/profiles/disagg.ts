/**
 * disagg-profile-handler: prefill/decode disaggregation as llm-d-router runs it
 * (llm-d/llm-d-router@02d6c2ee pkg/epp/framework/plugins/scheduling/profilehandler/disagg/
 * disagg_profile_handler.go). The decode profile is primary.
 *
 *   stageOrder decode-first (default): decode runs first; the prefill decider, shown the decode
 *     pick, says whether the prefill profile runs too. A decider that declines means decode-only.
 *   stageOrder prefill-first: prefill runs whenever the prefill profile exists, then decode. llm-d
 *     rejects a prefill decider in this order; so does kvgate.
 *   profiles.fallback (decode-first only): an aggregated profile run when the decode profile, or a
 *     prefill profile the decider asked for, finds no endpoint.
 *
 * A prefill the decider asked for that finds no endpoint, with no fallback profile, is never a
 * silent decode-only (llm-d-router#2427): the outcome says `prefillUnavailable`, and the gateway
 * applies its prefill-failure policy — a counted, marked local prefill on the decoder
 * (`recompute`, kvgate's default), or llm-d's answer since PR #2521, a 503 (`fail`). Every
 * request's decision and its reason are reported as the handler's outcome (the gateway's
 * disagg_decision_total, and /explain).
 * Encode stages are not implemented.
 */
import { z } from "zod";
import type { PluginHandle } from "../../plugin-spec.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  Decider,
  HandlerOutcome,
  ProfileHandler,
  ProfileView,
  TypedName,
} from "../../types.ts";
import { isDecider } from "../../types.ts";

/** llm-d's ParseStageOrder: case, '-' and '_' do not matter; "decode"/"prefill" are short forms. */
const stageOrder = z
  .string()
  .transform((s, ctx) => {
    const k = s.toLowerCase().replace(/[-_]/g, "");
    if (k === "" || k === "decodefirst" || k === "decode") return "decode-first" as const;
    if (k === "prefillfirst" || k === "prefill") return "prefill-first" as const;
    ctx.addIssue({ code: "custom", message: `stageOrder "${s}": use decode-first or prefill-first` });
    return z.NEVER;
  })
  .default("decode-first");

export const disaggParams = z
  .strictObject({
    stageOrder,
    profiles: z
      .strictObject({
        decode: z.string().min(1).default("decode"),
        prefill: z.string().min(1).default("prefill"),
        encode: z.string().min(1).default("encode"),
        fallback: z.string().min(1).optional(),
      })
      .default({ decode: "decode", prefill: "prefill", encode: "encode" }),
    deciders: z
      .strictObject({ prefill: z.string().min(1).optional(), encode: z.string().min(1).optional() })
      .default({}),
  })
  .superRefine((p, ctx) => {
    if (p.stageOrder === "prefill-first" && p.deciders.prefill !== undefined)
      ctx.addIssue({
        code: "custom",
        message:
          "a prefill decider is not supported with stageOrder prefill-first (prefill always runs); remove deciders.prefill or use decode-first",
      });
    const fb = p.profiles.fallback;
    if (fb === undefined) return;
    if (p.stageOrder !== "decode-first")
      ctx.addIssue({ code: "custom", message: "profiles.fallback needs stageOrder decode-first" });
    for (const stage of ["decode", "prefill", "encode"] as const)
      if (p.profiles[stage] === fb)
        ctx.addIssue({ code: "custom", message: `profiles.fallback must differ from profiles.${stage}` });
  });
export type DisaggParams = z.output<typeof disaggParams>;

/** The per-request decision, kept in the cycle until outcome() reads it. */
interface Decision {
  /** The prefill stage was not wanted (no decider, decider declined, no prefill profile). */
  skipped: string | null;
  fallback: string | null;
}

export class DisaggProfileHandler implements ProfileHandler {
  readonly typedName: TypedName;
  readonly #key: DataKey<Decision>;

  constructor(
    name: string,
    readonly params: DisaggParams,
    readonly handle: PluginHandle,
  ) {
    this.typedName = { type: "disagg-profile-handler", name };
    this.#key = { name: `${name}/disagg-decision` } as DataKey<Decision>;
  }

  pickProfiles(cycle: CycleState, profiles: ReadonlyMap<string, ProfileView>): string[] {
    const d = cycle.memo(this.#key, () => ({ skipped: null, fallback: null }));
    if (d.fallback !== null) return [];
    const { decode, prefill, fallback } = this.params.profiles;
    const done = cycle.profileResults;
    const wantFallback = (why: string): string[] => {
      if (fallback === undefined || !profiles.has(fallback)) return [];
      d.fallback = why;
      return [fallback];
    };
    if (this.params.stageOrder === "prefill-first") {
      if (profiles.has(prefill) && !done.has(prefill)) return [prefill];
      if (!profiles.has(prefill)) d.skipped = `no profile "${prefill}"`;
      return done.has(decode) ? [] : [decode];
    }
    if (!done.has(decode)) return [decode];
    const target = done.get(decode)?.target;
    if (!target) return wantFallback(`profile "${decode}" found no endpoint`);
    if (done.has(prefill)) {
      return done.get(prefill)?.target ? [] : wantFallback(`profile "${prefill}" found no endpoint`);
    }
    if (d.skipped !== null) return [];
    const deciderName = this.params.deciders.prefill;
    if (!profiles.has(prefill)) d.skipped = `no profile "${prefill}"`;
    else if (deciderName === undefined) d.skipped = "no prefill decider configured";
    else if (!this.decider(deciderName).decide(cycle, target))
      d.skipped = `decider "${deciderName}" declined for ${target.id}`;
    return d.skipped === null ? [prefill] : [];
  }

  primaryProfile(cycle: CycleState): string {
    const fb = this.params.profiles.fallback;
    return fb !== undefined && cycle.get(this.#key)?.fallback ? fb : this.params.profiles.decode;
  }

  outcome(cycle: CycleState): HandlerOutcome | undefined {
    const d = cycle.get(this.#key);
    if (d === undefined) return undefined;
    const { decode, prefill } = this.params.profiles;
    if (d.fallback !== null)
      return { decision: "aggregated-fallback", reason: d.fallback, prefillTarget: null };
    if (!cycle.profileResults.get(decode)?.target) return undefined; // the request fails anyway
    if (d.skipped !== null) return { decision: "decode-only", reason: d.skipped, prefillTarget: null };
    const p = cycle.profileResults.get(prefill);
    if (p?.target) {
      const why =
        this.params.stageOrder === "prefill-first"
          ? "stageOrder prefill-first"
          : `decider "${this.params.deciders.prefill}" approved`;
      return { decision: "prefill-decode", reason: why, prefillTarget: p.target };
    }
    const reason = `the prefill stage was required but profile "${prefill}" found no endpoint (${p?.failure ?? "not run"}): no Ready prefill endpoint; make prefill pods Ready (label llm-d.ai/role=prefill), or set disagg-profile-handler profiles.fallback to serve such requests on an aggregated profile`;
    return { decision: "decode-only", reason, prefillTarget: null, prefillUnavailable: true };
  }

  decider(name: string): Decider {
    const d = this.handle.plugin(name);
    if (d === undefined || !isDecider(d))
      throw new Error(`disagg-profile-handler: "${name}" is not a decider`);
    return d;
  }
}

export const disaggProfileHandlerSpec = spec({
  type: "disagg-profile-handler",
  stability: "alpha",
  kind: "profile-handler",
  summary:
    "P/D: the decode profile (primary), and the prefill profile when the prefill decider approves (or first, with stageOrder prefill-first).",
  params: disaggParams,
  factory: (name, p, handle) => new DisaggProfileHandler(name, p, handle),
});
