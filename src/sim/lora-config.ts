/**
 * The simulated replica's LoRA settings, as vLLM takes them (vllm/engine/arg_utils.py,
 * vllm/entrypoints/openai/cli_args.py): --enable-lora, --max-loras (default 1), --max-lora-rank
 * (default 16, one of vLLM's allowed ranks), --lora-modules as `name=path` or JSON
 * `{"name":…,"path":…,"base_model_name":…}`, plus the simulator's --lora-load-time: milliseconds a
 * step takes longer for each adapter it brings into a GPU slot (default 25 ms; llm-d's
 * lora-load-state-scorer documentation says a small adapter loads in tens of milliseconds). Static
 * adapters get lora_int_id 1, 2, … in order, as vLLM's OpenAIServingModels numbers them; adapters
 * loaded at run time (POST /v1/load_lora_adapter) continue the count.
 */

/** vLLM's allowed --max-lora-rank values (vllm/config/lora.py MaxLoRARanks). */
export const LORA_RANKS = [1, 8, 16, 32, 64, 128, 256, 320, 512] as const;
export const DEFAULT_LORA_LOAD_MS = 25;

export interface LoraAdapter {
  name: string;
  path: string;
  /** vLLM lora_int_id (KV events' lora_id). */
  id: number;
  /** The base model the adapter reports as its /v1/models `parent`; null = the first served name. */
  baseModelName: string | null;
}

export interface LoraSettings {
  enableLora?: boolean;
  maxLoras?: number;
  maxLoraRank?: number;
  /** `name=path` or JSON strings, or parsed adapters. */
  loraModules?: readonly (string | { name: string; path: string; base_model_name?: string })[];
  loadTimeMs?: number;
}

export interface LoraOptions {
  maxLoras: number;
  maxLoraRank: number;
  loadSeconds: number;
  adapters: LoraAdapter[];
}

/** Thrown with the flag at fault and what to do. */
export class LoraOptionError extends Error {
  override name = "LoraOptionError";
  constructor(
    readonly flag: string,
    message: string,
  ) {
    super(message);
  }
}

function parseModule(m: LoraSettings["loraModules"] extends readonly (infer T)[] | undefined ? T : never) {
  if (typeof m !== "string") return { name: m.name, path: m.path, base: m.base_model_name ?? null };
  const text = m.trim();
  if (text.startsWith("{")) {
    let o: unknown;
    try {
      o = JSON.parse(text);
    } catch (err) {
      throw new LoraOptionError("--lora-modules", `${text} is not valid JSON: ${(err as Error).message}`);
    }
    const r = o as Record<string, unknown>;
    if (typeof r["name"] !== "string" || typeof r["path"] !== "string")
      throw new LoraOptionError("--lora-modules", `${text} needs string "name" and "path" fields`);
    const base = r["base_model_name"];
    return { name: r["name"], path: r["path"], base: typeof base === "string" ? base : null };
  }
  const eq = text.indexOf("=");
  if (eq <= 0 || eq === text.length - 1)
    throw new LoraOptionError(
      "--lora-modules",
      `"${m}" must be name=path or a JSON object {"name": …, "path": …, "base_model_name": …}`,
    );
  return { name: text.slice(0, eq), path: text.slice(eq + 1), base: null };
}

/** The LoRA options, or null when LoRA is off. Throws LoraOptionError. */
export function resolveLora(s: LoraSettings, servedModelNames: readonly string[]): LoraOptions | null {
  const any = s.maxLoras !== undefined || (s.loraModules?.length ?? 0) > 0;
  if (!s.enableLora) {
    if (any)
      throw new LoraOptionError(
        s.maxLoras !== undefined ? "--max-loras" : "--lora-modules",
        "needs --enable-lora",
      );
    return null;
  }
  const maxLoras = s.maxLoras ?? 1;
  if (!Number.isInteger(maxLoras) || maxLoras < 1)
    throw new LoraOptionError("--max-loras", `must be an integer ≥ 1, got ${maxLoras}`);
  const maxLoraRank = s.maxLoraRank ?? 16;
  if (!(LORA_RANKS as readonly number[]).includes(maxLoraRank))
    throw new LoraOptionError(
      "--max-lora-rank",
      `must be one of ${LORA_RANKS.join(", ")}, got ${maxLoraRank}`,
    );
  const ms = s.loadTimeMs ?? DEFAULT_LORA_LOAD_MS;
  if (!(ms >= 0 && Number.isFinite(ms)))
    throw new LoraOptionError("--lora-load-time", `must be a number of milliseconds ≥ 0, got ${ms}`);
  const adapters: LoraAdapter[] = [];
  for (const m of s.loraModules ?? []) {
    const { name, path, base } = parseModule(m);
    if (servedModelNames.includes(name) || adapters.some((a) => a.name === name))
      throw new LoraOptionError(
        "--lora-modules",
        `the name "${name}" is used twice; give each adapter its own`,
      );
    adapters.push({ name, path, id: adapters.length + 1, baseModelName: base });
  }
  return { maxLoras, maxLoraRank, loadSeconds: ms / 1000, adapters };
}
