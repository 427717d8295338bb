/**
 * Admission (llm-d's LegacyAdmissionController, llm-d/llm-d-router@ebab6879
 * `pkg/epp/requestcontrol/admission.go`): a sheddable request (priority < 0) is
 * rejected with 429 when pool saturation ≥ 1.0; others are always admitted and queue in the model
 * servers. Priorities come from InferenceObjective documents: the gateway maps the
 * x-llm-d-inference-objective header (alias x-gateway-inference-objective) to a priority with
 * priorityOf(); an unknown or absent objective has priority 0.
 */
import type { EffectiveConfig } from "../scheduler/defaults.ts";
import type { EndpointState, RequestFacts } from "../scheduler/types.ts";
import type { UtilizationParams } from "./utilization-detector.ts";
import { UTILIZATION_DETECTOR_TYPE, UtilizationDetector } from "./utilization-detector.ts";

export type AdmissionResult =
  | { admitted: true /** Computed only for sheddable requests. */; saturation?: number }
  | { admitted: false; status: 429; reason: "rejected-saturated"; message: string; saturation: number };

/** Objective name → priority (InferenceObjective spec.priority; higher is more important). */
export type Objectives = ReadonlyMap<string, number>;

export function priorityOf(objectives: Objectives, objective: string | undefined): number {
  if (objective === undefined || objective === "") return 0;
  return objectives.get(objective) ?? 0;
}

export function isSheddable(priority: number): boolean {
  return priority < 0;
}

export class Admission {
  constructor(readonly detector: UtilizationDetector = new UtilizationDetector()) {}

  admit(req: RequestFacts, candidates: readonly EndpointState[], now: number): AdmissionResult {
    if (!isSheddable(req.priority)) return { admitted: true };
    const saturation = this.detector.saturation(candidates, now);
    if (saturation < 1) return { admitted: true, saturation };
    return {
      admitted: false,
      status: 429,
      reason: "rejected-saturated",
      message:
        "system saturated, sheddable request dropped; retry with backoff, or send it under an objective with priority ≥ 0 (name its InferenceObjective in the x-llm-d-inference-objective header)",
      saturation,
    };
  }
}

/** Admission and objective priorities as configured (the effective config's saturation detector). */
export function admissionFromConfig(config: EffectiveConfig): {
  admission: Admission;
  objectives: Objectives;
} {
  const d = config.plugins.find((p) => p.name === config.saturationDetector);
  if (d === undefined || d.type !== UTILIZATION_DETECTOR_TYPE) {
    throw new Error(
      `saturation detector "${config.saturationDetector}" is a ${d?.type ?? "missing plugin"}: here (the simulator, legacy admission) only ${UTILIZATION_DETECTOR_TYPE} is implemented; use it, or run the config with kvgate serve / kvgate epp`,
    );
  }
  const detector = new UtilizationDetector(d.name, d.parameters as Partial<UtilizationParams>);
  return { admission: new Admission(detector), objectives: new Map(Object.entries(config.objectives)) };
}
