/**
 * Loads hardware/model profiles from YAML: by name from the package's `profiles/` folder (found
 * relative to this file, so it works from any cwd and when installed), or by path. Adding a profile
 * is adding a file; validation is `validateProfile` from the engine.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parse as parseYaml } from "yaml";
import { type Profile, validateProfile } from "../engine/profile.ts";

/** The built-in profiles folder: `<package root>/profiles`. */
export const PROFILES_DIR = fileURLToPath(new URL("../../profiles/", import.meta.url));

export const DEFAULT_PROFILE = "llama-3.1-8b-h100";

/** Names of the profiles shipped in `profiles/` (file names without `.yaml`), sorted. */
export function listProfiles(dir: string = PROFILES_DIR): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith(".yaml") || f.endsWith(".yml"))
    .map((f) => f.replace(/\.ya?ml$/, ""))
    .sort();
}

/** True when `ref` names a file rather than a built-in profile. */
function looksLikePath(ref: string): boolean {
  return ref.includes("/") || ref.includes("\\") || /\.ya?ml$/.test(ref) || ref.startsWith(".");
}

/** Parses and validates profile YAML text; `origin` names it in errors. */
export function parseProfile(text: string, origin: string): Profile {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (err) {
    throw new Error(`profile ${origin}: invalid YAML: ${(err as Error).message}`);
  }
  return validateProfile(raw, origin);
}

/**
 * Loads a profile by built-in name (`llama-3.1-8b-h100`) or by file path (`./my.yaml`, resolved
 * against `cwd`). Throws an Error naming the profile and, for unknown names, the available ones.
 */
export function loadProfile(ref: string, opts: { cwd?: string; dir?: string } = {}): Profile {
  const dir = opts.dir ?? PROFILES_DIR;
  let file: string;
  if (looksLikePath(ref)) {
    file = resolve(opts.cwd ?? process.cwd(), ref);
    if (!existsSync(file)) throw new Error(`profile file not found: ${file}`);
  } else {
    file = [".yaml", ".yml"].map((ext) => resolve(dir, ref + ext)).find((f) => existsSync(f)) ?? "";
    if (!file) {
      const names = listProfiles(dir);
      throw new Error(`unknown profile "${ref}"; available: ${names.length ? names.join(", ") : "(none)"}`);
    }
  }
  return parseProfile(readFileSync(file, "utf8"), file);
}
