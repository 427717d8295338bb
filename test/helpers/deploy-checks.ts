/**
 * Cross-checks of the objects `kubectl kustomize deploy/...` renders (test/deploy-manifests.test.ts):
 * each kind at its API version with a valid name, Deployments whose selectors match their pods,
 * Services that reach ports pods open, a Role that grants exactly what kvgate's discovery watches,
 * an InferencePool with the fields GIE's CRD requires, and a picker whose flags name that pool and a
 * mounted config kvgate's own loader accepts without a warning.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { posix } from "node:path";
import { createScheduler } from "../../src/scheduler/scheduler.ts";
import { checkK8s, MODEL_OF_KIND } from "./k8s-schema-check.ts";

// biome-ignore lint/suspicious/noExplicitAny: rendered Kubernetes objects are free-form YAML
export type Obj = Record<string, any>;

const ROOT = new URL("../../", import.meta.url);
export const readRepoFile = (rel: string) => readFileSync(new URL(rel, ROOT), "utf8");

/** apiVersion per kind: everything deploy/ may render, and nothing else. */
export const API_VERSIONS: Record<string, string> = {
  ServiceAccount: "v1",
  ConfigMap: "v1",
  Service: "v1",
  Deployment: "apps/v1",
  Role: "rbac.authorization.k8s.io/v1",
  RoleBinding: "rbac.authorization.k8s.io/v1",
  InferencePool: "inference.networking.k8s.io/v1",
  InferenceObjective: "llm-d.ai/v1alpha2",
  Gateway: "gateway.networking.k8s.io/v1",
  HTTPRoute: "gateway.networking.k8s.io/v1",
  ServiceMonitor: "monitoring.coreos.com/v1",
  DestinationRule: "networking.istio.io/v1",
};
export const DNS1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

export function checkCommon(docs: Obj[], dir: string): void {
  const seen = new Set<string>();
  for (const d of docs) {
    const where = `deploy/${dir}: ${d.kind}/${d.metadata?.name}`;
    assert.ok(d.kind in API_VERSIONS, `${where}: unexpected kind`);
    assert.equal(d.apiVersion, API_VERSIONS[d.kind], `${where}: apiVersion`);
    assert.match(String(d.metadata?.name), DNS1123, `${where}: metadata.name`);
    assert.ok(d.metadata.name.length <= 63, `${where}: name longer than 63`);
    assert.equal(d.metadata.namespace, undefined, `${where}: names no namespace (kubectl apply -n decides)`);
    const key = `${d.kind}/${d.metadata.name}`;
    assert.ok(!seen.has(key), `deploy/${dir}: ${key} twice`);
    const model = MODEL_OF_KIND[d.kind];
    if (model !== undefined) assert.deepEqual(checkK8s(d, model), [], `${where}: fields of ${model}`);
    seen.add(key);
  }
}

export const byKind = (docs: Obj[], kind: string) => docs.filter((d) => d.kind === kind);
export function one(docs: Obj[], kind: string, name?: string): Obj {
  const found = byKind(docs, kind).filter((d) => name === undefined || d.metadata.name === name);
  assert.equal(found.length, 1, `exactly one ${kind}${name ? `/${name}` : ""}, found ${found.length}`);
  return found[0];
}
export const matches = (selector: Record<string, string>, labels: Record<string, string> | undefined) =>
  Object.keys(selector).length > 0 && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

/** `--flag value` or `--flag=value` from an argument list. */
export function flag(args: string[], name: string): string | undefined {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === name) return args[i + 1];
    if (args[i].startsWith(`${name}=`)) return args[i].slice(name.length + 1);
  }
  return undefined;
}

export function checkDeployments(docs: Obj[]): void {
  for (const dep of byKind(docs, "Deployment")) {
    const where = `Deployment/${dep.metadata.name}`;
    const pod = dep.spec.template;
    assert.ok(matches(dep.spec.selector.matchLabels, pod.metadata.labels), `${where}: selector ⊆ pod labels`);
    if (pod.spec.serviceAccountName !== undefined) one(docs, "ServiceAccount", pod.spec.serviceAccountName);
    assert.equal(pod.spec.securityContext?.runAsNonRoot, true, `${where}: runs as non-root`);
    const volumes = new Map<string, Obj>(pod.spec.volumes.map((v: Obj) => [v.name, v]));
    for (const v of volumes.values()) if (v.configMap !== undefined) one(docs, "ConfigMap", v.configMap.name);
    assert.ok(pod.spec.containers.length > 0, `${where}: containers`);
    for (const c of pod.spec.containers) {
      assert.match(String(c.image), /^[\w.-]+(\/[\w.-]+)+:[\w.-]+$/, `${where}/${c.name}: image with a tag`);
      assert.equal(c.securityContext?.allowPrivilegeEscalation, false, `${where}/${c.name}`);
      assert.ok(Array.isArray(c.ports) && c.ports.length > 0, `${where}/${c.name}: ports`);
      for (const p of c.ports) assert.ok(Number.isInteger(p.containerPort), `${where}/${c.name}: port`);
      for (const m of c.volumeMounts ?? [])
        assert.ok(volumes.has(m.name), `${where}/${c.name}: mount ${m.name} has a volume`);
    }
  }
}

