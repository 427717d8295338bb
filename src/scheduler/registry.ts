/**
 * The plugin registry: an explicit instance built from a list of specs (no registration as a side
 * effect of importing). builtinRegistry() lists every plugin kvgate ships; tests and the simulator
 * can build their own. Known llm-d types kvgate does not implement are listed so configs naming
 * them fail with a clear "not implemented" instead of "unknown type".
 */
import { concurrencyDetectorSpec } from "../flow/concurrency-detector.ts";
import { FLOW_POLICY_SPECS } from "../flow/policies.ts";
import { utilizationDetectorSpec } from "../flow/utilization-detector.ts";
import type { PluginSpec } from "./plugin-spec.ts";
import {
  decodeFilterSpec,
  encodeFilterSpec,
  labelSelectorSpec,
  prefillFilterSpec,
} from "./plugins/filters/labels.ts";
import { localityFilterSpec } from "./plugins/filters/locality.ts";
import { affinityFilterSpec } from "./plugins/filters/prefix-affinity.ts";
import { inflightSpec } from "./plugins/inflight/producer.ts";
import { admitterSpec } from "./plugins/latency/admitter.ts";
import { predictedLatencySpec } from "./plugins/latency/producer.ts";
import { latencyScorerSpec } from "./plugins/latency/scorer.ts";
import { tierFilterSpec } from "./plugins/latency/tier-filter.ts";
import {
  maxScorePickerSpec,
  randomPickerSpec,
  roundRobinPickerSpec,
  weightedRandomPickerSpec,
} from "./plugins/pickers/pickers.ts";
import { precisePrefixSpec } from "./plugins/precise-prefix-cache-producer.ts";
import { approxPrefixSpec } from "./plugins/prefix/producer.ts";
import { disaggProfileHandlerSpec } from "./plugins/profiles/disagg.ts";
import {
  alwaysPdDeciderSpec,
  prefixPdDeciderSpec,
  singleProfileHandlerSpec,
} from "./plugins/profiles/handlers.ts";
import { transferCostDeciderSpec } from "./plugins/profiles/transfer-cost-decider.ts";
import {
  activeRequestSpec,
  decodeLoadSpec,
  kvPressureSpec,
  leastRequestSpec,
  tokenLoadSpec,
} from "./plugins/scorers/inflight.ts";
import { loraAffinitySpec } from "./plugins/scorers/lora-affinity.ts";
import {
  kvCacheScorerSpec,
  loadAwareScorerSpec,
  queueScorerSpec,
  runningRequestsScorerSpec,
} from "./plugins/scorers/metrics.ts";
import { noHitLruSpec } from "./plugins/scorers/no-hit-lru.ts";
import { prefillWaitSpec } from "./plugins/scorers/prefill-wait.ts";
import { prefixScorerSpec } from "./plugins/scorers/prefix.ts";
import { prefixHomeSpec } from "./plugins/scorers/prefix-home.ts";
import { sessionFilterSpec, sessionScorerSpec } from "./plugins/session.ts";
import type { DataFamily } from "./types.ts";

export class PluginRegistry {
  readonly #specs = new Map<string, PluginSpec>();
  readonly #unimplemented = new Map<string, string>();
  readonly #ignored = new Map<string, string>();
  readonly #defaultProducers: Record<DataFamily, string>;

