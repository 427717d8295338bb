/**
 * The few fields kvgate reads from Kubernetes objects, parsed from the API server's JSON (a list
 * item or a watch event's object) into small typed records. Shapes follow the upstream types:
 * Pod (core/v1), InferencePool (`inference.networking.k8s.io/v1`, gateway-api-inference-extension
 * `api/v1/inferencepool_types.go`, and the legacy `inference.networking.x-k8s.io/v1alpha2`),
 * InferenceObjective and InferenceModelRewrite (llm-d/llm-d-router `apix/v1alpha2`). A malformed
 * object throws KubeObjectError naming the object and the field, so the caller can log and skip it.
 */

export class KubeObjectError extends Error {
  override name = "KubeObjectError";
}

export type Json = Record<string, unknown>;

export function isRecord(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export interface ObjectMeta {
  name: string;
  namespace: string;
  resourceVersion: string;
  labels: Record<string, string>;
  annotations: Record<string, string>;
  deleting: boolean;
  /** ms since the epoch; NaN when absent. */
  createdAtMs: number;
}

/** metadata of any object; throws when there is no name. */
export function parseMeta(obj: unknown, kind: string): ObjectMeta {
  if (!isRecord(obj) || !isRecord(obj.metadata))
    throw new KubeObjectError(`${kind} without metadata: ${preview(obj)}`);
  const m = obj.metadata;
  if (typeof m.name !== "string" || m.name === "")
    throw new KubeObjectError(`${kind} without metadata.name: ${preview(obj)}`);
  const where = `${kind} ${m.name}`;
  return {
    name: m.name,
    namespace: typeof m.namespace === "string" ? m.namespace : "",
    resourceVersion: typeof m.resourceVersion === "string" ? m.resourceVersion : "",
    labels: stringMap(m.labels, `${where}: metadata.labels`),
    annotations: stringMap(m.annotations, `${where}: metadata.annotations`),
    // The list API hands back Date objects where a watch hands back strings; either means "set".
    deleting: m.deletionTimestamp !== undefined && m.deletionTimestamp !== null,
    createdAtMs: timestampMs(m.creationTimestamp),
  };
}

function timestampMs(v: unknown): number {
  if (v instanceof Date) return v.getTime();
  if (typeof v === "string") return Date.parse(v);
  return Number.NaN;
}

export function stringMap(v: unknown, where: string): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (!isRecord(v)) throw new KubeObjectError(`${where}: expected a map of string to string`);
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== "string") throw new KubeObjectError(`${where}.${k}: value must be a string`);
    out[k] = val;
  }
  return out;
}

function preview(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

export interface PodInfo {
  meta: ObjectMeta;
  /** status.podIP, or "" before the pod has one. */
  podIP: string;
  /** Condition Ready=True. */
  ready: boolean;
}

export function parsePod(obj: unknown): PodInfo {
  const meta = parseMeta(obj, "Pod");
  const status = (obj as Json).status;
  let podIP = "";
  let ready = false;
  if (isRecord(status)) {
    if (typeof status.podIP === "string") podIP = status.podIP;
    if (status.conditions !== undefined && !Array.isArray(status.conditions))
      throw new KubeObjectError(`Pod ${meta.name}: status.conditions must be a list`);
    for (const c of (status.conditions as unknown[] | undefined) ?? [])
      if (isRecord(c) && c.type === "Ready") ready = c.status === "True";
  }
  return { meta, podIP, ready };
}

/** What a pool says about its endpoints, whichever API version it came from. */
export interface PoolInfo {
  meta: ObjectMeta;
  /** Equality selector: every label must match. Never empty. */
  matchLabels: Record<string, string>;
  /** One endpoint per port per pod (data-parallel ranks); distinct, in spec order. */
  targetPorts: number[];
}

export const POOL_GROUP_V1 = "inference.networking.k8s.io";
export const POOL_GROUP_V1ALPHA2 = "inference.networking.x-k8s.io";

function port(v: unknown, where: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > 65535)
    throw new KubeObjectError(`${where}: must be an integer in [1, 65535], got ${preview(v)}`);
  return v;
}

/** Parses an InferencePool of the given group (v1 for POOL_GROUP_V1, v1alpha2 for the legacy one). */
export function parsePool(obj: unknown, group: string): PoolInfo {
  const meta = parseMeta(obj, "InferencePool");
  const where = `InferencePool ${meta.name}`;
  const spec = (obj as Json).spec;
  if (!isRecord(spec)) throw new KubeObjectError(`${where}: spec is required`);
  let matchLabels: Record<string, string>;
  let targetPorts: number[];
  const v1Shape = isRecord(spec.selector) && isRecord(spec.selector.matchLabels);
  if (group === POOL_GROUP_V1ALPHA2 && v1Shape)
    throw new KubeObjectError(
      `${where}: has the v1 shape (selector.matchLabels); use --pool-group ${POOL_GROUP_V1}`,
    );
  if (group !== POOL_GROUP_V1ALPHA2 && spec.targetPortNumber !== undefined)
    throw new KubeObjectError(
      `${where}: has the v1alpha2 shape (targetPortNumber); use --pool-group ${POOL_GROUP_V1ALPHA2}`,
    );
  if (group === POOL_GROUP_V1ALPHA2) {
    matchLabels = stringMap(spec.selector, `${where}: spec.selector`);
    targetPorts = [port(spec.targetPortNumber, `${where}: spec.targetPortNumber`)];
  } else {
    if (!isRecord(spec.selector)) throw new KubeObjectError(`${where}: spec.selector is required`);
    matchLabels = stringMap(spec.selector.matchLabels, `${where}: spec.selector.matchLabels`);
    if (!Array.isArray(spec.targetPorts) || spec.targetPorts.length === 0)
      throw new KubeObjectError(`${where}: spec.targetPorts needs at least one {number}`);
    targetPorts = spec.targetPorts.map((p, i) =>
      port(isRecord(p) ? p.number : p, `${where}: spec.targetPorts[${i}].number`),
    );
    if (new Set(targetPorts).size !== targetPorts.length)
      throw new KubeObjectError(`${where}: spec.targetPorts has a port twice (${targetPorts.join(",")})`);
  }
  // An empty selector would select every pod in the namespace; the CRD forbids it (MinProperties=1).
  if (Object.keys(matchLabels).length === 0)
    throw new KubeObjectError(`${where}: the selector needs at least one label`);
  return { meta, matchLabels, targetPorts };
}

