/**
 * The CLI-facing workload spec (YAML or flags): workload name, optional preset, seed, request
 * count, arrival process and generator options, checked strictly with zod; and the single entry
 * point that turns a spec into a Workload. Pure: trace text is passed in, not read here.
 */
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { type ArrivalSpec, applyArrivals, planArrivals, type RequestBody } from "./arrivals.ts";
import {
  checkMix,
  MIX_DEFAULTS,
  type MixOptions,
  MixOptionsSchema,
  mergeStreams,
  streamSpec,
} from "./mix.ts";
import { generateMixedLength, MIXED_LENGTH_DEFAULTS } from "./mixed-length.ts";
import { generateMultiTurn, MULTI_TURN_DEFAULTS } from "./multi-turn.ts";
import { PRESETS } from "./presets.ts";
import { generateRandom, RANDOM_DEFAULTS } from "./random.ts";
import { generateSharedPrefix, SHARED_PREFIX_DEFAULTS } from "./shared-prefix.ts";
import { parseTraceJsonl, TRACE_DEFAULTS, traceRequests } from "./trace.ts";
import type { Workload } from "./types.ts";

export const WORKLOAD_NAMES = [
  "shared-prefix",
  "multi-turn",
  "mixed-length",
  "random",
  "trace",
  "mix",
] as const;
export type WorkloadName = (typeof WORKLOAD_NAMES)[number];

const pos = z.number().finite().positive();
const nonneg = z.number().finite().nonnegative();
const len = z.union([
  z.number().int().nonnegative(),
  z.strictObject({ mean: nonneg, std: nonneg.optional(), min: nonneg.optional(), max: nonneg.optional() }),
]);
const api = z.enum(["chat", "completion"]);

const OPTION_SCHEMAS = {
  "shared-prefix": z.strictObject({
    numGroups: z.number().int().positive(),
    promptsPerGroup: z.number().int().positive(),
    systemPromptLen: len,
    questionLen: len,
    outputLen: len,
    api,
    order: z.enum(["permuted", "interleaved"]),
  }),
  "multi-turn": z.strictObject({
    turns: len,
    systemPromptLen: len,
    sharedSystemPrompts: z.number().int().nonnegative(),
    questionLen: len,
    outputLen: len,
    thinkTime: nonneg,
    api,
  }),
  "mixed-length": z.strictObject({
    shortLen: len,
    longLen: len,
    longFraction: z.number().min(0).max(1),
    outputLen: len,
    documentPool: z.number().int().nonnegative(),
    api,
  }),
  random: z.strictObject({ inputLen: len, outputLen: len, api }),
  trace: z.strictObject({
    path: z.string().optional(),
    blockSize: z.number().int().positive(),
    prefixFraction: z.number().min(0).max(1),
    speedup: pos,
    api,
  }),
  mix: MixOptionsSchema,
} as const;

const DEFAULTS: Record<WorkloadName, Record<string, unknown>> = {
  "shared-prefix": { ...SHARED_PREFIX_DEFAULTS },
  "multi-turn": { ...MULTI_TURN_DEFAULTS },
  "mixed-length": { ...MIXED_LENGTH_DEFAULTS },
  random: { ...RANDOM_DEFAULTS },
  trace: { ...TRACE_DEFAULTS },
  mix: { ...MIX_DEFAULTS },
};

const stage = z.strictObject({ rate: pos, duration: pos, warmup: z.boolean().optional() });
const process = z.enum(["constant", "poisson", "gamma"]);

export const ArrivalSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("constant"), rate: pos }),
  z.strictObject({ type: z.literal("poisson"), rate: pos }),
  z.strictObject({ type: z.literal("gamma"), rate: pos, burstiness: pos }),
  z.strictObject({
    type: z.literal("closed"),
    users: z.number().int().positive(),
    thinkTime: nonneg.optional(),
    rampUp: nonneg.optional(),
    warmup: z.number().int().nonnegative().optional(),
  }),
  z.strictObject({
    type: z.literal("stages"),
    process: process.optional(),
    burstiness: pos.optional(),
    stages: z.array(stage).min(1),
    barrier: z.boolean().optional(),
    interval: nonneg.optional(),
    fit: z.boolean().optional(),
  }),
]);

/** What a user writes (YAML or flags): everything but `workload` or `preset` is optional. */
export const WorkloadSpecInputSchema = z.strictObject({
  workload: z.enum(WORKLOAD_NAMES).optional(),
  preset: z.string().optional(),
  seed: z.number().int().nonnegative().optional(),
  numRequests: z.number().int().nonnegative().optional(),
  arrival: ArrivalSchema.optional(),
  options: z.record(z.string(), z.unknown()).optional(),
});
export type WorkloadSpecInput = z.infer<typeof WorkloadSpecInputSchema>;

