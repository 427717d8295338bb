/**
 * Several pools behind one front, shared by `kvgate serve --pools` (front.ts, an HTTP front door) and
 * `kvgate epp --pools` (epp-pools.ts, an ext_proc server): each pool a full Gateway of its own
 * (endpoints, scraping, EndpointPickerConfig, admission, flow control, metrics) built without a
 * listener; the PoolRouter mapping a request's model (or a trusted header's value) through the
 * InferenceModelRewrites to the pool serving it; the front's own metrics; and the admin routes: GET
 * /pools, GET /metrics (the front's families) and each pool's admin API under /pools/<name>/.
 *
 * A pool naming an `inferencePool` is discovered (build-pools.ts) as `kvgate epp --pool-name`
 * discovers its one pool, each with its own watches: its Ready pods are its endpoints, its
 * InferenceObjectives set its priorities, and its InferenceModelRewrites (poolRef = that pool) apply
 * inside it once the file's rewrites have chosen it, as the pool's own EPP would apply them; a model
 * one of them rewrites counts as served by that pool. It is ready once its first sync is done.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { unknownModelMessage } from "../../datalayer/datastore.ts";
import type { EndpointSource } from "../../datalayer/endpoints.ts";
import type { PoolResources } from "../../datalayer/pool-resources.ts";
import { createRng } from "../../scheduler/rng.ts";
import { handleAdmin } from "../admin.ts";
import { GatewayError, sendError } from "../errors.ts";
import { type Gateway, type GatewayOptions, startDataLayer } from "../gateway.ts";
import { clusterObjectives } from "../model-objectives.ts";
import { type RewriteDecision, resolveModelRewrite } from "../model-rewrite.ts";
import type { ParsedRequest } from "../request-body.ts";
import { servedModelCards } from "../server.ts";
import { FrontMetrics } from "./front-metrics.ts";
import { PoolRouter, type RoutedPool } from "./pool-router.ts";
import type { PoolDef, PoolsFile, TrustedHeader } from "./pools-file.ts";

/** What every pool's Gateway shares: the front's options minus what the pools file gives per pool. */
export type SharedPoolOptions = Omit<GatewayOptions, "endpoints" | "endpointsFile" | "config" | "configFile">;

/** A pool's Kubernetes discovery, as pool-set needs it. */
export interface Discovered {
  readonly source: EndpointSource;
  resources(): PoolResources;
  isReady(): boolean;
  close(): Promise<void>;
}

interface PoolExtras {
  readonly discovered: Discovered;
  readonly objectives: () => ReadonlyMap<string, number> | undefined;
}

/** One pool of a set: its Gateway, the pools-file entry it was built from, its discovery if any. */
export interface PoolMember {
  readonly gw: Gateway;
  readonly def: PoolDef;
  readonly discovered: Discovered | null;
}

/** A model card of GET /v1/models. */
export interface ModelCard {
  id: string;
  object?: string;
  owned_by?: string;
  [k: string]: unknown;
}

export class PoolSet {
  readonly pools: ReadonlyMap<string, Gateway>;
  readonly router: PoolRouter<Gateway>;
  readonly trusted: TrustedHeader | null;
  readonly metrics: FrontMetrics;
  readonly members: ReadonlyMap<string, PoolMember>;
  /** Gateways start() has yet to start (those a reload reused are running already). */
  readonly #fresh: Set<Gateway>;
  readonly #rng: () => number;
  readonly #declared: ReadonlyMap<Gateway, readonly string[] | null>;
  readonly #forget: NodeJS.Timeout;
  readonly #k8s = new Map<Gateway, PoolExtras>();
  #closed: Promise<void> | null = null;

