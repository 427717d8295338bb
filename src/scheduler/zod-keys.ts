/**
 * The keys a zod object schema allows at an issue's path, for "unknown field; allowed: …" errors
 * (scenario files, autoscale sections, `--autoscale-config`). Walks the schema along the path beside
 * the input, unwrapping optional/default/pipe/lazy wrappers, stepping into arrays, and picking a
 * union's member by the input (a discriminated union by its discriminator, else the member whose
 * keys cover most of the input's).
 */

interface Def {
  type?: string;
  innerType?: unknown;
  in?: unknown;
  element?: unknown;
  options?: unknown[];
  discriminator?: string;
  getter?: () => unknown;
}

function defOf(schema: unknown): Def | undefined {
  return (schema as { _zod?: { def?: Def } } | undefined)?._zod?.def;
}

function shapeOf(schema: unknown): Record<string, unknown> | undefined {
  return defOf(schema)?.type === "object" ? (schema as { shape?: Record<string, unknown> }).shape : undefined;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The union member `value` was checked against, or undefined when it cannot tell. */
function pickMember(d: Def, value: unknown): unknown {
  if (!isRecord(value)) return undefined;
  const members = (d.options ?? []).map((o) => unwrap(o, value)).filter((o) => shapeOf(o) !== undefined);
  if (d.discriminator !== undefined) {
    const tag = value[d.discriminator];
    return members.find((m) => {
      const field = shapeOf(m)?.[d.discriminator as string] as {
        safeParse?: (v: unknown) => { success: boolean };
      };
      return field?.safeParse?.(tag).success === true;
    });
  }
  let best: unknown;
  let bestHits = -1;
  for (const m of members) {
    const shape = shapeOf(m) as Record<string, unknown>;
    const hits = Object.keys(value).filter((k) => k in shape).length;
    if (hits > bestHits) [best, bestHits] = [m, hits];
  }
  return best;
}

/** Strips wrappers (optional, nullable, default, readonly, pipe, lazy) and resolves unions. */
function unwrap(schema: unknown, value: unknown): unknown {
  let cur = schema;
  for (let depth = 0; depth < 32; depth++) {
    const d = defOf(cur);
    if (d === undefined) return undefined;
    if (d.innerType !== undefined) cur = d.innerType;
    else if (d.type === "pipe") cur = d.in;
    else if (d.type === "lazy" && d.getter) cur = d.getter();
    else if (d.type === "union") cur = pickMember(d, value);
    else return cur;
  }
  return undefined;
}

/** The keys allowed by the object schema at `path` in `schema`, read along `input`; [] when unknown. */
export function allowedKeys(schema: unknown, path: readonly PropertyKey[], input: unknown): string[] {
  let value = input;
  let cur = unwrap(schema, value);
  for (const key of path) {
    const d = defOf(cur);
    if (d === undefined) return [];
    if (d.type === "array" && typeof key === "number") {
      value = Array.isArray(value) ? value[key] : undefined;
      cur = d.element;
    } else if (d.type === "object" && typeof key === "string") {
      value = isRecord(value) ? value[key] : undefined;
      cur = shapeOf(cur)?.[key];
    } else return [];
    cur = unwrap(cur, value);
  }
  return Object.keys(shapeOf(cur) ?? {});
}

/** "; allowed: a, b, c" for an unknown key at `path`, or "" when the keys cannot be told. */
export function allowedSuffix(schema: unknown, path: readonly PropertyKey[], input: unknown): string {
  const keys = allowedKeys(schema, path, input);
  return keys.length > 0 ? `; allowed: ${keys.join(", ")}` : "";
}
