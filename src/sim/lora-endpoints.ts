/**
 * The LoRA adapters one simulated replica serves: the --lora-modules ones and those loaded at run
 * time through POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter
 * {lora_name} (vLLM vllm/entrypoints/openai/serving_models.py; the server enables both only with
 * VLLM_ALLOW_RUNTIME_LORA_UPDATING). Answers and errors in vLLM's words. The engine needs no
 * notice: an adapter takes a GPU slot when a batch first uses it (engine/lora-slots.ts).
 */
import type { ServerResponse } from "node:http";
import type { LoraAdapter } from "./lora-config.ts";
import { ApiError } from "./replica-protocol.ts";

export class LoraAdapters {
  readonly #byName = new Map<string, LoraAdapter>();
  #lastId = 0;

  constructor(adapters: readonly LoraAdapter[]) {
    for (const a of adapters) {
      this.#byName.set(a.name, a);
      this.#lastId = Math.max(this.#lastId, a.id);
    }
  }

  get(name: string): LoraAdapter | undefined {
    return this.#byName.get(name);
  }

  /** In load order. */
  list(): LoraAdapter[] {
    return [...this.#byName.values()];
  }

  load(body: Record<string, unknown>, res: ServerResponse): void {
    const name = body["lora_name"];
    const path = body["lora_path"];
    if (typeof name !== "string" || name === "" || typeof path !== "string" || path === "")
      throw new ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", null, "InvalidUserInput");
    if (this.#byName.has(name))
      throw new ApiError(
        400,
        `The lora adapter '${name}' has already been loaded. Unload it first, or load it under another name.`,
        null,
        "InvalidUserInput",
      );
    this.#byName.set(name, { name, path, id: ++this.#lastId, baseModelName: null });
    sendText(res, `Success: LoRA adapter '${name}' added successfully.`);
  }

  unload(body: Record<string, unknown>, res: ServerResponse): void {
    const name = body["lora_name"];
    if (typeof name !== "string" || name === "")
      throw new ApiError(
        400,
        "'lora_name' needs to be provided to unload a LoRA adapter.",
        null,
        "InvalidUserInput",
      );
    if (!this.#byName.delete(name))
      throw new ApiError(
        404,
        `The lora adapter '${name}' cannot be found. GET /v1/models lists the loaded ones.`,
        null,
        "NotFoundError",
      );
    sendText(res, `Success: LoRA adapter '${name}' removed successfully.`);
  }
}

function sendText(res: ServerResponse, text: string): void {
  const data = Buffer.from(text);
  res.writeHead(200, { "content-type": "text/plain; charset=utf-8", "content-length": data.length });
  res.end(data);
}
