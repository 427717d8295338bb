/**
 * The pools file of `kvgate serve --pools` and `kvgate epp --pools`: several pools behind one front.
 * Each pool names its endpoints (a list or a watched endpoints file, as --endpoints / --endpoints-file,
 * or a Kubernetes InferencePool discovered as `kvgate epp --pool-name` does), its own
 * EndpointPickerConfig (scheduler, saturation detector, flow control), optionally the models it
 * serves (otherwise learned from its replicas' /v1/models), and the file may carry
 * InferenceModelRewrite resources (llm-d.ai/v1alpha2) applied before the pool is chosen, plus an
 * opt-in trusted header from a model-selecting layer above kvgate. Validated with zod; every error
 * names the field and says what to write instead.
 */
import { readFileSync } from "node:fs";
import { BlockList, isIP } from "node:net";
import { dirname, resolve } from "node:path";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { z } from "zod";
import { parseRewrite } from "../../datalayer/kubernetes/objects.ts";
import type { ModelRewrite } from "../../datalayer/pool-resources.ts";

export class PoolsFileError extends Error {
  override name = "PoolsFileError";
}

const NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

const poolSchema = z
  .object({
    name: z.string().regex(NAME, "a pool name is lower-case letters, digits and '-' (a DNS label)"),
    endpoints: z.union([z.string().min(1), z.array(z.string().min(1)).min(1)]).optional(),
    endpointsFile: z.string().min(1).optional(),
    inferencePool: z
      .object({
        name: z.string().regex(NAME, "the InferencePool's metadata.name (a DNS label)"),
        namespace: z.string().regex(NAME, "a namespace name (a DNS label)").optional(),
        group: z
          .enum(["inference.networking.k8s.io", "inference.networking.x-k8s.io"], {
            message: "inference.networking.k8s.io (v1) or inference.networking.x-k8s.io (v1alpha2)",
          })
          .optional(),
      })
      .strict()
      .optional(),
    config: z.string().min(1).optional(),
    models: z.array(z.string().min(1)).min(1).optional(),
  })
  .strict()
  .refine(
    (p) => [p.endpoints, p.endpointsFile, p.inferencePool].filter((x) => x !== undefined).length === 1,
    {
      message:
        "give exactly one of endpoints (host:port list), endpointsFile (path) or inferencePool ({name, namespace?, group?})",
    },
  );

const fileSchema = z
  .object({
    pools: z.array(poolSchema).min(1, "list at least one pool under pools:"),
    rewrites: z.union([z.string().min(1), z.array(z.unknown())]).optional(),
    trustedHeader: z
      .object({
        name: z
          .string()
          .regex(/^x-[a-z0-9-]+$/, "a lower-case header name starting with x-, e.g. x-kvgate-pool"),
        selects: z.enum(["pool", "model"]),
        trustedSources: z.array(z.string().min(1)).min(1).optional(),
      })
      .strict()
      .optional(),
  })
  .strict();

export interface PoolDef {
  readonly name: string;
  /** host:port,... (exclusive with endpointsFile). */
  readonly endpoints?: string;
  /** Absolute path. */
  readonly endpointsFile?: string;
  /** A Kubernetes InferencePool to discover (namespace default: $NAMESPACE, else "default"). */
  readonly inferencePool?: { readonly name: string; readonly namespace?: string; readonly group?: string };
  /** Absolute path of the pool's EndpointPickerConfig; absent = built-in. */
  readonly configFile?: string;
  /** Declared models; null = learned from the replicas' /v1/models. */
  readonly models: readonly string[] | null;
}

export interface TrustedHeader {
  readonly name: string;
  readonly selects: "pool" | "model";
  /** Null = any source (the operator's network guarantees who can set it). */
  readonly sources: BlockList | null;
  readonly sourcesText: readonly string[] | null;
}

export interface PoolsFile {
  readonly pools: readonly PoolDef[];
  readonly rewrites: readonly ModelRewrite[];
  readonly trustedHeader: TrustedHeader | null;
}

function zodMessage(path: string, err: z.ZodError): string {
  return err.issues
    .map((i) => `${path}: ${i.path.length ? `${i.path.join(".")}: ` : ""}${i.message}`)
    .join("; ");
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (err) {
    throw new PoolsFileError(`${what} ${path}: ${(err as Error).message}; check the path`);
  }
}

