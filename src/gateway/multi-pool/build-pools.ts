/**
 * Building a PoolSet from a pools file: each pool's Gateway (its endpoints, config, options), and for
 * a pool naming an `inferencePool`, its Kubernetes discovery (datalayer/kubernetes/pool.ts, its own
 * watches). On a reload (`previous` given) an unchanged entry keeps its running Gateway and only new
 * or changed entries are built; whatever was built is closed again if any pool fails.
 */
import type { KubeConfig } from "@kubernetes/client-node";
import { createGateway, type Gateway } from "../gateway.ts";
import { type Discovered, type PoolMember, PoolSet, type SharedPoolOptions } from "./pool-set.ts";
import type { PoolDef, PoolsFile } from "./pools-file.ts";

/** How discovered pools reach the Kubernetes API. */
export interface DiscoveryOptions {
  /** Default: KUBECONFIG, ~/.kube/config, then the pod's service account. */
  kubeconfig?: KubeConfig | string;
}

/** Starts the watches of a pool naming an InferencePool. */
async function discover(
  p: PoolsFile["pools"][number],
  opts: DiscoveryOptions,
  log: ((line: string) => void) | undefined,
): Promise<Discovered> {
  const { startKubernetesPool } = await import("../../datalayer/kubernetes/pool.ts");
  const ip = p.inferencePool as NonNullable<typeof p.inferencePool>;
  const kp = startKubernetesPool({
    poolName: ip.name,
    namespace: ip.namespace ?? process.env.NAMESPACE ?? "default",
    group: ip.group,
    kubeconfig: opts.kubeconfig,
    log: log && ((line) => log(`pool ${p.name}: ${line}`)),
  });
  return kp;
}

/** Same entry in the pools file (the entry's config file's content is the pool's own /reload's business). */
const sameDef = (a: PoolDef, b: PoolDef) => JSON.stringify(a) === JSON.stringify(b);

/**
 * Builds every pool's Gateway (not yet scraping: start() does), starting the discovery of pools
 * that name an InferencePool; rejects naming the pool whose file, option or cluster is bad. With
 * `previous` (a reload), a pool whose entry is unchanged keeps its running Gateway, scrapes and
 * indexes included; only new or changed entries are built, and only those are closed on failure.
 */
export async function createPoolSet(
  spec: PoolsFile,
  shared: SharedPoolOptions,
  kube: DiscoveryOptions = {},
  previous?: PoolSet,
): Promise<PoolSet> {
  const members = new Map<string, PoolMember>();
  const builtGateways: Gateway[] = [];
  const discoveries: Discovered[] = [];
  const running = new Set<Gateway>();
  try {
    for (const p of spec.pools) {
      const old = previous?.members.get(p.name);
      if (old && sameDef(old.def, p)) {
        members.set(p.name, old);
        running.add(old.gw);
        continue;
      }
      const named = (err: Error) => Object.assign(err, { message: `pool ${p.name}: ${err.message}` });
      const d = p.inferencePool
        ? await discover(p, kube, shared.log).catch((e: Error) => {
            throw named(e);
          })
        : null;
      if (d) discoveries.push(d);
      const gw = await createGateway(
        {
          ...shared,
          endpoints: p.endpoints,
          endpointsFile: p.endpointsFile,
          configFile: p.configFile,
          poolName: p.name,
          // Routing-state sync is per pool: a shared --nats-subject gets the pool's name appended.
          natsSubject: shared.natsSubject === undefined ? undefined : `${shared.natsSubject}.${p.name}`,
        },
        d?.source,
      ).catch((err: Error) => {
        throw named(err);
      });
      builtGateways.push(gw);
      members.set(p.name, { gw, def: p, discovered: d });
    }
  } catch (err) {
    await Promise.all(builtGateways.map((gw) => gw.close().catch(() => {})));
    await Promise.all(discoveries.map((d) => d.close().catch(() => {})));
    throw err;
  }
  return new PoolSet(spec, members, { seed: shared.seed ?? 1, metrics: previous?.metrics, running });
}