  constructor(
    spec: PoolsFile,
    members: ReadonlyMap<string, PoolMember>,
    opts: { seed?: number; metrics?: FrontMetrics; running?: ReadonlySet<Gateway> } = {},
  ) {
    this.members = members;
    this.pools = new Map([...members].map(([name, m]) => [name, m.gw]));
    const pools = this.pools;
    this.metrics = opts.metrics ?? new FrontMetrics();
    this.#fresh = new Set([...pools.values()].filter((gw) => !opts.running?.has(gw)));
    for (const { gw, discovered: d } of members.values()) {
      if (!d) continue;
      const objectives = clusterObjectives(
        () => gw.routing.objectives,
        () => d.resources().objectives,
      );
      this.#k8s.set(gw, { discovered: d, objectives });
    }
    const entries = spec.pools.map((p) => ({
      name: p.name,
      pool: pools.get(p.name) as Gateway,
      models: p.models,
    }));
    this.#declared = new Map(entries.map((e) => [e.pool, e.models]));
    this.router = new PoolRouter(
      entries,
      spec.rewrites,
      (gw, model) =>
        gw.data.store.all().some((r) => r.modelIds?.has(model) === true) ||
        (this.#k8s
          .get(gw)
          ?.discovered.resources()
          .rewrites.some((rw) => rw.rules.some((rule) => rule.matches.includes(model))) ??
          false),
    );
    this.#forget = setInterval(() => this.router.forgetLearned(), 1000);
    this.#forget.unref();
    this.trusted = spec.trustedHeader;
    const rng = createRng(opts.seed ?? 1);
    this.#rng = () => rng.next();
  }

  /** Served model names: each pool's declared models, or what its replicas list. */
  servedModels(): string[] {
    const out = new Set<string>();
    for (const gw of this.pools.values()) {
      const declared = this.#declared.get(gw);
      if (declared) for (const m of declared) out.add(m);
      else for (const r of gw.data.store.all()) for (const m of r.modelIds ?? []) out.add(m);
    }
    return [...out].sort();
  }

  /**
   * model (or `selected`, the trusted header's value when the request may use it) → rewrite → pool;
   * a GatewayError (404 listing the served models, or 400 for an unknown pool name) when nothing
   * serves it. Counted in the front's metrics either way.
   */
  choose(parsed: ParsedRequest, selected: string | null): RoutedPool<Gateway> | GatewayError {
    let r = this.#choose(parsed, selected);
    if (!(r instanceof GatewayError)) r = this.#poolRewrite(r, parsed.model);
    if (r instanceof GatewayError)
      this.metrics.reject(r.status, r.status === 404 ? "unknown-model" : "bad-selection");
    else this.metrics.routed.inc({ pool: r.pool.opts.poolName });
    return r;
  }

  /** The chosen pool's own InferenceModelRewrites (from its cluster) applied to the model it got. */
  #poolRewrite(r: RoutedPool<Gateway>, clientModel: string): RoutedPool<Gateway> {
    const rewrites = this.#k8s.get(r.pool)?.discovered.resources().rewrites;
    if (!rewrites?.length) return r;
    const local = resolveModelRewrite(rewrites, r.model, this.#rng);
    if (!local) return r;
    const rewrite: RewriteDecision = {
      rewriteName: local.rewriteName,
      model: clientModel,
      target: local.target,
    };
    return { pool: r.pool, model: local.target, rewrite };
  }

  /** The pool's InferenceObjective priorities when its cluster has some; undefined = its config's. */
  objectivesOf(gw: Gateway): ReadonlyMap<string, number> | undefined {
    return this.#k8s.get(gw)?.objectives();
  }

