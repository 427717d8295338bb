/**
 * Pure functions from the cached Kubernetes objects to what the router uses: the pool's endpoints
 * (Ready pods matching the selector × target ports, as llm-d-router's datastore builds them) and
 * the PoolResources view (objective priorities, model rewrites). Recomputed from the whole cache on
 * every change, so any order of events ends in the same set.
 */
import { type EndpointSpec, parseHostPort } from "../endpoints.ts";
import type { ModelRewrite, PoolResources } from "../pool-resources.ts";
import type { ObjectiveInfo, PodInfo, PoolInfo, PoolRef, RewriteInfo } from "./objects.ts";

/** The pod annotation that narrows a pod's ports to a subset of the pool's (llm-d-router datastore). */
export const ACTIVE_PORTS_ANNOTATION = "llm-d.ai/active-ports";
/** Its deprecated name from the Gateway API Inference Extension, read when the new one is absent. */
export const LEGACY_ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports";

export function selectorMatches(
  matchLabels: Record<string, string>,
  labels: Record<string, string>,
): boolean {
  for (const [k, v] of Object.entries(matchLabels)) if (labels[k] !== v) return false;
  return true;
}

/** Routable: condition Ready=True, not being deleted, and has an IP. */
export function podIsRoutable(pod: PodInfo): boolean {
  return pod.ready && !pod.meta.deleting && pod.podIP !== "";
}

/** The pool's ports this pod serves: all of them, or those its active-ports annotation lists. */
export function activePorts(pod: PodInfo, targetPorts: readonly number[]): number[] {
  const a = pod.meta.annotations;
  const text = a[ACTIVE_PORTS_ANNOTATION] ?? a[LEGACY_ACTIVE_PORTS_ANNOTATION];
  if (text === undefined) return [...targetPorts];
  const listed = new Set(
    text
      .split(",")
      .map((s) => s.trim())
      .filter((s) => /^\d+$/.test(s))
      .map(Number),
  );
  return targetPorts.filter((p) => listed.has(p));
}

export interface EndpointsResult {
  specs: EndpointSpec[];
  /** One line per pod that matched but could not be turned into an endpoint (bad IP, duplicate). */
  problems: string[];
}

/**
 * Every routable pod that the selector matches, once per active target port, ordered by pod name
 * then port order. The id is endpoints.ts's `host:port` (`[v6]:port`); labels are the pod's.
 */
export function endpointsFor(pool: PoolInfo | null, pods: Iterable<PodInfo>): EndpointsResult {
  const out: EndpointsResult = { specs: [], problems: [] };
  if (!pool) return out;
  const selected = [...pods]
    .filter((p) => podIsRoutable(p) && selectorMatches(pool.matchLabels, p.meta.labels))
    .sort((a, b) => (a.meta.name < b.meta.name ? -1 : a.meta.name > b.meta.name ? 1 : 0));
  const seen = new Map<string, string>();
  for (const pod of selected) {
    for (const p of activePorts(pod, pool.targetPorts)) {
      const address = pod.podIP.includes(":") ? `[${pod.podIP}]:${p}` : `${pod.podIP}:${p}`;
      let hp: { host: string; port: number; id: string };
      try {
        hp = parseHostPort(address, `Pod ${pod.meta.name}: status.podIP`);
      } catch (err) {
        out.problems.push((err as Error).message);
        continue;
      }
      const other = seen.get(hp.id);
      if (other !== undefined) {
        out.problems.push(`Pod ${pod.meta.name}: ${hp.id} is also pod ${other}'s address; kept ${other}`);
        continue;
      }
      seen.set(hp.id, pod.meta.name);
      out.specs.push({
        id: hp.id,
        host: hp.host,
        port: hp.port,
        labels: { ...pod.meta.labels },
        kvEvents: null,
      });
    }
  }
  return out;
}

/** The pool an objective or rewrite points at: same name, and same group when it states one. */
export function refersTo(ref: PoolRef, poolName: string, poolGroup: string): boolean {
  return ref.name === poolName && (ref.group === null || ref.group === poolGroup);
}

export function poolResources(
  objectives: Iterable<ObjectiveInfo>,
  rewrites: Iterable<RewriteInfo>,
  poolName: string,
  poolGroup: string,
): PoolResources {
  const prio = new Map<string, number>();
  const sortedObjectives = [...objectives]
    .filter((o) => !o.meta.deleting && refersTo(o.poolRef, poolName, poolGroup))
    .sort((a, b) => (a.meta.name < b.meta.name ? -1 : 1));
  for (const o of sortedObjectives) prio.set(o.meta.name, o.priority);
  const rw: ModelRewrite[] = [...rewrites]
    .filter((r) => !r.meta.deleting && refersTo(r.poolRef, poolName, poolGroup))
    .map((r) => ({
      name: r.meta.name,
      createdAtMs: Number.isFinite(r.meta.createdAtMs) ? r.meta.createdAtMs : 0,
      rules: r.rules.map((rule) => ({
        matches: [...rule.matches],
        targets: rule.targets.map((t) => ({ model: t.model, weight: t.weight })),
      })),
    }))
    // Oldest first (the precedence across resources), then name for a stable order.
    .sort((a, b) => a.createdAtMs - b.createdAtMs || (a.name < b.name ? -1 : 1));
  return { objectives: prio, rewrites: rw };
}

/** Structural equality of two views, to emit a change only when something changed. */
export function sameResources(a: PoolResources, b: PoolResources): boolean {
  return (
    JSON.stringify([...a.objectives]) === JSON.stringify([...b.objectives]) &&
    JSON.stringify(a.rewrites) === JSON.stringify(b.rewrites)
  );
}
