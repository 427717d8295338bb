/**
 * deploy/: every kustomization renders with `kubectl kustomize` and every object it renders is one a
 * cluster would accept and that fits the others — the picker's flags name the InferencePool, the
 * config file it is told to read is the mounted ConfigMap and loads with kvgate's own loader without
 * a warning, Services target ports the pods open, the RBAC Role grants what discovery watches, the
 * HTTPRoute's backend is the pool. The standalone Envoy bootstrap is checked field by field against
 * Envoy's API protos (no Envoy binary can run here).
 *
 * Needs kubectl ($KUBECTL, else `kubectl` on the PATH): `.ci/run` installs Debian's kubernetes-client
 * (kubectl 1.20, whose embedded kustomize is v2.0.3) when none is present, so the manifests use only
 * what that kustomize supports; current kubectl (kustomize v5) renders them too. Without kubectl the
 * rendering tests are skipped on a developer machine and FAIL in CI (CI=true).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { posix } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { parse, parseAllDocuments } from "yaml";
import { CONTROL_HEADERS } from "../src/gateway/headers.ts";
import { createScheduler } from "../src/scheduler/scheduler.ts";
import { EnvoyProtos } from "./helpers/envoy-proto-check.ts";
import { checkK8s, MODEL_OF_KIND } from "./helpers/k8s-schema-check.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));
const read = (rel: string) => readFileSync(`${ROOT}${rel}`, "utf8");

const KUBECTL = process.env.KUBECTL || "kubectl";
function kubectlMissing(): string | undefined {
  try {
    execFileSync(KUBECTL, ["version", "--client"], { stdio: "ignore", timeout: 30_000 });
    return undefined;
  } catch {
    return `${KUBECTL} not found: install Debian's kubernetes-client (apt-get install -y kubernetes-client), or run .ci/run`;
  }
}
const missing = kubectlMissing();
const skip = missing !== undefined && process.env.CI !== "true" ? missing : false;

// biome-ignore lint/suspicious/noExplicitAny: rendered Kubernetes objects are free-form YAML
type Obj = Record<string, any>;

function render(dir: string): Obj[] {
  if (missing !== undefined) assert.fail(missing);
  const out = execFileSync(KUBECTL, ["kustomize", `${ROOT}deploy/${dir}`], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
    timeout: 60_000,
  });
  const docs = parseAllDocuments(out).map((d) => {
    assert.equal(d.errors.length, 0, `deploy/${dir}: ${d.errors.map((e) => e.message).join("; ")}`);
    return d.toJS() as Obj;
  });
  return docs.filter((d) => d !== null);
}

/** apiVersion per kind: everything deploy/ may render, and nothing else. */
const API_VERSIONS: Record<string, string> = {
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
};
const DNS1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function checkCommon(docs: Obj[], dir: string): void {
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

const byKind = (docs: Obj[], kind: string) => docs.filter((d) => d.kind === kind);
function one(docs: Obj[], kind: string, name?: string): Obj {
  const found = byKind(docs, kind).filter((d) => name === undefined || d.metadata.name === name);
  assert.equal(found.length, 1, `exactly one ${kind}${name ? `/${name}` : ""}, found ${found.length}`);
  return found[0];
}
const matches = (selector: Record<string, string>, labels: Record<string, string> | undefined) =>
  Object.keys(selector).length > 0 && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

/** `--flag value` or `--flag=value` from an argument list. */
function flag(args: string[], name: string): string | undefined {
  for (let i = 0; i < args.length; i++) {
    if (args[i] === name) return args[i + 1];
    if (args[i].startsWith(`${name}=`)) return args[i].slice(name.length + 1);
  }
  return undefined;
}

function checkDeployments(docs: Obj[]): void {
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
function checkServices(docs: Obj[]): void {
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
const NEEDED: Array<[group: string, resource: string, verbs: string[]]> = [
  ["", "pods", ["get", "list", "watch"]],
  ["inference.networking.k8s.io", "inferencepools", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferencepools", ["get", "list", "watch"]],
  ["llm-d.ai", "inferenceobjectives", ["get", "list", "watch"]],
  ["llm-d.ai", "inferencemodelrewrites", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferenceobjectives", ["get", "list", "watch"]],
  ["inference.networking.x-k8s.io", "inferencemodelrewrites", ["get", "list", "watch"]],
  ["coordination.k8s.io", "leases", ["get", "create", "update"]],
];

function checkRbac(docs: Obj[], sa: string): void {
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
function checkPool(pool: Obj): void {
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
async function checkPicker(docs: Obj[]): Promise<void> {
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
  assert.equal(text, read("config/examples/default.yaml"), "the ConfigMap holds kvgate's default config");

  for (const o of byKind(docs, "InferenceObjective")) {
    assert.equal(o.spec.poolRef.name, pool.metadata.name, `InferenceObjective/${o.metadata.name} poolRef`);
    assert.ok(Number.isInteger(o.spec.priority), "priority is an integer");
  }
  checkRbac(docs, podSpec.serviceAccountName);
}

test("the Kubernetes field check rejects misspelt fields and wrong value types", () => {
  const dep = parse(read("deploy/base/deployment.yaml")) as Obj;
  assert.deepEqual(checkK8s(dep, "V1Deployment"), []);
  const c = dep.spec.template.spec.containers[0];
  c.readinesProbe = c.readinessProbe;
  c.ports[0].containerPort = "9002";
  dep.spec.template.metadata.labels.tier = 1;
  const problems = checkK8s(dep, "V1Deployment");
  assert.deepEqual(problems, [
    "$.spec.template.metadata.labels.tier: expected a string, got 1",
    '$.spec.template.spec.containers[0].ports[0].containerPort: expected a number, got "9002"',
    '$.spec.template.spec.containers[0].readinesProbe: V1Container has no field "readinesProbe"',
  ]);
});

test("deploy/base/epp-config.yaml is config/examples/default.yaml (kustomize reads only its own directory)", () => {
  assert.equal(read("deploy/base/epp-config.yaml"), read("config/examples/default.yaml"));
});

test("deploy/base renders: the picker, its RBAC, config and InferencePool fit together", {
  skip,
}, async () => {
  const docs = render("base");
  checkCommon(docs, "base");
  checkDeployments(docs);
  checkServices(docs);
  await checkPicker(docs);
});

test("deploy/overlays/gateway renders: a Gateway and an HTTPRoute to the InferencePool", {
  skip,
}, async () => {
  const docs = render("overlays/gateway");
  checkCommon(docs, "overlays/gateway");
  checkDeployments(docs);
  checkServices(docs);
  await checkPicker(docs);
  const gw = one(docs, "Gateway");
  assert.equal(typeof gw.spec.gatewayClassName, "string");
  assert.ok(gw.spec.listeners.length > 0);
  for (const l of gw.spec.listeners) {
    assert.match(l.name, DNS1123);
    assert.ok(["HTTP", "HTTPS"].includes(l.protocol) && Number.isInteger(l.port));
  }
  const route = one(docs, "HTTPRoute");
  const pool = one(docs, "InferencePool");
  for (const p of route.spec.parentRefs) {
    assert.equal(p.kind ?? "Gateway", "Gateway");
    one(docs, "Gateway", p.name);
  }
  const backends = (route.spec.rules as Obj[]).flatMap((r) => r.backendRefs);
  assert.ok(backends.length > 0, "the route has backends");
  for (const b of backends)
    assert.deepEqual(b, {
      group: "inference.networking.k8s.io",
      kind: "InferencePool",
      name: pool.metadata.name,
    });
});

test("deploy/overlays/standalone-envoy renders: Envoy runs deploy/envoy/envoy.yaml unchanged", {
  skip,
}, async () => {
  const docs = render("overlays/standalone-envoy");
  checkCommon(docs, "overlays/standalone-envoy");
  checkDeployments(docs);
  checkServices(docs);
  await checkPicker(docs);
  const envoy = one(docs, "Deployment", "kvgate-envoy");
  const c = envoy.spec.template.spec.containers[0];
  const configPath = flag(c.args, "-c");
  assert.ok(configPath, "envoy -c <bootstrap>");
  const mount = (c.volumeMounts as Obj[]).find((m) => posix.dirname(configPath) === m.mountPath);
  const volume = (envoy.spec.template.spec.volumes as Obj[]).find((v) => v.name === mount?.name);
  const cm = one(docs, "ConfigMap", volume?.configMap?.name);
  assert.equal(
    cm.data[posix.basename(configPath)],
    read("deploy/envoy/envoy.yaml"),
    "the bootstrap, as it is",
  );

  // The bootstrap's names resolve to Services rendered here, on the ports it dials.
  const bootstrap = parse(read("deploy/envoy/envoy.yaml"));
  for (const cluster of bootstrap.static_resources.clusters as Obj[]) {
    if (cluster.type !== "STRICT_DNS") continue;
    const sa = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address;
    const svc = one(docs, "Service", sa.address);
    assert.ok(
      svc.spec.ports.some((p: Obj) => p.port === sa.port_value),
      `${cluster.name}: Service/${sa.address} has port ${sa.port_value}`,
    );
  }
  const fallback = one(docs, "Service", "vllm-pool-fallback");
  assert.equal(fallback.spec.clusterIP, "None", "headless: DNS returns each ready pod");
  assert.deepEqual(fallback.spec.selector, one(docs, "InferencePool").spec.selector.matchLabels);
});

test("deploy/monitoring renders a ServiceMonitor for the picker's metrics port", { skip }, () => {
  const docs = render("monitoring");
  checkCommon(docs, "monitoring");
  const sm = one(docs, "ServiceMonitor");
  const base = render("base");
  const svc = byKind(base, "Service").find((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
  assert.ok(svc, "selects the picker's Service by its labels");
  for (const ep of sm.spec.endpoints)
    assert.ok(
      svc.spec.ports.some((p: Obj) => p.name === ep.port),
      `endpoint port ${ep.port} is a named Service port`,
    );
});

test("deploy/examples/vllm-deployment.yaml: pods the pool selects, with prefix caching and KV events", () => {
  const dep = parse(read("deploy/examples/vllm-deployment.yaml")) as Obj;
  assert.deepEqual(checkK8s(dep, "V1Deployment"), []);
  const pool = parse(read("deploy/base/inferencepool.yaml")) as Obj;
  const pod = dep.spec.template;
  assert.ok(matches(dep.spec.selector.matchLabels, pod.metadata.labels));
  assert.ok(matches(pool.spec.selector.matchLabels, pod.metadata.labels), "the pool selects these pods");
  const c = pod.spec.containers[0];
  const opened = (c.ports as Obj[]).map((p) => p.containerPort);
  for (const tp of pool.spec.targetPorts) assert.ok(opened.includes(tp.number), `opens ${tp.number}`);
  assert.ok(c.args.includes("--enable-prefix-caching"));
  const kv = JSON.parse(flag(c.args, "--kv-events-config")!);
  // vLLM's KVEventsConfig (vllm/config/kv_events.py) field names, and what kvgate subscribes to.
  const fields = ["enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "topic"];
  for (const k of Object.keys(kv)) assert.ok(fields.includes(k), `KVEventsConfig has ${k}`);
  assert.equal(kv.enable_kv_cache_events, true);
  assert.equal(kv.publisher, "zmq");
  assert.equal(kv.endpoint, "tcp://*:5557", "binds, so kvgate dials each pod on the default port");
  assert.ok(kv.topic.startsWith("kv@"), "kvgate's subscriber filters on the kv@ prefix");
  assert.ok(c.env.some((e: Obj) => e.name === "POD_NAME") && kv.topic.includes("$(POD_NAME)"));
  assert.match(c.env.find((e: Obj) => e.name === "PYTHONHASHSEED")?.value ?? "", /^\d+$/);
  assert.equal(c.readinessProbe.httpGet.path, "/health");
  assert.ok(Number(c.resources.requests["nvidia.com/gpu"]) >= 1, "requests a GPU");
});

// --- The standalone Envoy bootstrap -------------------------------------------------------------

const HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const EXT_PROC = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor";
const ROUTER = "envoy.extensions.filters.http.router.v3.Router";
const HEADER_MUTATION = "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";
const protos = new EnvoyProtos([
  "envoy/config/bootstrap/v3/bootstrap.proto",
  "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
  "envoy/extensions/filters/http/router/v3/router.proto",
  "envoy/extensions/filters/http/ext_proc/v3/ext_proc.proto",
  "envoy/extensions/filters/http/health_check/v3/health_check.proto",
  "envoy/extensions/filters/http/header_mutation/v3/header_mutation.proto",
  "envoy/extensions/transport_sockets/tls/v3/tls.proto",
  "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
]);
const bootstrap = () => parse(read("deploy/envoy/envoy.yaml")) as Obj;
const inferenceHcm = (b: Obj) =>
  (b.static_resources.listeners as Obj[]).find((l) => l.name === "inference")!.filter_chains[0].filters[0]
    .typed_config as Obj;

test("envoy.yaml: every field is one of Envoy's v3 API, every enum value a name it knows", () => {
  assert.deepEqual(protos.check(bootstrap(), "envoy.config.bootstrap.v3.Bootstrap"), []);
});

test("envoy.yaml: the proto check rejects misspelt fields, bad enum values, unknown @types", () => {
  const b = bootstrap();
  const hcm = inferenceHcm(b);
  const ext = (hcm.http_filters as Obj[]).find((f) => f.name === "envoy.filters.http.ext_proc")!.typed_config;
  ext.processing_mode.request_body_mode = "FULL_DUPLEX";
  ext.procesing_mode = {};
  b.static_resources.clusters[0].connect_timeout = "250ms";
  (hcm.http_filters as Obj[]).at(-1)!.typed_config["@type"] = "type.googleapis.com/envoy.filters.http.Router";
  const problems = protos.check(b, "envoy.config.bootstrap.v3.Bootstrap");
  assert.equal(problems.length, 4, problems.join("\n"));
  assert.ok(problems.some((p) => p.includes('"FULL_DUPLEX" is not a value of')));
  assert.ok(problems.some((p) => p.includes('has no field "procesing_mode"')));
  assert.ok(problems.some((p) => p.includes("connect_timeout: a Duration")));
  assert.ok(problems.some((p) => p.includes("envoy.filters.http.Router is not a known message")));
});

test("envoy.yaml: listeners, filters in order, ext_proc as llm-d's EPP needs it", () => {
  const b = bootstrap();
  for (const l of b.static_resources.listeners as Obj[]) {
    assert.equal(typeof l.address.socket_address.address, "string", `${l.name}: address`);
    assert.ok(Number.isInteger(l.address.socket_address.port_value), `${l.name}: port`);
    assert.ok(l.filter_chains.length > 0, `${l.name}: filter_chains`);
    const hcm = l.filter_chains[0].filters[0];
    assert.equal(hcm.name, "envoy.filters.network.http_connection_manager");
    assert.equal(hcm.typed_config["@type"], `type.googleapis.com/${HCM}`);
    const filters = hcm.typed_config.http_filters as Obj[];
    assert.equal(filters.at(-1)!.typed_config["@type"], `type.googleapis.com/${ROUTER}`, "router last");
  }
  const filters = inferenceHcm(b).http_filters as Obj[];
  const types = filters.map((f) => String(f.typed_config["@type"]).replace("type.googleapis.com/", ""));
  assert.deepEqual(types, [HEADER_MUTATION, EXT_PROC, ROUTER]);
  // A client's destination header is gone before ext_proc runs (and so before any route is chosen).
  assert.deepEqual(filters[0].typed_config.mutations.request_mutations, [
    { remove: "x-gateway-destination-endpoint" },
  ]);
  const ext = filters[1].typed_config;
  assert.deepEqual(ext.processing_mode, {
    request_header_mode: "SEND",
    response_header_mode: "SEND",
    request_body_mode: "FULL_DUPLEX_STREAMED",
    response_body_mode: "FULL_DUPLEX_STREAMED",
    request_trailer_mode: "SEND",
    response_trailer_mode: "SEND",
  });
  assert.equal(ext.allow_mode_override, false);
  assert.ok(Number.parseFloat(ext.message_timeout) >= 60, "message_timeout covers a long prompt's upload");
  const pool = parse(read("deploy/base/inferencepool.yaml")) as Obj;
  assert.equal(
    ext.failure_mode_allow,
    pool.spec.endpointPickerRef.failureMode === "FailOpen",
    "failure_mode_allow follows the InferencePool's failureMode",
  );
});

test("envoy.yaml: clusters exist, ORIGINAL_DST follows the picker's header, ext_proc over h2/TLS", () => {
  const b = bootstrap();
  const clusters = new Map<string, Obj>((b.static_resources.clusters as Obj[]).map((c) => [c.name, c]));
  assert.equal(clusters.size, b.static_resources.clusters.length, "cluster names are unique");
  const referenced: string[] = [];
  for (const l of b.static_resources.listeners as Obj[]) {
    const hcm = l.filter_chains[0].filters[0].typed_config;
    for (const vh of hcm.route_config.virtual_hosts)
      for (const r of vh.routes) referenced.push(r.route.cluster);
    for (const f of hcm.http_filters)
      if (f.typed_config.grpc_service) referenced.push(f.typed_config.grpc_service.envoy_grpc.cluster_name);
  }
  for (const name of referenced) assert.ok(clusters.has(name), `cluster ${name} exists`);
  for (const c of clusters.values())
    if (c.load_assignment) assert.equal(c.load_assignment.cluster_name, c.name, `${c.name}: load_assignment`);

  // The route to the picked pod is taken only when the picker set the header.
  const routes = inferenceHcm(b).route_config.virtual_hosts[0].routes as Obj[];
  assert.deepEqual(routes[0].match.headers, [
    { name: "x-gateway-destination-endpoint", present_match: true },
  ]);
  const dst = clusters.get(routes[0].route.cluster)!;
  assert.equal(dst.type, "ORIGINAL_DST");
  assert.equal(dst.lb_policy, "CLUSTER_PROVIDED");
  assert.deepEqual(dst.original_dst_lb_config, {
    use_http_header: true,
    http_header_name: "x-gateway-destination-endpoint",
  });
  assert.ok(CONTROL_HEADERS.includes(dst.original_dst_lb_config.http_header_name), "kvgate strips it");
  assert.equal(routes.at(-1)!.route.cluster, "vllm_pool_fallback", "fail-open route last");

  const ext = clusters.get("ext_proc")!;
  for (const c of [ext, dst, clusters.get("vllm_pool_fallback")!]) {
    const t = c.circuit_breakers.thresholds[0];
    for (const k of ["max_connections", "max_pending_requests", "max_requests"])
      assert.ok(t[k] > 1024, `${c.name}: ${k} above Envoy's default 1,024`);
  }
  const opts = ext.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
  assert.ok(opts.explicit_http_config.http2_protocol_options, "gRPC needs HTTP/2");
  assert.equal(
    ext.transport_socket.typed_config["@type"],
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
  );
  assert.deepEqual(ext.transport_socket.typed_config.common_tls_context.alpn_protocols, ["h2"]);
  assert.equal(
    ext.health_checks[0].grpc_health_check.service_name,
    "envoy.service.ext_proc.v3.ExternalProcessor",
  );
  const sa = ext.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address;
  const grpc = inferenceHcm(b).http_filters[1].typed_config.grpc_service.envoy_grpc;
  assert.equal(grpc.authority, `${sa.address}:${sa.port_value}`, "the :authority names the picker's Service");
});
