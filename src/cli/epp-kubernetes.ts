/**
 * The one hook between `kvgate epp` and Kubernetes: given the InferencePool to serve, start discovery
 * and return what startEpp plugs in (an EndpointSource kept in step with the pool's Ready pods, the
 * pool's InferenceObjectives and InferenceModelRewrites, leadership and sync state). Kubernetes
 * discovery lives in src/datalayer/kubernetes/; until it is wired here, this says so and how to run
 * without it.
 */
import type { EndpointSource } from "../datalayer/endpoints.ts";
import type { PoolResources } from "../datalayer/pool-resources.ts";

export interface KubernetesPoolOptions {
  poolName: string;
  poolNamespace: string;
  /** inference.networking.k8s.io (v1) or inference.networking.x-k8s.io (v1alpha2). */
  poolGroup: string;
  /** --ha-enable-leader-election: hold a coordination.k8s.io Lease; only the holder reports SERVING. */
  leaderElection: boolean;
}

export interface KubernetesDiscovery {
  source: EndpointSource;
  resources: () => PoolResources;
  isLeader: () => boolean;
  /** True once the pool, its pods and the CRDs have been listed. */
  ready: () => boolean;
  close(): Promise<void>;
}

export async function startKubernetesDiscovery(opts: KubernetesPoolOptions): Promise<KubernetesDiscovery> {
  throw new Error(
    `--pool-name ${opts.poolName}: Kubernetes discovery (src/datalayer/kubernetes) is not wired into this build of kvgate epp; give the replicas with --endpoints host:port,... or --endpoints-file FILE instead`,
  );
}