  #choose(parsed: ParsedRequest, selected: string | null): RoutedPool<Gateway> | GatewayError {
    if (selected !== null && this.trusted?.selects === "pool") {
      const pool = this.router.byName(selected);
      if (!pool)
        return new GatewayError(
          400,
          `${this.trusted.name} names pool ${JSON.stringify(selected)}, which is not configured; pools: ${[...this.pools.keys()].join(", ")}`,
        );
      const rewrite = this.router.rewrite(parsed.model, this.#rng);
      return { pool, model: rewrite?.target ?? parsed.model, rewrite };
    }
    const asked = selected ?? parsed.model;
    const routed = this.router.route(asked, this.#rng);
    if (routed) {
      if (selected === null || selected === parsed.model) return routed;
      // The header chose the model: the body's model is rewritten to what is sent.
      return {
        ...routed,
        rewrite: {
          rewriteName: routed.rewrite?.rewriteName ?? `header:${this.trusted?.name}`,
          model: parsed.model,
          target: routed.model,
        },
      };
    }
    const known = [...this.servedModels(), ...this.router.rewriteSources()];
    return new GatewayError(404, unknownModelMessage(asked, known), { param: "model" });
  }

  /** GET /v1/models: the union over the pools (replica cards, or minimal cards for declared models) plus rewrite sources. */
  async modelCards(): Promise<ModelCard[]> {
    const seen = new Set<string>();
    const data: ModelCard[] = [];
    const add = (c: ModelCard) => {
      if (seen.has(c.id)) return;
      seen.add(c.id);
      data.push(c);
    };
    const lists = await Promise.all([...this.pools.values()].map((gw) => servedModelCards(gw)));
    let i = 0;
    for (const gw of this.pools.values()) {
      const cards = lists[i++] as ModelCard[];
      const declared = this.#declared.get(gw);
      if (!declared) for (const c of cards) add(c);
      else
        for (const m of declared)
          add(cards.find((c) => c.id === m) ?? { id: m, object: "model", owned_by: "kvgate" });
    }
    for (const m of this.router.rewriteSources()) add({ id: m, object: "model", owned_by: "kvgate" });
    return data;
  }

  /** The admin routes; `getOnly` answers anything but GET with 405 (the epp's metrics port). */
  handleAdmin(req: IncomingMessage, res: ServerResponse, getOnly = false): void {
    const path = (req.url ?? "/").split("?")[0];
    if (getOnly && req.method !== "GET") {
      req.resume();
      sendError(
        res,
        new GatewayError(
          405,
          `${req.method} ${path} is not served on the metrics port; start kvgate epp with --admin-port for POST routes such as /pools/<name>/reload`,
          { headers: { allow: "GET" } },
        ),
      );
      return;
    }
    if (path === "/metrics" && req.method === "GET") {
      void this.metrics
        .text()
        .then((t) => res.writeHead(200, { "content-type": this.metrics.registry.contentType }).end(t));
      return;
    }
    if (path === "/pools" && req.method === "GET") {
      const pools = [...this.pools].map(([name, gw]) => ({
        name,
        declaredModels: this.#declared.get(gw) ?? null,
        replicaModels: [...new Set(gw.data.store.all().flatMap((r) => [...(r.modelIds ?? [])]))].sort(),
        endpoints: gw.data.store.all().map((r) => ({ id: r.spec.id, health: r.health })),
        admin: `/pools/${name}/`,
      }));
      const body = JSON.stringify({ pools, rewriteSources: this.router.rewriteSources() }, null, 2);
      res.writeHead(200, { "content-type": "application/json" }).end(body);
      return;
    }
    const m = /^\/pools\/([^/]+)(\/.*)?$/.exec(req.url ?? "/");
    const gw = m ? this.pools.get(m[1]) : undefined;
    if (m && gw) {
      req.url = m[2] ?? "/";
      handleAdmin(gw, req, res);
      return;
    }
    req.resume();
    sendError(
      res,
      new GatewayError(
        404,
        `No admin route ${req.method} ${path}; see GET /pools and GET /metrics (the front door's own), and /pools/<name>/endpoints, /pools/<name>/metrics, ... for each pool`,
      ),
    );
  }

  /**
   * Every pool's data layer is ready: a discovered pool's first sync is done; a pool of listed
   * endpoints has had one of them scraped.
   */
  ready(): boolean {
    for (const gw of this.pools.values()) {
      const d = this.#k8s.get(gw)?.discovered;
      if (d ? !d.isReady() : !gw.data.store.all().some((r) => r.state.metrics !== null)) return false;
    }
    return true;
  }

  /** Starts the scraping of every pool not started yet. */
  start(): void {
    for (const gw of this.#fresh) startDataLayer(gw);
    this.#fresh.clear();
  }

  /** Drains and closes every pool but those `keep` holds (a reloaded set that reuses them). */
  close(keep: ReadonlySet<Gateway> = new Set()): Promise<void> {
    this.#closed ??= (async () => {
      clearInterval(this.#forget);
      const gone = [...this.members.values()].filter((m) => !keep.has(m.gw));
      await Promise.all(gone.map((m) => m.gw.close()));
      await Promise.all(gone.map((m) => m.discovered?.close().catch(() => {})));
    })();
    return this.#closed;
  }
}
