/**
 * A strict check of built-in Kubernetes objects against the API's own field list, as generated into
 * @kubernetes/client-node's models from the Kubernetes OpenAPI spec: every key must be a field of its
 * type and every value of the field's JSON type. `kubectl kustomize` does not validate fields and no
 * API server can run on the build machines, so a misspelt `readinesProbe` would otherwise pass.
 * Custom resources (InferencePool, HTTPRoute, ...) are not covered; their tests check them by hand.
 */
import * as k8s from "@kubernetes/client-node";

interface Attribute {
  baseName: string;
  type: string;
}
type Model = { getAttributeTypeMap?: () => Attribute[] };
const models = k8s as unknown as Record<string, Model | undefined>;

/** The client-node model of each built-in kind deploy/ renders. */
export const MODEL_OF_KIND: Record<string, string> = {
  ConfigMap: "V1ConfigMap",
  Deployment: "V1Deployment",
  Role: "V1Role",
  RoleBinding: "V1RoleBinding",
  Service: "V1Service",
  ServiceAccount: "V1ServiceAccount",
};

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

/** Every problem found in `value` read as the model `type`, each with its path. */
export function checkK8s(value: unknown, type: string, path = "$"): string[] {
  const out: string[] = [];
  check(value, type, path, out);
  return out;
}

function check(value: unknown, type: string, path: string, out: string[]): void {
  const array = /^Array<(.+)>$/.exec(type);
  if (array !== null) {
    if (!Array.isArray(value)) out.push(`${path}: expected a list`);
    else for (const [i, v] of value.entries()) check(v, array[1], `${path}[${i}]`, out);
    return;
  }
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map !== null) {
    if (!isObject(value)) out.push(`${path}: expected a map`);
    else for (const [k, v] of Object.entries(value)) check(v, map[1], `${path}.${k}`, out);
    return;
  }
  switch (type) {
    case "string":
      if (typeof value !== "string") out.push(`${path}: expected a string, got ${JSON.stringify(value)}`);
      return;
    case "number":
      if (typeof value !== "number") out.push(`${path}: expected a number, got ${JSON.stringify(value)}`);
      return;
    case "boolean":
      if (typeof value !== "boolean") out.push(`${path}: expected a boolean, got ${JSON.stringify(value)}`);
      return;
    case "IntOrString":
      if (typeof value !== "string" && !Number.isInteger(value))
        out.push(`${path}: expected a port number or name, got ${JSON.stringify(value)}`);
      return;
    case "Date":
    case "any":
    case "object":
      return;
  }
  const model = models[type];
  if (model?.getAttributeTypeMap === undefined) {
    out.push(`${path}: no model ${type} in @kubernetes/client-node`);
    return;
  }
  if (!isObject(value)) {
    out.push(`${path}: ${type} must be an object, got ${JSON.stringify(value)}`);
    return;
  }
  const fields = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    const t = fields.get(k);
    if (t === undefined) out.push(`${path}.${k}: ${type} has no field "${k}"`);
    else check(v, t, `${path}.${k}`, out);
  }
}