  constructor(
    specs: readonly PluginSpec[],
    defaultProducers: Record<DataFamily, string>,
    unimplemented: Record<string, string> = {},
    ignored: Record<string, string> = {},
  ) {
    for (const s of specs) {
      if (this.#specs.has(s.type)) throw new Error(`plugin type "${s.type}" registered twice`);
      this.#specs.set(s.type, s);
    }
    for (const [family, type] of Object.entries(defaultProducers)) {
      const s = this.#specs.get(type);
      if (!s?.produces?.includes(family as DataFamily)) {
        throw new Error(`default producer "${type}" for "${family}" is not registered as producing it`);
      }
    }
    this.#defaultProducers = defaultProducers;
    for (const [t, why] of Object.entries(unimplemented)) this.#unimplemented.set(t, why);
    for (const [t, why] of Object.entries(ignored)) this.#ignored.set(t, why);
  }

  /** Why a known llm-d type loads but has no effect in kvgate, if it is one. */
  ignored(type: string): string | undefined {
    return this.#ignored.get(type);
  }

  get(type: string): PluginSpec | undefined {
    return this.#specs.get(type);
  }

  /** Why a known llm-d type is not available in kvgate, if it is one. */
  unimplemented(type: string): string | undefined {
    return this.#unimplemented.get(type);
  }

  /** The producer type auto-added when a required `family` has no producer. */
  defaultProducer(family: DataFamily): string {
    return this.#defaultProducers[family];
  }

  types(): string[] {
    return [...this.#specs.keys()].sort();
  }

  /** Every type name the registry can explain: implemented, not implemented, or ignored. */
  knownTypes(): string[] {
    return [...this.#specs.keys(), ...this.#unimplemented.keys(), ...this.#ignored.keys()];
  }

  specs(): PluginSpec[] {
    return [...this.#specs.values()];
  }
}

export const BUILTIN_SPECS: readonly PluginSpec[] = [
  approxPrefixSpec,
  precisePrefixSpec,
  inflightSpec,
  prefixScorerSpec,
  queueScorerSpec,
  runningRequestsScorerSpec,
  kvCacheScorerSpec,
  loadAwareScorerSpec,
  activeRequestSpec,
  decodeLoadSpec,
  tokenLoadSpec,
  leastRequestSpec,
  kvPressureSpec,
  prefillWaitSpec,
  noHitLruSpec,
  prefixHomeSpec,
  loraAffinitySpec,
  sessionScorerSpec,
  sessionFilterSpec,
  affinityFilterSpec,
  prefillFilterSpec,
  decodeFilterSpec,
  encodeFilterSpec,
  labelSelectorSpec,
  localityFilterSpec,
  maxScorePickerSpec,
  randomPickerSpec,
  weightedRandomPickerSpec,
  roundRobinPickerSpec,
  singleProfileHandlerSpec,
  disaggProfileHandlerSpec,
  prefixPdDeciderSpec,
  alwaysPdDeciderSpec,
  transferCostDeciderSpec,
  utilizationDetectorSpec,
  concurrencyDetectorSpec,
  predictedLatencySpec,
  latencyScorerSpec,
  tierFilterSpec,
  admitterSpec,
  ...FLOW_POLICY_SPECS,
];

/** llm-d plugin types kvgate recognises but does not implement (yet). Older names are in legacy-config.ts. */
export const UNIMPLEMENTED: Readonly<Record<string, string>> = {
  "token-producer": "kvgate tokenizes in the gateway; pass RequestFacts.tokenIds instead",
  "context-length-aware": "context-length-aware routing is not implemented",
  "utilization-filter": "not implemented; utilization-detector can be used as a filter",
  "probabilistic-admitter": "not implemented; kvgate sheds sheddable requests at saturation ≥ 1",
  "data-parallel-profile-handler": "not implemented",
  "header-profile-handler": "not implemented",
  "always-disagg-multimodal-decider": "not implemented",
};

const DATA_LAYER = "kvgate's data layer (metrics scraping) is configured outside EndpointPickerConfig";
const PARSING = "kvgate's gateway parses requests itself";

/** llm-d plugin types that load with a warning and have no effect in kvgate. */
export const IGNORED: Readonly<Record<string, string>> = {
  "metrics-data-source": DATA_LAYER,
  "models-data-source": DATA_LAYER,
  "core-metrics-extractor": DATA_LAYER,
  "openai-parser": PARSING,
  "anthropic-parser": PARSING,
  "vllmhttp-parser": PARSING,
  "vllmgrpc-parser": PARSING,
  "passthrough-parser": PARSING,
  "disagg-headers-handler": "kvgate's gateway writes x-prefiller-host-port from the prefill profile's target",
  "prefill-header-handler": "kvgate's gateway writes x-prefiller-host-port from the prefill profile's target",
  "soft-reflective-ceiling-policy":
    "not implemented; a usageLimitPolicyPluginRef naming it is an error (use static-usage-limit-policy or priority-holdback-policy)",
};

export function builtinRegistry(): PluginRegistry {
  return new PluginRegistry(
    BUILTIN_SPECS,
    {
      "prefix-match-info": "approx-prefix-cache-producer",
      "inflight-load": "inflight-load-producer",
      "latency-prediction-info": "predicted-latency-producer",
    },
    UNIMPLEMENTED,
    IGNORED,
  );
}
