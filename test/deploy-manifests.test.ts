/**
 * deploy/: every kustomization renders with `kubectl kustomize` and every object it renders is one a
 * cluster would accept and that fits the others — the picker's flags name the InferencePool, the
 * config file it is told to read is the mounted ConfigMap and loads with kvgate's own loader without
 * a warning, Services target ports the pods open, the RBAC Role grants what discovery watches, the
 * HTTPRoute's backend is the pool (the checks are in helpers/deploy-checks.ts; the Envoy bootstrap's
 * own are in deploy-envoy.test.ts).
 *
 * Needs kubectl ($KUBECTL, else `kubectl` on the PATH): `.ci/run` installs Debian's kubernetes-client
 * (kubectl 1.20, whose embedded kustomize is v2.0.3) when none is present, so the manifests use only
 * what that kustomize supports; current kubectl (kustomize v5) renders them too. Without kubectl the
 * rendering tests are skipped on a developer machine and FAIL in CI (CI=true).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { posix } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { parse, parseAllDocuments } from "yaml";
import {
  byKind,
  checkCommon,
  checkDeployments,
  checkPicker,
  checkServices,
  DNS1123,
  flag,
  matches,
  type Obj,
  one,
  readRepoFile as read,
} from "./helpers/deploy-checks.ts";
import { checkK8s } from "./helpers/k8s-schema-check.ts";

const ROOT = fileURLToPath(new URL("../", import.meta.url));

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

test("deploy/overlays/gateway-istio renders: Istio speaks TLS to the picker's Service", {
  skip,
}, async () => {
  const docs = render("overlays/gateway-istio");
  checkCommon(docs, "overlays/gateway-istio");
  await checkPicker(docs);
  one(docs, "HTTPRoute");
  const rule = one(docs, "DestinationRule");
  assert.equal(rule.spec.host, one(docs, "InferencePool").spec.endpointPickerRef.name);
  assert.equal(rule.spec.trafficPolicy.tls.mode, "SIMPLE");
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
