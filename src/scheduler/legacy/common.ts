/**
 * Shared pieces of the legacy-config rewrites: the rewrite context, small parameter checks that
 * fail with ConfigErrors naming the plugin, and the compact YAML used to show modern equivalents.
 */
import { stringify } from "yaml";
import type { RawPlugin } from "../config.ts";
import { ConfigError } from "../errors.ts";

export type Params = Record<string, unknown>;

/** GIE's averageCharactersPerToken, and the width of kvgate's tokenizer-free pseudo-tokens. */
export { BYTES_PER_TOKEN as CHARS_PER_TOKEN } from "../plugins/prefix/hashing.ts";

export interface Ctx {
  warnings: string[];
  taken: Set<string>;
  /** Names of the decider plugins the config declares. */
  deciders: string[];
  /** Old prefix plugin name → the producer now holding its index (for prefixPluginName). */
  producerOf: Map<string, string>;
}

/**
 * prefixPluginName / prefixPluginType (which prefix plugin's state to read) → the producer of a
 * split scorer, as prefixMatchInfoProducerName on `target`; otherwise dropped (kvgate resolves the
 * one producer itself). Removes both keys from `params`; returns notes for the warning.
 */
export function prefixRef(params: Params, ctx: Ctx, target: Params = params): string[] {
  const name = params.prefixPluginName;
  const had = "prefixPluginName" in params || "prefixPluginType" in params;
  delete params.prefixPluginName;
  delete params.prefixPluginType;
  if (!had) return [];
  const producer = typeof name === "string" ? ctx.producerOf.get(name) : undefined;
  if (producer !== undefined) {
    target.prefixMatchInfoProducerName = producer;
    return [`prefixPluginName "${String(name)}" → prefixMatchInfoProducerName "${producer}"`];
  }
  return [
    "prefixPluginName/prefixPluginType ignored (the prefix producer is found by prefixMatchInfoProducerName)",
  ];
}

export function who(p: RawPlugin): string {
  return `plugin "${p.name}" (type ${p.type})`;
}

export function hasAny(p: RawPlugin, keys: readonly string[]): boolean {
  return keys.some((k) => p.parameters[k] !== undefined);
}

export function keysOf(p: RawPlugin, keys: readonly string[]): string {
  return keys.filter((k) => p.parameters[k] !== undefined).join(", ");
}

export function freeName(ctx: Ctx, base: string): string {
  let name = base;
  for (let i = 2; ctx.taken.has(name); i++) name = `${base}-${i}`;
  ctx.taken.add(name);
  return name;
}

export function positiveInt(p: RawPlugin, key: string): number | undefined {
  const v = p.parameters[key];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
    throw new ConfigError(
      `${who(p)}: parameter "${key}" must be a positive integer; got ${JSON.stringify(v)}`,
    );
  return v;
}

export function nonNegativeInt(p: RawPlugin, key: string): number | undefined {
  const v = p.parameters[key];
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0)
    throw new ConfigError(
      `${who(p)}: parameter "${key}" must be a non-negative integer; got ${JSON.stringify(v)}`,
    );
  return v;
}

export function flow(v: unknown): string {
  return stringify(v, { collectionStyle: "flow", lineWidth: 0 }).trim();
}

export function isRecord(v: unknown): v is Params {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