/** A resolved spec: preset applied, defaults filled, options checked. Stored in results files. */
export interface WorkloadSpec {
  workload: WorkloadName;
  preset?: string;
  seed: number;
  numRequests?: number;
  arrival: ArrivalSpec;
  options: Record<string, unknown>;
}

export const DEFAULT_SEED = 42;

export class WorkloadSpecError extends Error {
  override name = "WorkloadSpecError";
}

/** The flag that sets a spec field, named in errors about specs built from flags. */
const FLAG_OF: Record<string, string> = {
  seed: "--seed",
  numRequests: "--num-requests",
  "arrival.rate": "--rate",
  "arrival.burstiness": "--burstiness",
  "arrival.users": "--users",
  "arrival.thinkTime": "--think-time",
  "arrival.stages": "--stages",
  "arrival.interval": "--stage-interval",
};

/** The keys a strict object at `path` accepts, for "unknown key" errors (undefined: not known here). */
type KeysAt = (path: PropertyKey[]) => readonly string[] | undefined;

function zodMessage(prefix: string, e: z.ZodError, keysAt?: KeysAt): string {
  const i = e.issues[0];
  const where = `${prefix}${i.path.length ? `.${i.path.join(".")}` : ""}`;
  if (i.code === "unrecognized_keys") {
    const valid = keysAt?.(i.path);
    const names = i.keys.map((k) => `"${k}"`).join(", ");
    return `${where}: unknown key${i.keys.length > 1 ? "s" : ""} ${names}${valid ? ` (valid: ${valid.join(", ")})` : ""}`;
  }
  const flag = FLAG_OF[i.path.join(".")];
  return `${where}${flag ? ` (${flag})` : ""}: ${i.message}`;
}

const STAGE_KEYS = Object.keys(stage.shape);

/** Keys accepted at a path of a WorkloadSpecInput (`value` picks the arrival variant). */
function specKeysAt(value: unknown): KeysAt {
  return (path) => {
    if (path.length === 0) return Object.keys(WorkloadSpecInputSchema.shape);
    if (path[0] !== "arrival") return undefined;
    if (path.length === 1) {
      const type = (value as { arrival?: { type?: unknown } } | undefined)?.arrival?.type;
      const variant = ArrivalSchema.options.find((o) => o.shape.type.value === type);
      return variant ? Object.keys(variant.shape) : undefined;
    }
    return path[1] === "stages" && path.length === 3 ? STAGE_KEYS : undefined;
  };
}

/** Applies the preset, fills defaults and checks everything; throws WorkloadSpecError. */
export function resolveWorkloadSpec(input: unknown): WorkloadSpec {
  const parsed = WorkloadSpecInputSchema.safeParse(input);
  if (!parsed.success)
    throw new WorkloadSpecError(zodMessage("workload spec", parsed.error, specKeysAt(input)));
  const user = parsed.data;
  const preset = user.preset === undefined ? undefined : PRESETS[user.preset];
  if (user.preset !== undefined && !preset)
    throw new WorkloadSpecError(
      `unknown preset "${user.preset}" (known: ${Object.keys(PRESETS).join(", ")})`,
    );
  const base = preset?.spec ?? {};
  const workload = user.workload ?? base.workload;
  if (!workload)
    throw new WorkloadSpecError(
      `a workload name is needed: pass --workload NAME (${WORKLOAD_NAMES.join(", ")}) or --preset NAME ` +
        `(${Object.keys(PRESETS).join(", ")}), or set workload: or preset: in the workload file`,
    );
  if (base.workload && user.workload && base.workload !== user.workload) {
    const same = Object.keys(PRESETS).filter((k) => PRESETS[k].spec.workload === user.workload);
    throw new WorkloadSpecError(
      `preset "${user.preset}" is a ${base.workload} workload, not ${user.workload}: drop one of the two` +
        (same.length
          ? ` (${user.workload} presets: ${same.join(", ")})`
          : ` (no preset is a ${user.workload} workload)`),
    );
  }
  const options = { ...DEFAULTS[workload], ...base.options, ...user.options };
  const schema = OPTION_SCHEMAS[workload];
  const checked = schema.safeParse(options);
  if (!checked.success)
    throw new WorkloadSpecError(
      zodMessage(`${workload} options`, checked.error, (path) =>
        path.length === 0 ? Object.keys(schema.shape) : undefined,
      ),
    );
  const arrival = (user.arrival ?? base.arrival ?? { type: "poisson", rate: 1 }) as ArrivalSpec;
  const numRequests = user.numRequests ?? base.numRequests;
  const seed = user.seed ?? base.seed ?? DEFAULT_SEED;
  if (workload === "mix") mixStreams(checked.data as MixOptions, seed);
  return {
    workload,
    ...(user.preset !== undefined ? { preset: user.preset } : {}),
    seed,
    ...(numRequests !== undefined ? { numRequests } : {}),
    arrival,
    options: checked.data as Record<string, unknown>,
  };
}

