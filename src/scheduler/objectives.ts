/**
 * InferenceObjective documents (llm-d.ai/v1alpha2, legacy inference.networking.x-k8s.io/v1alpha2,
 * llm-d/llm-d-router@ebab6879 apix/v1alpha2/inferenceobjective_types.go) → objective name → priority. kvgate
 * reads them from extra YAML documents next to
 * the EndpointPickerConfig (separated by `---`), so the same manifests work with llm-d.
 */
import { ConfigError } from "./errors.ts";

export const OBJECTIVE_API_VERSIONS = ["llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2"];

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Validates one InferenceObjective document and returns [name, priority]. */
export function parseObjective(doc: Record<string, unknown>, where: string): [string, number] {
  for (const k of Object.keys(doc)) {
    if (!["apiVersion", "kind", "metadata", "spec"].includes(k)) {
      throw new ConfigError(
        `${where}: unknown key "${k}" in InferenceObjective; allowed: apiVersion, kind, metadata, spec`,
      );
    }
  }
  if (!OBJECTIVE_API_VERSIONS.includes(String(doc.apiVersion))) {
    throw new ConfigError(
      `${where}: InferenceObjective apiVersion must be one of ${OBJECTIVE_API_VERSIONS.join(", ")}; got ${JSON.stringify(doc.apiVersion)}`,
    );
  }
  const meta = doc.metadata;
  if (!isRecord(meta) || typeof meta.name !== "string" || meta.name === "") {
    throw new ConfigError(
      `${where}: InferenceObjective needs metadata.name (the x-llm-d-inference-objective value)`,
    );
  }
  const spec = doc.spec ?? {};
  if (!isRecord(spec))
    throw new ConfigError(`${where}: InferenceObjective "${meta.name}": spec must be a mapping`);
  for (const k of Object.keys(spec)) {
    if (k !== "priority" && k !== "poolRef") {
      throw new ConfigError(
        `${where}: InferenceObjective "${meta.name}": unknown spec key "${k}"; allowed: priority, poolRef`,
      );
    }
  }
  const p = spec.priority ?? 0;
  if (typeof p !== "number" || !Number.isInteger(p)) {
    throw new ConfigError(
      `${where}: InferenceObjective "${meta.name}": spec.priority must be an integer; got ${JSON.stringify(p)}`,
    );
  }
  return [meta.name, p];
}
