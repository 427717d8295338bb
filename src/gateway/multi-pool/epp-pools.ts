/**
 * `kvgate epp --pools`: one ext_proc server (ext-proc/epp.ts) in front of several pools (pool-set.ts,
 * the same pools file, router and per-pool Gateways as `kvgate serve --pools`). Each stream, once its
 * body is decoded, is decided by the pool serving its model after the InferenceModelRewrites: that
 * pool's scheduler, admission and flow control. A model no pool serves is answered by Envoy with
 * the front door's 404 (an ImmediateResponse). Health is SERVING only once every pool's data layer is
 * ready. The metrics port's /metrics carries the front door's families and the ext_proc stream
 * counts; each pool's own metrics (with llm-d's token histograms) and read-only admin routes are
 * under /pools/<name>/, the full admin API on --admin-port. A request kvgate does not decode (no
 * body, or a path it does not parse) goes to a ready endpoint of any pool, at random.
 */
import { createServer, type Server } from "node:http";
import { createRng } from "../../scheduler/rng.ts";
import { GatewayError } from "../errors.ts";
import { type EppBackend, type EppServerOptions, type ExtProcHandle, serveExtProc } from "../ext-proc/epp.ts";
import { first } from "../ext-proc/messages.ts";
import { EppStreamMetrics, EppTokenMetrics } from "../ext-proc/metrics.ts";
import { randomReady } from "../ext-proc/request-answer.ts";
import type { Gateway } from "../gateway.ts";
import { createPoolSet, type DiscoveryOptions } from "./build-pools.ts";
import { LivePools } from "./live-pools.ts";
import type { SharedPoolOptions } from "./pool-set.ts";
import { loadPoolsFile, type PoolsFile, PoolsFileError } from "./pools-file.ts";

export type MultiPoolEppOptions = SharedPoolOptions &
  EppServerOptions &
  DiscoveryOptions & {
    /** Path of the pools file (pools-file.ts); exclusive with `poolsSpec`. */
    poolsFile?: string;
    /** An already parsed pools file (tests). */
    poolsSpec?: PoolsFile;
  };

export interface MultiPoolEppHandle extends ExtProcHandle {
  /** The pools file, live: `live.current` is the PoolSet serving now. */
  live: LivePools;
}

/** What kvgate epp cannot honour in a pools file; a PoolsFileError saying what to change. */
function checkForEpp(spec: PoolsFile): void {
  const t = spec.trustedHeader;
  if (t?.sources)
    throw new PoolsFileError(
      `trustedHeader.trustedSources: kvgate epp does not see the client's address (the proxy does), so it cannot check ${t.name}'s source; drop trustedSources and have the proxy remove ${t.name} from requests it does not trust (Envoy: request_headers_to_remove on the public listener's route)`,
    );
}

/** Builds the pools, then serves ext_proc; rejects with a message naming the bad file, pool or flag. */
export async function startMultiPoolEpp(opts: MultiPoolEppOptions): Promise<MultiPoolEppHandle> {
  const spec = opts.poolsSpec ?? loadPoolsFile(opts.poolsFile as string);
  checkForEpp(spec);
  const { poolsFile, poolsSpec: _s, kubeconfig, ...shared } = opts;
  const { backend, ...h } = await serveExtProc(opts, async () => {
    const set = await createPoolSet(spec, shared, { kubeconfig });
    const live = new LivePools(set, poolsFile ?? null, { shared, kube: { kubeconfig }, check: checkForEpp });
    return poolsBackend(live, shared);
  });
  return { ...h, live: backend.live };
}

function poolsBackend(live: LivePools, shared: SharedPoolOptions): EppBackend & { live: LivePools } {
  const tokens = new WeakMap<Gateway, EppTokenMetrics>();
  const tokensOf = (gw: Gateway) => {
    let t = tokens.get(gw);
    if (!t) tokens.set(gw, (t = new EppTokenMetrics(gw.metrics.registry)));
    return t;
  };
  for (const gw of live.current.pools.values()) tokensOf(gw);
  const rng = createRng(shared.seed ?? 1);
  const log = shared.log ?? ((l: string) => console.error(l));
  const admin: Server = createServer((req, res) => live.handleAdmin(req, res));
  return {
    live,
    ctx: {
      metrics: new EppStreamMetrics(live.current.metrics.registry),
      rng,
      maxBodyBytes: shared.maxBodyBytes ?? 16 * 1024 * 1024,
      strip: () => {
        const t = live.current.trusted;
        return t ? [t.name] : [];
      },
      target: (parsed, headers) => {
        const set = live.current;
        const selected = set.trusted ? first(headers, set.trusted.name) : undefined;
        const chosen = set.choose(parsed, selected ? selected : null);
        if (chosen instanceof GatewayError) return chosen;
        const gw = chosen.pool;
        return { gw, tokens: tokensOf(gw), rewrite: chosen.rewrite, objectives: set.objectivesOf(gw) };
      },
      anyReady: (subset) => randomReady(live.current.pools.values(), subset, rng),
      log,
    },
    ready: () => live.current.ready(),
    metricsGet: (req, res) => live.handleAdmin(req, res, true),
    adminServer: admin,
    drainTimeoutMs: shared.drainTimeoutMs ?? 30_000,
    start: () => live.start(),
    close: async () => {
      await live.close();
      await new Promise<void>((r) => {
        admin.close(() => r());
        admin.closeAllConnections();
      });
    },
  };
}
