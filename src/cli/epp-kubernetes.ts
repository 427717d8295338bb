/**
 * The one hook between `kvgate epp` and Kubernetes: given the InferencePool to serve, start
 * discovery (src/datalayer/kubernetes/pool.ts: the pool, its Ready pods × target ports, the
 * namespace's InferenceObjectives and InferenceModelRewrites, optionally the leader Lease) and hand
 * startEpp what it plugs in: the EndpointSource kept in step with the pods, the resources view, and
 * the leadership and sync state that gate gRPC health.
 */
import type { KubeConfig } from "@kubernetes/client-node";
import type { EndpointSource } from "../datalayer/endpoints.ts";
import type { PoolResources } from "../datalayer/pool-resources.ts";

export interface KubernetesPoolOptions {
  poolName: string;
  poolNamespace: string;
  /** inference.networking.k8s.io (v1) or inference.networking.x-k8s.io (v1alpha2). */
  poolGroup: string;
  /** --ha-enable-leader-election: hold llm-d's coordination.k8s.io Lease; only the holder reports SERVING. */
  leaderElection: boolean;
  /** Default: KUBECONFIG, ~/.kube/config, then the pod's service account. */
  kubeconfig?: KubeConfig | string;
  log?: (line: string) => void;
}

export interface KubernetesDiscovery {
  source: EndpointSource;
  resources: () => PoolResources;
  isLeader: () => boolean;
  /** True once the pool and its pods have been listed (llm-d: the datastore has synced). */
  ready: () => boolean;
  close(): Promise<void>;
}

/** Starts discovery; a missing cluster configuration or a bad --pool-group is an error saying what to set. */
export async function startKubernetesDiscovery(opts: KubernetesPoolOptions): Promise<KubernetesDiscovery> {
  const { startKubernetesPool } = await import("../datalayer/kubernetes/pool.ts");
  const pool = startKubernetesPool({
    poolName: opts.poolName,
    namespace: opts.poolNamespace,
    group: opts.poolGroup,
    leaderElection: opts.leaderElection,
    kubeconfig: opts.kubeconfig,
    log: opts.log,
  });
  return {
    source: pool.source,
    resources: () => pool.resources(),
    isLeader: () => pool.isLeader(),
    ready: () => pool.isReady(),
    close: () => pool.close(),
  };
}