/** spec.poolRef of an objective or rewrite: name plus group (absent = not stated). */
export interface PoolRef {
  name: string;
  group: string | null;
}

function parsePoolRef(v: unknown, where: string): PoolRef {
  if (!isRecord(v) || typeof v.name !== "string" || v.name === "")
    throw new KubeObjectError(`${where}: spec.poolRef.name is required`);
  const group = typeof v.group === "string" && v.group !== "" ? v.group : null;
  if (v.kind !== undefined && v.kind !== "" && v.kind !== "InferencePool")
    throw new KubeObjectError(`${where}: spec.poolRef.kind must be InferencePool, got ${preview(v.kind)}`);
  return { name: v.name, group };
}

export interface ObjectiveInfo {
  meta: ObjectMeta;
  /** spec.priority; unset = 0 (as the API defines it). */
  priority: number;
  poolRef: PoolRef;
}

export function parseObjective(obj: unknown): ObjectiveInfo {
  const meta = parseMeta(obj, "InferenceObjective");
  const where = `InferenceObjective ${meta.name}`;
  const spec = (obj as Json).spec;
  if (!isRecord(spec)) throw new KubeObjectError(`${where}: spec is required`);
  let priority = 0;
  if (spec.priority !== undefined && spec.priority !== null) {
    if (typeof spec.priority !== "number" || !Number.isInteger(spec.priority))
      throw new KubeObjectError(`${where}: spec.priority must be an integer, got ${preview(spec.priority)}`);
    priority = spec.priority;
  }
  return { meta, priority, poolRef: parsePoolRef(spec.poolRef, where) };
}

export interface RewriteInfo {
  meta: ObjectMeta;
  poolRef: PoolRef;
  rules: Array<{ matches: string[]; targets: Array<{ model: string; weight: number | null }> }>;
}

export function parseRewrite(obj: unknown): RewriteInfo {
  const meta = parseMeta(obj, "InferenceModelRewrite");
  const where = `InferenceModelRewrite ${meta.name}`;
  const spec = (obj as Json).spec;
  if (!isRecord(spec)) throw new KubeObjectError(`${where}: spec is required`);
  const poolRef = parsePoolRef(spec.poolRef, where);
  if (!Array.isArray(spec.rules)) throw new KubeObjectError(`${where}: spec.rules must be a list`);
  const rules = spec.rules.map((r, i) => {
    const at = `${where}: spec.rules[${i}]`;
    if (!isRecord(r)) throw new KubeObjectError(`${at}: expected {matches, targets}`);
    const rawMatches = r.matches ?? [];
    if (!Array.isArray(rawMatches)) throw new KubeObjectError(`${at}.matches must be a list`);
    const matches = rawMatches.map((m, j) => {
      const model = isRecord(m) ? m.model : undefined;
      if (!isRecord(model) || typeof model.value !== "string" || model.value === "")
        throw new KubeObjectError(`${at}.matches[${j}].model.value is required`);
      // Exact is the only match type the API defines; reading another as Exact would misroute.
      if (model.type !== undefined && model.type !== null && model.type !== "Exact")
        throw new KubeObjectError(`${at}.matches[${j}].model.type must be Exact, got ${preview(model.type)}`);
      return model.value;
    });
    if (!Array.isArray(r.targets) || r.targets.length === 0)
      throw new KubeObjectError(`${at}.targets needs at least one {modelRewrite, weight?}`);
    const targets = r.targets.map((t, j) => {
      if (!isRecord(t) || typeof t.modelRewrite !== "string" || t.modelRewrite === "")
        throw new KubeObjectError(`${at}.targets[${j}].modelRewrite is required`);
      let weight: number | null = null;
      if (t.weight !== undefined && t.weight !== null) {
        if (
          typeof t.weight !== "number" ||
          !Number.isInteger(t.weight) ||
          t.weight < 1 ||
          t.weight > 1_000_000
        )
          throw new KubeObjectError(`${at}.targets[${j}].weight must be an integer in [1, 1000000]`);
        weight = t.weight;
      }
      return { model: t.modelRewrite, weight };
    });
    const weighted = targets.filter((t) => t.weight !== null).length;
    if (weighted !== 0 && weighted !== targets.length)
      throw new KubeObjectError(`${at}.targets: set a weight on every target or on none`);
    return { matches, targets };
  });
  return { meta, poolRef, rules };
}
