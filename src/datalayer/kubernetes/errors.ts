/**
 * One line for a failed Kubernetes API call, from whatever @kubernetes/client-node threw: the HTTP
 * status (ApiException.code, or Watch's statusCode), the API server's Status message when the body
 * carries one, and what to do for the statuses a misconfigured deployment hits (401, 403).
 */
import { isRecord } from "./objects.ts";

/** The HTTP status of a failure from client-node, or null (network error, timeout, abort). */
export function statusOf(err: unknown): number | null {
  if (!isRecord(err) && !(err instanceof Error)) return null;
  const e = err as { code?: unknown; statusCode?: unknown };
  if (typeof e.code === "number") return e.code;
  if (typeof e.statusCode === "number") return e.statusCode;
  return null;
}

function statusMessage(body: unknown): string | null {
  let b = body;
  if (typeof b === "string") {
    try {
      b = JSON.parse(b);
    } catch {
      return null;
    }
  }
  return isRecord(b) && typeof b.message === "string" ? b.message : null;
}

/** `HTTP 403: <server's message> (<what to do>)`, or the network error and its cause. */
export function describeKubeError(err: unknown, resource: string): string {
  const status = statusOf(err);
  if (status === null) {
    const msg = err instanceof Error ? err.message.split("\n")[0] : String(err);
    const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : "";
    return `${msg}${cause}`;
  }
  const server = statusMessage((err as { body?: unknown }).body);
  const text = (server ?? (err instanceof Error ? err.message.split("\n")[0] : "")).slice(0, 200);
  const hint =
    status === 401
      ? " (the credentials were refused: check the kubeconfig's user or the service account token)"
      : status === 403
        ? ` (grant this service account ${resource} with an RBAC Role in the namespace)`
        : "";
  return `HTTP ${status}: ${text}${hint}`;
}
