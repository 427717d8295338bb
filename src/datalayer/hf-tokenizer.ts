/**
 * A real Hugging Face tokenizer behind the Tokenizer contract, loaded fully offline from local
 * files: tokenizer.json via @huggingface/tokenizers, the chat template (tokenizer_config.json's
 * `chat_template`, or a chat_template.jinja beside it) rendered with @huggingface/jinja.
 */
import { readFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { type ChatMessage, messageText, type Tokenizer } from "../engine/tokenizer.ts";

export type HfTokenizerSource =
  | string
  | { tokenizerJsonPath: string; tokenizerConfigPath?: string; chatTemplatePath?: string };

type Json = Record<string, unknown>;

/** What to do when a model directory's tokenizer.json cannot be read (serve, epp, sim replicas). */
const DIR_ADVICE = "give --tokenizer a directory holding tokenizer.json, or leave --tokenizer out";

/** `advice` (what to do) follows a read error after "; ". */
async function readJson(
  path: string,
  required: boolean,
  advice = "check the path",
): Promise<Json | undefined> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    if (!required && (e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`tokenizer: cannot read ${path}: ${(e as Error).message}; ${advice}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new Error(`tokenizer: ${path} is not valid JSON: ${(e as Error).message}`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Error(`tokenizer: ${path} must hold a JSON object`);
  }
  return parsed as Json;
}

async function readOptionalText(path: string, required: boolean): Promise<string | undefined> {
  try {
    return await readFile(path, "utf8");
  } catch (e) {
    if (!required && (e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`tokenizer: cannot read ${path}: ${(e as Error).message}; check the path`);
  }
}

/** A special-token field of tokenizer_config.json: a string or an AddedToken-like `{content}`. */
function tokenText(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string")
    return (v as Json).content as string;
  return undefined;
}

/** The default template from `chat_template`: a string, or a list of {name, template}. */
function pickTemplate(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (Array.isArray(v)) {
    const named = v.filter((t): t is { name: string; template: string } => typeof t?.template === "string");
    return (named.find((t) => t.name === "default") ?? named[0])?.template;
  }
  return undefined;
}

/**
 * Loads a tokenizer from a model directory (tokenizer.json, optional tokenizer_config.json and
 * chat_template.jinja) or from explicit paths (explicit paths must exist). Errors name the
 * offending file. EOS is the config's `eos_token`; failing that, generation_config.json's first
 * `eos_token_id` in the same directory.
 */
export async function loadHfTokenizer(src: HfTokenizerSource): Promise<Tokenizer> {
  const jsonPath = typeof src === "string" ? join(src, "tokenizer.json") : src.tokenizerJsonPath;
  const dir = dirname(jsonPath);
  const configPath = typeof src === "string" ? join(src, "tokenizer_config.json") : src.tokenizerConfigPath;
  const explicitConfig = typeof src !== "string" && src.tokenizerConfigPath !== undefined;

  const tokJson = await readJson(jsonPath, true, typeof src === "string" ? DIR_ADVICE : undefined);
  const config = (configPath ? await readJson(configPath, explicitConfig) : undefined) ?? {};
  if (tokJson && !Array.isArray(tokJson.added_tokens)) tokJson.added_tokens = [];

  let hf: HfTokenizer;
  try {
    hf = new HfTokenizer(tokJson as object, config);
  } catch (e) {
    throw new Error(`tokenizer: ${jsonPath} is not a usable tokenizer.json: ${(e as Error).message}`);
  }

  // An explicit chatTemplatePath wins; then the config's chat_template; then chat_template.jinja.
  const explicitTemplate = typeof src === "string" ? undefined : src.chatTemplatePath;
  let templateText = explicitTemplate === undefined ? pickTemplate(config.chat_template) : undefined;
  let templateOrigin = configPath ?? jsonPath;
  if (templateText === undefined) {
    templateOrigin = explicitTemplate ?? join(dir, "chat_template.jinja");
    templateText = await readOptionalText(templateOrigin, explicitTemplate !== undefined);
  }
  let template: Template | undefined;
  if (templateText !== undefined) {
    try {
      template = new Template(templateText);
    } catch (e) {
      throw new Error(`tokenizer: bad chat template in ${templateOrigin}: ${(e as Error).message}`);
    }
  }

  const eosToken = tokenText(config.eos_token);
  let eosTokenId = eosToken !== undefined ? hf.token_to_id(eosToken) : undefined;
  if (eosTokenId === undefined) {
    const gen = await readJson(join(dir, "generation_config.json"), false).catch(() => undefined);
    const ids = gen?.eos_token_id;
    const id = Array.isArray(ids) ? ids[0] : ids;
    if (typeof id === "number") eosTokenId = id;
  }
  if (eosTokenId === undefined) {
    throw new Error(
      `tokenizer: no EOS token id: ${configPath ?? jsonPath} has no eos_token in the vocabulary and no generation_config.json eos_token_id`,
    );
  }

  let vocabSize = 0;
  for (const id of hf.get_vocab(true).values()) if (id >= vocabSize) vocabSize = id + 1;
  const specials: Json = {};
  for (const key of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
    const t = tokenText(config[key]);
    if (t !== undefined) specials[key] = t;
  }
  const name =
    (typeof config.name_or_path === "string" && config.name_or_path) ||
    (typeof src === "string" ? basename(src) : basename(dir));

  return {
    name,
    vocabSize,
    eosTokenId,
    encode(text: string, addSpecialTokens = true): number[] {
      return hf.encode(String(text), { add_special_tokens: addSpecialTokens }).ids;
    },
    decode(ids: number[]): string {
      // The library throws on an empty list and renders unknown ids as undefined: drop them first.
      const known = Array.isArray(ids)
        ? ids.filter((id) => Number.isInteger(id) && hf.id_to_token(id) !== undefined)
        : [];
      if (known.length === 0) return "";
      try {
        return hf.decode(known, { skip_special_tokens: false });
      } catch {
        return "";
      }
    },
    /** Throws an Error when there is no template or the template rejects the messages (raise_exception). */
    applyChatTemplate(messages: ChatMessage[], opts?: { addGenerationPrompt?: boolean }): string {
      if (!template) throw new Error(`tokenizer ${name} has no chat template`);
      const msgs = (Array.isArray(messages) ? messages : [])
        .filter((m) => m && typeof m === "object")
        .map((m) => ({ ...m, content: messageText(m) }));
      try {
        return template.render({
          messages: msgs,
          add_generation_prompt: opts?.addGenerationPrompt ?? true,
          ...specials,
        });
      } catch (e) {
        throw new Error(`chat template of ${name}: ${(e as Error).message}`);
      }
    },
  };
}
