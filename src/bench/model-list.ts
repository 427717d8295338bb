/**
 * A target's models from GET {base}/v1/models, with errors that say what to do: a target that
 * does not answer, one that answers without an OpenAI model list, one that lists none. bench
 * checks every target this way before the run; the driver uses it when no model was given.
 */
import { Agent, request } from "undici";

/** What GET {base}/v1/models said: the model ids, or the status when it answered something else. */
export type ModelList = { ids: string[] } | { status: number };

async function fetchModels(
  base: string,
  dispatcher: Agent,
  headers: Record<string, string>,
): Promise<ModelList> {
  let status: number;
  let text: string;
  try {
    const res = await request(`${base}/v1/models`, {
      dispatcher,
      headers,
      signal: AbortSignal.timeout(10_000),
    });
    status = res.statusCode;
    text = await res.body.text();
  } catch (e) {
    throw new Error(
      `cannot reach ${base} to list its models (${(e as Error).message}): is the server running, and ` +
        "is the URL right?",
    );
  }
  if (status !== 200) return { status };
  try {
    const body = JSON.parse(text) as { data?: Array<{ id?: unknown }> };
    if (!Array.isArray(body.data)) return { status };
    return { ids: body.data.flatMap((m) => (typeof m?.id === "string" ? [m.id] : [])) };
  } catch {
    return { status };
  }
}

/** The model to send to `base`: the first it lists; throws with what to do when there is none. */
export function pickModel(base: string, list: ModelList): string {
  if ("ids" in list && list.ids.length) return list.ids[0];
  throw new Error(
    "ids" in list
      ? `${base}/v1/models lists no model: pass --model NAME`
      : `${base}/v1/models answered HTTP ${list.status} without a model list: is ${base} an ` +
          "OpenAI-compatible server (vLLM, kvgate sim-replica, kvgate serve)? If it is, pass --model NAME",
  );
}

/** The model to send to `base` when none was given. */
export async function resolveModel(
  base: string,
  headers: Record<string, string>,
  dispatcher: Agent,
): Promise<string> {
  return pickModel(base, await fetchModels(base, dispatcher, headers));
}

/** GET {base}/v1/models; throws with what to do when nothing answers. */
export async function listModels(base: string, headers: Record<string, string> = {}): Promise<ModelList> {
  const dispatcher = new Agent();
  try {
    return await fetchModels(base.replace(/\/+$/, "").replace(/\/v1$/, ""), dispatcher, headers);
  } finally {
    await dispatcher.close();
  }
}
