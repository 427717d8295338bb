/**
 * Profile handlers and P/D deciders (llm-d/llm-d-router@ebab6879
 * `pkg/epp/framework/plugins/scheduling/profilehandler/`).
 *   single-profile-handler   runs the one profile; it is primary.
 *   (disagg-profile-handler is in disagg.ts.)
 *   prefix-based-pd-decider  disaggregate iff nonCachedTokens > 0, prompt ≥ promptTokens (when
 *                            > 0), prompt ≥ nonCachedTokens, and prompt − cached tokens on the
 *                            decode target ≥ nonCachedTokens.
 *   always-disagg-pd-decider always.
 */
import { z } from "zod";
import type { PluginHandle } from "../../plugin-spec.ts";
import { spec } from "../../plugin-spec.ts";
import type {
  CycleState,
  DataKey,
  Decider,
  EndpointState,
  ProfileHandler,
  ProfileView,
  TypedName,
} from "../../types.ts";
import type { PrefixMatchInfo } from "../data.ts";
import { prefixKey } from "../data.ts";
import { flatPrompt } from "../prefix/hashing.ts";

export class SingleProfileHandler implements ProfileHandler {
  readonly typedName: TypedName;
  #profile = "default";

  constructor(name: string) {
    this.typedName = { type: "single-profile-handler", name };
  }

  pickProfiles(cycle: CycleState, profiles: ReadonlyMap<string, ProfileView>): string[] {
    if (cycle.profileResults.size > 0) return [];
    this.#profile = profiles.keys().next().value as string;
    return [this.#profile];
  }

  primaryProfile(): string {
    return this.#profile;
  }
}

export const pdDeciderParams = z.strictObject({
  nonCachedTokens: z.number().int().nonnegative().default(0),
  promptTokens: z.number().int().nonnegative().default(0),
  prefixMatchInfoProducerName: z.string().min(1).optional(),
});

export class PrefixBasedPdDecider implements Decider {
  readonly typedName: TypedName;
  readonly #key: DataKey<PrefixMatchInfo>;

  constructor(
    name: string,
    readonly params: z.output<typeof pdDeciderParams>,
    readonly handle: PluginHandle,
  ) {
    this.typedName = { type: "prefix-based-pd-decider", name };
    this.#key = prefixKey(params.prefixMatchInfoProducerName as string);
  }

  consumes() {
    return { required: [this.#key] };
  }

  decide(cycle: CycleState, decodeTarget: EndpointState): boolean {
    const { nonCachedTokens, promptTokens } = this.params;
    if (nonCachedTokens === 0) return false;
    const input = flatPrompt(cycle, this.handle.hasher).tokenCount;
    if (promptTokens > 0 && input < promptTokens) return false;
    if (input < nonCachedTokens) return false;
    const info = cycle.get(this.#key);
    if (info === undefined) return false;
    return input - info.matchBlocks(decodeTarget.id) * info.blockSizeTokens >= nonCachedTokens;
  }
}

export class AlwaysDisaggDecider implements Decider {
  readonly typedName: TypedName;
  constructor(name: string) {
    this.typedName = { type: "always-disagg-pd-decider", name };
  }
  decide(): boolean {
    return true;
  }
}

export const singleProfileHandlerSpec = spec({
  type: "single-profile-handler",
  stability: "stable",
  kind: "profile-handler",
  summary: "Runs the single scheduling profile.",
  params: z.strictObject({}),
  factory: (name) => new SingleProfileHandler(name),
});

export const prefixPdDeciderSpec = spec({
  type: "prefix-based-pd-decider",
  stability: "alpha",
  kind: "decider",
  summary: "Runs prefill separately when the decode target lacks at least nonCachedTokens of the prompt.",
  params: pdDeciderParams,
  needs: () => [{ family: "prefix-match-info", param: "prefixMatchInfoProducerName", required: true }],
  factory: (name, p, handle) => new PrefixBasedPdDecider(name, p, handle),
});

export const alwaysPdDeciderSpec = spec({
  type: "always-disagg-pd-decider",
  stability: "alpha",
  kind: "decider",
  summary: "Always runs prefill separately.",
  params: z.strictObject({}),
  factory: (name) => new AlwaysDisaggDecider(name),
});
