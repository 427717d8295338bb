/**
 * Live autoscaling recommendations in the gateway (`kvgate serve` and `kvgate epp`, with
 * `--autoscale-config FILE`): kvgate's recommender (src/autoscale/recommender.ts) fed every few
 * seconds with what the gateway sees — requests arriving (prompt tokens: token ids when the
 * gateway tokenizes, else bytes ÷ 4), their time to first token, and each Ready replica's scraped
 * vLLM gauges (KV usage, waiting, running), pooled by llm-d.ai/role (prefill, decode, else the
 * aggregated pool). Output lengths, ITL and the prefix-hit rate are not observed live yet: they
 * come from the file's `load` until then.
 *
 * Exported on the admin port's /metrics as `kvgate_desired_replicas{pool,role}` and, for an HPA
 * or KEDA already pointed at llm-d's Workload Variant Autoscaler, as WVA's
 * `wva_desired_replicas{variant_name,namespace,accelerator_type}` (llm-d-workload-variant-autoscaler
 * internal/constants/metrics.go; variant_name is the pool's Deployment name) with
 * `wva_current_replicas` beside it; `GET /autoscale` shows each pool's count and the reason. With
 * `actuate: true` each pool's Deployment is scaled through its scale subresource.
 */
import { readFileSync } from "node:fs";
import { Gauge, type Registry } from "prom-client";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { type PoolSpec, Recommender } from "../autoscale/recommender.ts";
import {
  emptyTrafficSample,
  type PoolDecision,
  type PoolRole,
  type PoolSample,
  type TrafficSample,
} from "../autoscale/types.ts";
import type { Datastore } from "../datalayer/datastore.ts";
import { ROLE_LABEL } from "../scheduler/plugins/filters/labels.ts";
import type { RequestFacts } from "../scheduler/types.ts";
import { allowedSuffix } from "../scheduler/zod-keys.ts";
import { loadProfile } from "../sim/profiles.ts";
import type { ScaleActuator, ScaleTarget } from "./autoscale-actuator.ts";

const pos = z.number().finite().positive();
const ConfigSchema = z.strictObject({
  pools: z
    .array(
      z.strictObject({
        name: z.string().min(1),
        role: z.enum(["aggregated", "prefill", "decode"]).optional(),
        /** Engine profile (built-in name or YAML path): its throughput sizes the pool. */
        profile: z.string().min(1),
        min: z.number().int().nonnegative(),
        max: z.number().int().positive(),
        maxNumSeqs: z.number().int().positive().optional(),
        maxNumBatchedTokens: z.number().int().positive().optional(),
        kvTokens: z.number().int().positive().optional(),
        /** The Deployment the pool is (the actuator's target; WVA's variant_name). */
        deployment: z.string().min(1).optional(),
        accelerator: z.string().optional(),
      }),
    )
    .min(1),
  namespace: z.string().min(1).optional(),
  slo: z.strictObject({ ttft: pos, itl: pos, attainment: z.number().min(0).max(1).optional() }),
  startupDelay: z.number().finite().nonnegative(),
  interval: pos.optional(),
  sampleInterval: pos.optional(),
  load: z.strictObject({ inputTokens: pos, outputTokens: pos, hitRate: z.number().min(0).max(1) }).optional(),
  actuate: z.boolean().optional(),
});
export type AutoscaleFileConfig = z.infer<typeof ConfigSchema>;

/** Reads and checks an autoscale config file; an error names the field and the file. */
export function loadAutoscaleConfig(file: string, cwd = process.cwd()): AutoscaleFileConfig {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new Error(`autoscale config ${file}: ${(err as Error).message}; check the path`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new Error(`autoscale config ${file}: ${(err as Error).message}`);
  }
  const r = ConfigSchema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    const where =
      i.code === "unrecognized_keys"
        ? `${[...i.path, i.keys[0]].join(".")}: unknown field${allowedSuffix(ConfigSchema, i.path, raw)}`
        : `${i.path.join(".")}: ${i.message}`;
    throw new Error(`autoscale config ${file}: ${where}`);
  }
  for (const p of r.data.pools) {
    if (p.min > p.max)
      throw new Error(
        `autoscale config ${file}: pool ${p.name}: min ${p.min} > max ${p.max}; make min ≤ max`,
      );
    loadProfile(p.profile, { cwd });
  }
  return r.data;
}