/** InferenceModelRewrite objects (YAML documents or a list); poolRef may be left out here. */
export function parseRewriteObjects(objs: readonly unknown[], where: string): ModelRewrite[] {
  return objs.map((o, i) => {
    const obj = o as { kind?: unknown; spec?: { poolRef?: unknown } };
    if (obj?.kind !== undefined && obj.kind !== "InferenceModelRewrite")
      throw new PoolsFileError(`${where}[${i}]: kind must be InferenceModelRewrite, got ${String(obj.kind)}`);
    // The front door applies rewrites before it picks a pool, so poolRef does not scope them.
    const withRef =
      obj?.spec && typeof obj.spec === "object" && obj.spec.poolRef === undefined
        ? { ...obj, spec: { ...obj.spec, poolRef: { name: "kvgate-front" } } }
        : o;
    try {
      const r = parseRewrite(withRef);
      return {
        name: r.meta.name,
        createdAtMs: Number.isFinite(r.meta.createdAtMs) ? r.meta.createdAtMs : i,
        rules: r.rules,
      };
    } catch (err) {
      throw new PoolsFileError(`${where}[${i}]: ${(err as Error).message}`);
    }
  });
}

function parseSources(list: readonly string[], path: string): BlockList {
  const bl = new BlockList();
  for (const s of list) {
    const [addr, bits] = s.split("/");
    const family = isIP(addr);
    const prefix = bits === undefined ? (family === 6 ? 128 : 32) : Number(bits);
    if (family === 0 || !Number.isInteger(prefix) || prefix < 0 || prefix > (family === 6 ? 128 : 32))
      throw new PoolsFileError(
        `${path}: trustedHeader.trustedSources: ${JSON.stringify(s)} is not an address or CIDR; write e.g. 10.0.0.0/8 or 127.0.0.1`,
      );
    bl.addSubnet(addr, prefix, family === 6 ? "ipv6" : "ipv4");
  }
  return bl;
}

/** Parses pools-file text; relative paths resolve against `baseDir`. */
export function parsePoolsFile(text: string, path: string, baseDir: string): PoolsFile {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new PoolsFileError(`${path}: not valid YAML: ${(err as Error).message}`);
  }
  const r = fileSchema.safeParse(raw);
  if (!r.success) throw new PoolsFileError(zodMessage(path, r.error));
  const f = r.data;
  const abs = (p: string) => resolve(baseDir, p);
  const seen = new Map<string, string>();
  const pools: PoolDef[] = [];
  for (const p of f.pools) {
    if (pools.some((q) => q.name === p.name))
      throw new PoolsFileError(`${path}: pool name ${p.name} is used twice; give each pool its own name`);
    for (const m of p.models ?? []) {
      const other = seen.get(m);
      if (other !== undefined)
        throw new PoolsFileError(
          `${path}: model ${m} is declared by pools ${other} and ${p.name}; a model belongs to one pool (use an InferenceModelRewrite to split between models)`,
        );
      seen.set(m, p.name);
    }
    pools.push({
      name: p.name,
      endpoints: typeof p.endpoints === "string" ? p.endpoints : p.endpoints?.join(","),
      endpointsFile: p.endpointsFile === undefined ? undefined : abs(p.endpointsFile),
      inferencePool: p.inferencePool,
      configFile: p.config === undefined ? undefined : abs(p.config),
      models: p.models ?? null,
    });
  }
  let rewrites: ModelRewrite[] = [];
  if (typeof f.rewrites === "string") {
    const rp = abs(f.rewrites);
    const docs = parseAllDocuments(readText(rp, "rewrites file"));
    const objs: unknown[] = [];
    for (const d of Array.isArray(docs) ? docs : [docs]) {
      if (d.errors.length) throw new PoolsFileError(`${rp}: not valid YAML: ${d.errors[0].message}`);
      const v = d.toJS();
      if (v !== null && v !== undefined) objs.push(v);
    }
    rewrites = parseRewriteObjects(objs, rp);
  } else if (f.rewrites) rewrites = parseRewriteObjects(f.rewrites, `${path}: rewrites`);
  const th = f.trustedHeader;
  return {
    pools,
    rewrites,
    trustedHeader: th
      ? {
          name: th.name,
          selects: th.selects,
          sources: th.trustedSources ? parseSources(th.trustedSources, path) : null,
          sourcesText: th.trustedSources ?? null,
        }
      : null,
  };
}

/** Reads and parses a pools file; throws PoolsFileError naming the problem. */
export function loadPoolsFile(path: string): PoolsFile {
  return parsePoolsFile(readText(path, "--pools"), path, dirname(resolve(path)));
}