/** Every Service targets ports some selected pod opens (rendered pods, or the pool's own). */
export function checkServices(docs: Obj[]): void {
  const pools = byKind(docs, "InferencePool");
  for (const svc of byKind(docs, "Service")) {
    const where = `Service/${svc.metadata.name}`;
    const selector = svc.spec.selector as Record<string, string>;
    const pods = byKind(docs, "Deployment").filter((d) => matches(selector, d.spec.template.metadata.labels));
    const pool = pools.find((p) => JSON.stringify(p.spec.selector.matchLabels) === JSON.stringify(selector));
    assert.ok(pods.length > 0 || pool !== undefined, `${where}: selects a rendered Deployment or the pool`);
    assert.ok(svc.spec.ports.length > 0, `${where}: ports`);
    for (const p of svc.spec.ports) {
      assert.ok(Number.isInteger(p.port) && p.port > 0 && p.port < 65536, `${where}: port ${p.port}`);
      const target = p.targetPort ?? p.port;
      if (pods.length > 0) {
        const opened = pods.flatMap((d) => d.spec.template.spec.containers.flatMap((c: Obj) => c.ports));
        assert.ok(
          opened.some((cp: Obj) => cp.name === target || cp.containerPort === target),
          `${where}: targetPort ${target} is a container port of the selected pods`,
        );
      } else {
        assert.ok(
          pool!.spec.targetPorts.some((tp: Obj) => tp.number === target),
          `${where}: targetPort ${target} is one of the pool's targetPorts`,
        );
      }
    }
  }
}