export interface AutoscaleView {
  enabled: true;
  interval_s: number;
  startup_delay_s: number;
  slo: AutoscaleFileConfig["slo"];
  decided_at: string | null;
  pools: Array<PoolDecision & { ready: number; deployment: string | null; actuated: boolean }>;
}

export class AutoscaleService {
  readonly #cfg: AutoscaleFileConfig;
  readonly #rec: Recommender;
  readonly #specs: PoolSpec[];
  readonly #desired: Gauge<"pool" | "role">;
  readonly #wvaDesired: Gauge<"variant_name" | "namespace" | "accelerator_type">;
  readonly #wvaCurrent: Gauge<"variant_name" | "namespace" | "accelerator_type">;
  #traffic: TrafficSample = emptyTrafficSample();
  #last: number;
  #lastDecision = Number.NEGATIVE_INFINITY;
  #decidedAt: string | null = null;
  #view: AutoscaleView["pools"] = [];
  #timer: NodeJS.Timeout | null = null;

  constructor(
    cfg: AutoscaleFileConfig,
    readonly store: Pick<Datastore, "all">,
    registry: Registry,
    readonly clock: () => number,
    readonly actuator: ScaleActuator | null = null,
  ) {
    this.#cfg = cfg;
    this.#specs = cfg.pools.map((p) => {
      const profile = loadProfile(p.profile);
      return {
        name: p.name,
        role: p.role ?? "aggregated",
        profile,
        limits: {
          maxNumSeqs: p.maxNumSeqs ?? profile.defaults.maxNumSeqs,
          maxNumBatchedTokens: p.maxNumBatchedTokens ?? profile.defaults.maxNumBatchedTokens,
          kvTokens: p.kvTokens ?? profile.kvCapacityTokens,
        },
        bounds: { min: Math.max(1, p.min), max: p.max },
      };
    });
    this.#rec = new Recommender({
      pools: this.#specs,
      slo: { ...cfg.slo, attainment: cfg.slo.attainment ?? 0.95 },
      startupDelay: cfg.startupDelay,
      ...(cfg.interval !== undefined ? { interval: cfg.interval } : {}),
      ...(cfg.load !== undefined ? { initialLoad: cfg.load } : {}),
    });
    this.#desired = new Gauge({
      name: "kvgate_desired_replicas",
      help: "Replicas kvgate's autoscaling recommender asks for, per pool and role (GET /autoscale says why).",
      labelNames: ["pool", "role"],
      registers: [registry],
    });
    const wvaLabels = ["variant_name", "namespace", "accelerator_type"] as const;
    this.#wvaDesired = new Gauge({
      name: "wva_desired_replicas",
      help: "Desired number of replicas for each variant (llm-d Workload Variant Autoscaler's name; kvgate's recommendation).",
      labelNames: wvaLabels,
      registers: [registry],
    });
    this.#wvaCurrent = new Gauge({
      name: "wva_current_replicas",
      help: "Current number of replicas for each variant (Ready endpoints of the pool).",
      labelNames: wvaLabels,
      registers: [registry],
    });
    this.#last = clock();
  }

  /** A request reached the gateway with this many prompt tokens. */
  arrived(promptTokens: number): void {
    this.#traffic.arrivals++;
    this.#traffic.inputTokens += promptTokens;
  }

  /**
   * A request's response ended: its prompt and output tokens (null when the gateway did not see a
   * usage block: the file's `load` stands in), seconds to the first byte (null if none came) and
   * in all. Its mean inter-token latency is (e2e − ttft) / (output − 1) when the output is known.
   */
  finished(r: { promptTokens: number; outputTokens: number | null; ttft: number | null; e2e: number }): void {
    if (r.ttft === null) return;
    const t = this.#traffic;
    const load = this.#cfg.load;
    const out = r.outputTokens ?? load?.outputTokens ?? 200;
    t.completions++;
    t.completedInputTokens += r.promptTokens;
    t.outputTokens += out;
    t.cachedTokens += r.promptTokens * (load?.hitRate ?? 0);
    t.ttfts.push(r.ttft);
    t.tpots.push(r.outputTokens !== null && r.outputTokens > 1 ? (r.e2e - r.ttft) / (r.outputTokens - 1) : 0);
  }

  start(): void {
    const every = (this.#cfg.sampleInterval ?? 2) * 1000;
    this.#timer = setInterval(() => void this.tick(), every);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** One sample, and a decision when the interval has passed. Exposed for tests. */
  async tick(): Promise<void> {
    const now = this.clock();
    const pools = this.#pools();
    this.#rec.observe({ now, period: Math.max(1e-3, now - this.#last), traffic: this.#traffic, pools });
    this.#traffic = emptyTrafficSample();
    this.#last = now;
    if (now - this.#lastDecision < this.#rec.interval - 1e-9) return;
    this.#lastDecision = now;
    const decisions = this.#rec.decide(now, pools);
    this.#decidedAt = new Date().toISOString();
    const ns = this.#cfg.namespace ?? "";
    const view: AutoscaleView["pools"] = [];
    for (const [k, d] of decisions.entries()) {
      const p = this.#cfg.pools[k];
      this.#desired.set({ pool: d.pool, role: d.role }, d.desired);
      const labels = {
        variant_name: p.deployment ?? p.name,
        namespace: ns,
        accelerator_type: p.accelerator ?? "",
      };
      this.#wvaDesired.set(labels, d.desired);
      this.#wvaCurrent.set(labels, pools[k].ready);
      let actuated = false;
      if (this.#cfg.actuate && this.actuator !== null && p.deployment !== undefined) {
        const target: ScaleTarget = { namespace: ns || "default", name: p.deployment };
        actuated = (await this.actuator.scale(target, d.desired)) !== null;
      }
      view.push({ ...d, ready: pools[k].ready, deployment: p.deployment ?? null, actuated });
    }
    this.#view = view;
  }

  /** Each pool's Ready endpoints and their scraped gauges; the target is what was last asked for. */
  #pools(): PoolSample[] {
    const recs = this.store.all().filter((r) => r.health !== "unhealthy");
    return this.#specs.map((spec, k): PoolSample => {
      const mine = recs.filter((r) => roleOf(r.spec.labels) === spec.role);
      const replicas = mine.map((r) => ({
        kvUsage: r.state.metrics?.kvCacheUsagePercent ?? 0,
        waiting: r.state.metrics?.waitingQueueSize ?? 0,
        running: r.state.metrics?.runningRequestsSize ?? 0,
        busy: 0,
      }));
      const asked = this.#view[k]?.desired ?? mine.length;
      const starting = Math.max(0, asked - mine.length);
      return {
        name: spec.name,
        role: spec.role,
        ready: mine.length,
        starting,
        target: mine.length + starting,
        replicas,
      };
    });
  }

  view(): AutoscaleView {
    return {
      enabled: true,
      interval_s: this.#rec.interval,
      startup_delay_s: this.#cfg.startupDelay,
      slo: this.#cfg.slo,
      decided_at: this.#decidedAt,
      pools: this.#view,
    };
  }
}

/** Prompt tokens of a request as the gateway knows them: its token ids, else its text's bytes ÷ 4. */
export function promptTokensOf(f: RequestFacts): number {
  if (f.tokenIds !== undefined) return f.tokenIds.length;
  const p = f.prompt;
  const text =
    p.kind === "chat"
      ? p.messages
          .map((m) => (typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? "")))
          .join("")
      : typeof p.prompt === "string"
        ? p.prompt
        : Array.isArray(p.prompt) && typeof p.prompt[0] === "number"
          ? ""
          : JSON.stringify(p.prompt);
  if (p.kind === "completion" && Array.isArray(p.prompt) && typeof p.prompt[0] === "number")
    return p.prompt.length;
  return Math.ceil(text.length / 4);
}

function roleOf(labels: Record<string, string>): PoolRole {
  const r = labels[ROLE_LABEL];
  return r === "prefill" ? "prefill" : r === "decode" ? "decode" : "aggregated";
}
