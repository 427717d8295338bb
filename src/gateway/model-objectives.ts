/**
 * `--model-objectives FILE`: a per-model default priority for requests that name no objective.
 * YAML map `model: <integer priority | InferenceObjective name>` (optionally under `models:`);
 * names resolve against the InferenceObjective documents of the EndpointPickerConfig. llm-d selects
 * an objective only by the x-llm-d-inference-objective header (llm-d/llm-d-router@ebab6879
 * `pkg/epp/handlers/request.go`); this lets an operator mark a whole model sheddable
 * (priority < 0) without relying on clients.
 */
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";

/** model → priority, or the name of an objective to look up. */
export type ModelObjectives = ReadonlyMap<string, number | string>;

export function parseModelObjectives(text: string, origin: string): ModelObjectives {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new Error(`${origin}: not valid YAML: ${(err as Error).message.split("\n")[0]}`);
  }
  if (doc === null || doc === undefined) return new Map();
  const rec = (v: unknown): v is Record<string, unknown> =>
    typeof v === "object" && v !== null && !Array.isArray(v);
  if (rec(doc) && Object.keys(doc).length === 1 && rec(doc.models)) doc = doc.models;
  if (!rec(doc)) throw new Error(`${origin}: expected a map of model name to priority or objective name`);
  const out = new Map<string, number | string>();
  for (const [model, v] of Object.entries(doc)) {
    if (typeof v === "number" && Number.isInteger(v)) out.set(model, v);
    else if (typeof v === "string" && v !== "") out.set(model, v);
    else throw new Error(`${origin}: ${model}: expected an integer priority or an objective name`);
  }
  return out;
}

export function loadModelObjectives(path: string): ModelObjectives {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new Error(`--model-objectives ${path}: ${(err as Error).message}; check the path`);
  }
  return parseModelObjectives(text, path);
}

/**
 * The request's priority: the objective named by the header if it is a known one, else the
 * model's default, else 0 (llm-d: unknown or absent objective → 0).
 */
export function resolvePriority(
  objectives: ReadonlyMap<string, number>,
  byModel: ModelObjectives,
  model: string,
  objectiveHeader: string | undefined,
): number {
  if (objectiveHeader) {
    const p = objectives.get(objectiveHeader);
    if (p !== undefined) return p;
  }
  const d = byModel.get(model);
  if (typeof d === "number") return d;
  if (typeof d === "string") return objectives.get(d) ?? 0;
  return 0;
}

/**
 * The InferenceObjective priorities a pool decides with when Kubernetes discovery supplies some:
 * the config's (read through `config`, which a reload replaces) with the cluster's winning over
 * same-named ones; undefined (= the config's) when the cluster has none. The merged map is rebuilt
 * only when either side changed.
 */
export function clusterObjectives(
  config: () => ReadonlyMap<string, number>,
  cluster: () => ReadonlyMap<string, number> | undefined,
): () => ReadonlyMap<string, number> | undefined {
  let seen: [unknown, unknown] = [null, null];
  let merged: ReadonlyMap<string, number> | undefined;
  return () => {
    const k8s = cluster();
    if (!k8s || k8s.size === 0) return undefined;
    const c = config();
    if (seen[0] !== c || seen[1] !== k8s) {
      seen = [c, k8s];
      merged = new Map([...c, ...k8s]);
    }
    return merged;
  };
}