/** What kvgate's Kubernetes discovery lists and watches (and leader election writes). */
export const NEEDED: Array<[group: string, resource: string, verbs: string[]]> = [
  ["", "pods", ["get", "list", "watch"]],
  ["inference.networking.k8s.io", "inferencepools", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferencepools", ["get", "list", "watch"]],
  ["llm-d.ai", "inferenceobjectives", ["get", "list", "watch"]],
  ["llm-d.ai", "inferencemodelrewrites", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferenceobjectives", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferencemodelrewrites", ["get", "list", "watch"]],
  ["coordination.k8s.io", "leases", ["get", "create", "update"]],
];

export function checkRbac(docs: Obj[], sa: string): void {
  const binding = byKind(docs, "RoleBinding").find((b) =>
    b.subjects.some((s: Obj) => s.kind === "ServiceAccount" && s.name === sa),
  );
  assert.ok(binding, `a RoleBinding names ServiceAccount ${sa}`);
  assert.equal(binding.roleRef.apiGroup, "rbac.authorization.k8s.io");
  assert.equal(binding.roleRef.kind, "Role");
  const role = one(docs, "Role", binding.roleRef.name);
  const rules = role.rules as Obj[];
  for (const [group, resource, verbs] of NEEDED)
    for (const verb of verbs)
      assert.ok(
        rules.some(
          (r) => r.apiGroups.includes(group) && r.resources.includes(resource) && r.verbs.includes(verb),
        ),
        `Role/${role.metadata.name} grants ${verb} on ${resource}.${group || "core"}`,
      );
  // Least privilege: nothing beyond the list above, no wildcards.
  for (const r of rules)
    for (const group of r.apiGroups)
      for (const resource of r.resources)
        for (const verb of r.verbs)
          assert.ok(
            NEEDED.some(([g, res, vs]) => g === group && res === resource && vs.includes(verb)),
            `Role/${role.metadata.name}: ${verb} on ${resource}.${group || "core"} is more than discovery needs`,
          );
}

/** GIE's v1 InferencePool CRD (api/v1/inferencepool_types.go): the required fields and their limits. */
export function checkPool(pool: Obj): void {
  const labels = pool.spec.selector?.matchLabels;
  assert.ok(labels !== null && typeof labels === "object", "spec.selector.matchLabels");
  const n = Object.keys(labels).length;
  assert.ok(n >= 1 && n <= 64, "matchLabels has 1–64 labels");
  for (const v of Object.values(labels)) assert.equal(typeof v, "string", "label values are strings");
  const ports = (pool.spec.targetPorts as Obj[]).map((p) => p.number);
  assert.ok(ports.length >= 1 && ports.length <= 8, "targetPorts has 1–8 entries");
  assert.equal(new Set(ports).size, ports.length, "targetPorts are unique");
  for (const p of ports) assert.ok(Number.isInteger(p) && p >= 1 && p <= 65535, `target port ${p}`);
  const ref = pool.spec.endpointPickerRef;
  assert.equal(typeof ref?.name, "string", "endpointPickerRef.name");
  assert.ok(
    (ref.kind ?? "Service") !== "Service" || Number.isInteger(ref.port?.number),
    "port for a Service",
  );
  assert.ok(["FailOpen", "FailClose"].includes(ref.failureMode ?? "FailClose"), "failureMode");
}

/** The picker: its flags name the pool and a mounted config that loads without warnings. */
export async function checkPicker(docs: Obj[]): Promise<void> {
  const pool = one(docs, "InferencePool");
  checkPool(pool);
  const epp = byKind(docs, "Deployment").filter(
    (d) => d.spec.template.spec.containers[0].args?.[0] === "epp",
  );
  assert.equal(epp.length, 1, "one Deployment runs `kvgate epp`");
  const podSpec = epp[0].spec.template.spec;
  const c = podSpec.containers[0];
  const args = c.args as string[];
  assert.equal(flag(args, "--pool-name"), pool.metadata.name, "--pool-name is the InferencePool");
  assert.equal(flag(args, "--pool-group"), pool.apiVersion.split("/")[0], "--pool-group is the pool's group");
  // The pool is rendered without a namespace, so the picker must look in its own.
  assert.equal(flag(args, "--pool-namespace"), "$(NAMESPACE)");
  const ns = c.env.find((e: Obj) => e.name === "NAMESPACE");
  assert.equal(ns?.valueFrom?.fieldRef?.fieldPath, "metadata.namespace", "NAMESPACE from the downward API");

  const grpcPort = Number(flag(args, "--grpc-port") ?? 9002);
  const healthPort = Number(flag(args, "--grpc-health-port") ?? 9003);
  const metricsPort = Number(flag(args, "--metrics-port") ?? 9090);
  const opened = (c.ports as Obj[]).map((p) => p.containerPort);
  for (const p of [grpcPort, healthPort, metricsPort]) assert.ok(opened.includes(p), `container opens ${p}`);
  assert.deepEqual(c.readinessProbe.grpc, {
    port: healthPort,
    service: "envoy.service.ext_proc.v3.ExternalProcessor",
  });
  assert.deepEqual(c.livenessProbe.grpc, { port: healthPort, service: "liveness" });

  // endpointPickerRef → the Service → the container's ext_proc port.
  const ref = pool.spec.endpointPickerRef;
  const svc = one(docs, "Service", ref.name);
  assert.ok(
    matches(svc.spec.selector, epp[0].spec.template.metadata.labels),
    "the Service selects the picker",
  );
  const sp = (svc.spec.ports as Obj[]).find((p) => p.port === ref.port.number);
  assert.ok(sp, `Service/${ref.name} has port ${ref.port.number}`);
  const cp = (c.ports as Obj[]).find((p) => p.name === sp.targetPort || p.containerPort === sp.targetPort);
  assert.equal(cp?.containerPort, grpcPort, "the pool's picker port reaches --grpc-port");
  assert.equal(sp.appProtocol, "http2", "gRPC is announced as HTTP/2");

  // --config-file → a mount of a ConfigMap → its key → an EndpointPickerConfig kvgate loads cleanly.
  const configFile = flag(args, "--config-file");
  assert.ok(configFile, "--config-file");
  const mount = (c.volumeMounts as Obj[]).find((m) => posix.dirname(configFile) === m.mountPath);
  assert.ok(mount, `${configFile} is under a volume mount`);
  const volume = (podSpec.volumes as Obj[]).find((v) => v.name === mount.name);
  assert.ok(volume?.configMap, "the mount is a ConfigMap");
  const cm = one(docs, "ConfigMap", volume.configMap.name);
  const key = posix.basename(configFile);
  const text = cm.data?.[key];
  assert.equal(typeof text, "string", `ConfigMap ${cm.metadata.name} has key ${key}`);
  const { warnings } = await createScheduler(text, { seed: 1 });
  assert.deepEqual(warnings, [], "the EndpointPickerConfig loads without warnings");
  assert.equal(
    text,
    readRepoFile("config/examples/default.yaml"),
    "the ConfigMap holds kvgate's default config",
  );

  for (const o of byKind(docs, "InferenceObjective")) {
    assert.equal(o.spec.poolRef.name, pool.metadata.name, `InferenceObjective/${o.metadata.name} poolRef`);
    assert.ok(Number.isInteger(o.spec.priority), "priority is an integer");
  }
  checkRbac(docs, podSpec.serviceAccountName);
}
