/**
 * Kubernetes discovery for `kvgate epp --pool-name`: keeps the one InferencePool, the Pods of its
 * namespace, and the InferenceObjectives and InferenceModelRewrites there in sync with the API
 * server (reflector.ts), and turns them into an EndpointSource (Ready matching pods × target
 * ports; a pod that leaves is removed at once, so the data layer drops it from every index) and a
 * PoolResources view. Optionally runs leader election on llm-d-router's Lease. Like llm-d-router,
 * it watches all pods of the namespace and filters by the pool's selector itself, so a selector
 * edit takes effect without re-listing; the pool itself is watched by field selector.
 */
import { CoreV1Api, CustomObjectsApi, KubeConfig, Watch } from "@kubernetes/client-node";
import { EndpointSource } from "../endpoints.ts";
import type { PoolResources } from "../pool-resources.ts";
import { LeaderElector } from "./leader-elector.ts";
import type { LeaseTimings } from "./lease.ts";
import { leaseName } from "./lease.ts";
import {
  type ObjectiveInfo,
  POOL_GROUP_V1,
  POOL_GROUP_V1ALPHA2,
  type PodInfo,
  type PoolInfo,
  parseObjective,
  parsePod,
  parsePool,
  parseRewrite,
  type RewriteInfo,
} from "./objects.ts";
import { type ListResult, Reflector } from "./reflector.ts";
import { endpointsFor, poolResources, sameResources } from "./view.ts";

/** --pool-group values and the InferencePool version served under each. */
export const POOL_VERSIONS: Readonly<Record<string, string>> = {
  [POOL_GROUP_V1]: "v1",
  [POOL_GROUP_V1ALPHA2]: "v1alpha2",
};
/** InferenceObjective / InferenceModelRewrite: llm-d's group first; the legacy one is read only without it. */
const CRD_GROUPS = ["llm-d.ai", POOL_GROUP_V1ALPHA2] as const;

export interface KubernetesPoolOptions {
  poolName: string;
  namespace: string;
  /** --pool-group; default inference.networking.k8s.io (v1), or inference.networking.x-k8s.io (v1alpha2). */
  group?: string;
  /** A KubeConfig, or a kubeconfig path; default KUBECONFIG, ~/.kube/config, then in-cluster. */
  kubeconfig?: KubeConfig | string;
  /** --ha-enable-leader-election; `true` uses llm-d-router's Lease name and client-go's timings. */
  leaderElection?: boolean | { identity?: string; timings?: Partial<LeaseTimings> };
  log?: (line: string) => void;
  /** Retry delays (tests shorten them). */
  retry?: { backoffMs?: { initial: number; max: number }; absentRetryMs?: number };
}

export interface KubernetesPool {
  /** The pool's endpoints; feed it to `new DataLayer(source)`. */
  readonly source: EndpointSource;
  resources(): PoolResources;
  /** Called with the new view after objectives or rewrites changed; returns an unsubscribe. */
  onResources(cb: (r: PoolResources) => void): () => void;
  /** Resolves after the pool was found and the pods were listed (the first full sync). */
  readonly ready: Promise<void>;
  isReady(): boolean;
  /** Always true without leader election. */
  isLeader(): boolean;
  onLeaderChange(cb: (leader: boolean) => void): () => void;
  /** Stops watching, releases the lease, closes the source. */
  close(): Promise<void>;
}

export function loadKubeConfig(kubeconfig?: KubeConfig | string): KubeConfig {
  if (kubeconfig instanceof KubeConfig) return kubeconfig;
  const kc = new KubeConfig();
  if (typeof kubeconfig === "string") kc.loadFromFile(kubeconfig);
  else kc.loadFromDefault();
  const cluster = kc.getCurrentCluster();
  // With nothing configured, client-node falls back to http://localhost:8080, which is never right.
  const fallback =
    !process.env.KUBECONFIG && cluster?.name === "cluster" && cluster.server === "http://localhost:8080";
  if (!cluster || (typeof kubeconfig !== "string" && fallback))
    throw new Error(
      "Kubernetes: no cluster configured; run inside a pod with a service account, or set KUBECONFIG to a kubeconfig file with a current context",
    );
  return kc;
}