/**
 * A mix's streams as resolved specs (each checked as a workload of its own; a stream without a seed
 * gets the mix's seed + its index + 1, so streams never share text). Throws WorkloadSpecError.
 */
export function mixStreams(o: MixOptions, seed: number): WorkloadSpec[] {
  const specs = o.streams.map((s, i) => {
    const input = streamSpec(s);
    if (input["workload"] === "trace")
      throw new WorkloadSpecError(`mix options.streams[${i}] (${s.name}): trace streams are not supported`);
    try {
      return resolveWorkloadSpec({ seed: seed + i + 1, ...input });
    } catch (err) {
      if (err instanceof WorkloadSpecError)
        throw new WorkloadSpecError(`mix options.streams[${i}] (${s.name}): ${err.message}`);
      throw err;
    }
  });
  try {
    checkMix(
      o,
      specs.map((x) => x.arrival.type),
    );
  } catch (err) {
    throw new WorkloadSpecError((err as Error).message);
  }
  return specs;
}

/** Parses a YAML (or JSON) workload spec file's text into an unresolved input. */
export function parseWorkloadYaml(text: string): WorkloadSpecInput {
  const v: unknown = parseYaml(text);
  const r = WorkloadSpecInputSchema.safeParse(v ?? {});
  if (!r.success) throw new WorkloadSpecError(zodMessage("workload file", r.error, specKeysAt(v)));
  return r.data;
}

export interface WorkloadInputs {
  /** Text of the JSONL trace (workload "trace"). */
  traceText?: string;
}

/**
 * Generates the workload of a spec (resolved or not). The same spec and seed give the same
 * requests, text included.
 */
export function generateWorkload(
  specInput: WorkloadSpec | WorkloadSpecInput,
  inputs: WorkloadInputs = {},
): Workload {
  const spec = resolveWorkloadSpec(specInput);
  const { seed, options: o } = spec;
  const notes = spec.preset ? [...(PRESETS[spec.preset]?.notes ?? [])] : [];
  if (spec.workload === "trace") {
    if (inputs.traceText === undefined) throw new WorkloadSpecError("trace workload: no trace text given");
    const reqs = traceRequests(parseTraceJsonl(inputs.traceText), o as never, seed);
    const n = spec.numRequests === undefined ? reqs.length : Math.min(spec.numRequests, reqs.length);
    const requests = reqs
      .slice(0, n)
      .map(({ body, time }, i) => ({ id: `r${i}`, arrivalTime: time, ...body }));
    return { name: spec.workload, seed, requests, stages: [], notes };
  }
  if (spec.workload === "mix") {
    const mix = o as unknown as MixOptions;
    const merged = mergeStreams(
      mix,
      mixStreams(mix, seed).map((x) => generateWorkload(x)),
      seed,
    );
    // numRequests on a mix keeps the first N by arrival (a quick run).
    if (spec.numRequests !== undefined) merged.requests = merged.requests.slice(0, spec.numRequests);
    return merged;
  }
  const plan = planArrivals(spec.arrival, spec.numRequests, seed);
  let units: RequestBody[][];
  let intraDelay = 0;
  switch (spec.workload) {
    case "shared-prefix":
      units = generateSharedPrefix(o as never, seed, plan.units);
      break;
    case "multi-turn":
      units = generateMultiTurn(o as never, seed, plan.units);
      intraDelay = o["thinkTime"] as number;
      break;
    case "mixed-length":
      units = generateMixedLength(o as never, seed, plan.units);
      break;
    case "random":
      units = generateRandom(o as never, seed, plan.units);
      break;
  }
  const requests = applyArrivals(units, plan, intraDelay);
  return {
    name: spec.workload,
    seed,
    requests,
    stages: plan.stages,
    ...(plan.stageBarrier ? { stageBarrier: plan.stageBarrier } : {}),
    notes,
  };
}
