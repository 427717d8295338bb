/** Pod / InferencePool / InferenceObjective / InferenceModelRewrite objects as the API server returns them, and a wait helper. */
import { setTimeout as sleep } from "node:timers/promises";

export const NS = "llm";

export interface PodOpts {
  ip?: string;
  labels?: Record<string, string>;
  ready?: boolean;
  deleting?: boolean;
  annotations?: Record<string, string>;
}

export function pod(name: string, o: PodOpts = {}): Record<string, unknown> {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name,
      namespace: NS,
      labels: o.labels ?? { app: "vllm" },
      ...(o.annotations ? { annotations: o.annotations } : {}),
      ...(o.deleting ? { deletionTimestamp: "2026-01-01T00:00:00Z" } : {}),
    },
    spec: { containers: [{ name: "vllm", image: "vllm/vllm-openai" }] },
    status: {
      phase: "Running",
      ...(o.ip !== "" ? { podIP: o.ip ?? "10.0.0.1" } : {}),
      conditions: [
        { type: "Initialized", status: "True" },
        { type: "Ready", status: o.ready === false ? "False" : "True" },
      ],
    },
  };
}

export function poolV1(name: string, matchLabels: Record<string, string>, ports: number[]) {
  return {
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name, namespace: NS },
    spec: {
      selector: { matchLabels },
      targetPorts: ports.map((number) => ({ number })),
      endpointPickerRef: { name: `${name}-epp`, port: { number: 9002 } },
    },
  };
}

export function poolV1alpha2(name: string, selector: Record<string, string>, port: number) {
  return {
    apiVersion: "inference.networking.x-k8s.io/v1alpha2",
    kind: "InferencePool",
    metadata: { name, namespace: NS },
    spec: { selector, targetPortNumber: port, extensionRef: { name: `${name}-epp` } },
  };
}

export function objective(
  name: string,
  pool: string,
  priority?: number,
  group = "inference.networking.k8s.io",
) {
  return {
    apiVersion: "llm-d.ai/v1alpha2",
    kind: "InferenceObjective",
    metadata: { name, namespace: NS },
    spec: {
      ...(priority !== undefined ? { priority } : {}),
      poolRef: { group, kind: "InferencePool", name: pool },
    },
  };
}

export function rewrite(
  name: string,
  pool: string,
  rules: Array<{ matches: string[]; targets: Array<[string, number?]> }>,
  createdAt = "2026-01-01T00:00:00Z",
) {
  return {
    apiVersion: "llm-d.ai/v1alpha2",
    kind: "InferenceModelRewrite",
    metadata: { name, namespace: NS, creationTimestamp: createdAt },
    spec: {
      poolRef: { group: "inference.networking.k8s.io", kind: "InferencePool", name: pool },
      rules: rules.map((r) => ({
        matches: r.matches.map((value) => ({ model: { type: "Exact", value } })),
        targets: r.targets.map(([modelRewrite, weight]) => ({
          modelRewrite,
          ...(weight !== undefined ? { weight } : {}),
        })),
      })),
    },
  };
}

/** Waits (polling) until `cond` holds; fails naming `what` and the last value seen. */
export async function until<T>(what: string, get: () => T, cond: (v: T) => boolean, ms = 8000): Promise<T> {
  const deadline = Date.now() + ms;
  let v = get();
  while (!cond(v)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(v)}`);
    await sleep(5);
    v = get();
  }
  return v;
}