export function startKubernetesPool(o: KubernetesPoolOptions): KubernetesPool {
  const group = o.group ?? POOL_GROUP_V1;
  const version = POOL_VERSIONS[group];
  if (!version)
    throw new Error(
      `--pool-group ${JSON.stringify(group)} is not an InferencePool group; use ${Object.keys(POOL_VERSIONS).join(" or ")}`,
    );
  if (!o.poolName) throw new Error("--pool-name is required for Kubernetes discovery");
  const ns = o.namespace || "default";
  const log = o.log ?? ((l: string) => console.error(l));
  const kc = loadKubeConfig(o.kubeconfig);
  const watch = new Watch(kc);
  const core = kc.makeApiClient(CoreV1Api);
  const custom = kc.makeApiClient(CustomObjectsApi);
  const source = EndpointSource.fromList([]);
  const retry = { backoffMs: o.retry?.backoffMs, absentRetryMs: o.retry?.absentRetryMs };

  const customList =
    (g: string, v: string, plural: string, fieldSelector?: string) => async (): Promise<ListResult> => {
      const l = await custom.listNamespacedCustomObject({
        group: g,
        version: v,
        namespace: ns,
        plural,
        fieldSelector,
      });
      return { items: l?.items, resourceVersion: l?.metadata?.resourceVersion ?? "" };
    };
  const reflector = <T>(
    what: string,
    path: string,
    list: () => Promise<ListResult>,
    parse: (obj: unknown) => T,
    onChange: () => void,
    fieldSelector?: string,
  ) => new Reflector<T>({ what, path, list, watch, parse, log, onChange, fieldSelector, ...retry });

  const poolWhat = `InferencePool ${ns}/${o.poolName} (${group}/${version})`;
  let poolMissingLogged = false;
  let lastProblems = new Set<string>();
  let readyResolve: () => void = () => {};
  const ready = new Promise<void>((r) => (readyResolve = r));
  let isReady = false;

  const currentPool = (): PoolInfo | null => {
    for (const p of pools.values()) if (p.meta.name === o.poolName) return p;
    return null;
  };
  const recomputeEndpoints = () => {
    if (!pools.synced || !pods.synced) return;
    const pool = currentPool();
    if (!pool && !poolMissingLogged) {
      log(`kvgate: ${poolWhat} not found; no endpoints until it exists`);
      poolMissingLogged = true;
    } else if (pool) poolMissingLogged = false;
    const { specs, problems } = endpointsFor(pool, pods.values());
    const now = new Set(problems);
    for (const p of now) if (!lastProblems.has(p)) log(`kvgate: ${poolWhat}: ${p}`);
    lastProblems = now;
    source.replace(specs);
    if (pool && !isReady) {
      isReady = true;
      log(
        `kvgate: ${poolWhat} synced: ${specs.length} endpoint(s) from ${pods.size} pod(s) in the namespace`,
      );
      readyResolve();
    }
  };

  const pools = reflector<PoolInfo>(
    poolWhat,
    `/apis/${group}/${version}/namespaces/${ns}/inferencepools`,
    customList(group, version, "inferencepools", `metadata.name=${o.poolName}`),
    (obj) => parsePool(obj, group),
    recomputeEndpoints,
    `metadata.name=${o.poolName}`,
  );
  const pods = reflector<PodInfo>(
    `Pods in namespace ${ns}`,
    `/api/v1/namespaces/${ns}/pods`,
    async () => {
      const l = await core.listNamespacedPod({ namespace: ns });
      return { items: l.items, resourceVersion: l.metadata?.resourceVersion ?? "" };
    },
    parsePod,
    recomputeEndpoints,
  );

  let view: PoolResources = { objectives: new Map(), rewrites: [] };
  const resourceListeners = new Set<(r: PoolResources) => void>();
  /** llm-d's group when its CRD is served; the legacy group's objects only without it. */
  const preferred = <T>(rs: Reflector<T>[]): Iterable<T> =>
    rs.find((r) => r.synced && !r.absent)?.values() ?? [];
  const recomputeResources = () => {
    const next = poolResources(
      preferred<ObjectiveInfo>(objectives),
      preferred<RewriteInfo>(rewrites),
      o.poolName,
      group,
    );
    if (sameResources(view, next)) return;
    view = next;
    for (const cb of resourceListeners) cb(view);
  };
  const objectives = CRD_GROUPS.map((g) =>
    reflector<ObjectiveInfo>(
      `InferenceObjectives (${g}/v1alpha2) in ${ns}`,
      `/apis/${g}/v1alpha2/namespaces/${ns}/inferenceobjectives`,
      customList(g, "v1alpha2", "inferenceobjectives"),
      parseObjective,
      recomputeResources,
    ),
  );
  const rewrites = CRD_GROUPS.map((g) =>
    reflector<RewriteInfo>(
      `InferenceModelRewrites (${g}/v1alpha2) in ${ns}`,
      `/apis/${g}/v1alpha2/namespaces/${ns}/inferencemodelrewrites`,
      customList(g, "v1alpha2", "inferencemodelrewrites"),
      parseRewrite,
      recomputeResources,
    ),
  );

  let elector: LeaderElector | null = null;
  if (o.leaderElection) {
    const le = typeof o.leaderElection === "object" ? o.leaderElection : {};
    elector = new LeaderElector({
      kubeConfig: kc,
      namespace: ns,
      name: leaseName(ns, o.poolName),
      identity: le.identity,
      timings: le.timings,
      log,
    });
  }

  const all: Reflector<unknown>[] = [pools, pods, ...objectives, ...rewrites];
  log(`kvgate: watching ${poolWhat} and its pods on ${kc.getCurrentCluster()?.server}`);
  for (const r of all) r.start();
  elector?.start();

  let closing: Promise<void> | null = null;
  return {
    source,
    resources: () => view,
    onResources(cb) {
      resourceListeners.add(cb);
      return () => resourceListeners.delete(cb);
    },
    ready,
    isReady: () => isReady,
    isLeader: () => (elector ? elector.isLeader() : true),
    onLeaderChange(cb) {
      elector?.on("change", cb);
      return () => elector?.off("change", cb);
    },
    close() {
      closing ??= (async () => {
        await Promise.all([...all.map((r) => r.stop()), elector?.stop()]);
        source.close();
      })();
      return closing;
    },
  };
}
