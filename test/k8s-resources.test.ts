/**
 * Kubernetes discovery, the pool's other resources and the connection: InferenceObjectives and
 * InferenceModelRewrites into resources(), absent CRDs, kubeconfig files, through the real
 * @kubernetes/client-node against the in-process fake API server.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { type KubernetesPool, startKubernetesPool } from "../src/datalayer/kubernetes/pool.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, objective, pod, poolV1, rewrite, until } from "./helpers/kube-fixtures.ts";

const PODS = podsPath(NS);
const POOLS = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
const OBJECTIVES = crdPath("llm-d.ai", "v1alpha2", NS, "inferenceobjectives");
const LEGACY_OBJECTIVES = crdPath("inference.networking.x-k8s.io", "v1alpha2", NS, "inferenceobjectives");
const REWRITES = crdPath("llm-d.ai", "v1alpha2", NS, "inferencemodelrewrites");
const LEGACY_REWRITES = crdPath("inference.networking.x-k8s.io", "v1alpha2", NS, "inferencemodelrewrites");

let api: FakeKubeApi;
const logs: string[] = [];
const fast = { backoffMs: { initial: 10, max: 50 }, absentRetryMs: 50 };

before(async () => {
  api = await FakeKubeApi.start();
});
after(async () => {
  await api.close();
});

function start(poolName: string, group?: string): KubernetesPool {
  return startKubernetesPool({
    poolName,
    namespace: NS,
    group,
    kubeconfig: api.kubeConfig(),
    log: (l) => logs.push(l),
    retry: fast,
  });
}

const ids = (p: KubernetesPool) =>
  p.source
    .current()
    .map((e) => e.id)
    .sort();

test("objective priorities and model rewrites appear in resources() and update on change", async () => {
  api.apply(POOLS, poolV1("res", { app: "res" }, [8000]));
  api.apply(OBJECTIVES, objective("critical", "res", 10));
  api.apply(OBJECTIVES, objective("batch", "res", -1));
  api.apply(OBJECTIVES, objective("unset", "res"));
  api.apply(OBJECTIVES, objective("elsewhere", "other-pool", 5));
  api.apply(
    REWRITES,
    rewrite(
      "canary",
      "res",
      [
        {
          matches: ["llama"],
          targets: [
            ["llama-v2", 90],
            ["llama-v3", 10],
          ],
        },
      ],
      "2026-02-01T00:00:00Z",
    ),
  );
  api.apply(
    REWRITES,
    rewrite("catch-all", "res", [{ matches: [], targets: [["default-model"]] }], "2026-01-01T00:00:00Z"),
  );
  const p = start("res");
  const seen: number[] = [];
  p.onResources((r) => seen.push(r.objectives.size));
  try {
    await p.ready;
    const r = await until(
      "resources listed",
      () => p.resources(),
      (v) => v.objectives.size === 3 && v.rewrites.length === 2,
    );
    assert.deepEqual([...r.objectives].sort(), [
      ["batch", -1],
      ["critical", 10],
      ["unset", 0],
    ]);
    assert.deepEqual(
      r.rewrites.map((w) => [w.name, w.createdAtMs]),
      [
        ["catch-all", Date.parse("2026-01-01T00:00:00Z")],
        ["canary", Date.parse("2026-02-01T00:00:00Z")],
      ],
    );
    assert.deepEqual(r.rewrites[1].rules, [
      {
        matches: ["llama"],
        targets: [
          { model: "llama-v2", weight: 90 },
          { model: "llama-v3", weight: 10 },
        ],
      },
    ]);
    assert.deepEqual(r.rewrites[0].rules, [
      { matches: [], targets: [{ model: "default-model", weight: null }] },
    ]);

    api.apply(OBJECTIVES, objective("batch", "res", -5));
    await until(
      "priority change",
      () => p.resources().objectives.get("batch"),
      (v) => v === -5,
    );
    api.remove(OBJECTIVES, "critical");
    await until(
      "objective deleted",
      () => p.resources().objectives.has("critical"),
      (v) => !v,
    );
    api.apply(OBJECTIVES, objective("unset", "other-pool", 3)); // moves to another pool
    await until(
      "objective moved",
      () => p.resources().objectives.has("unset"),
      (v) => !v,
    );
    api.remove(REWRITES, "canary");
    await until(
      "rewrite deleted",
      () => p.resources().rewrites.length,
      (n) => n === 1,
    );
    // A rewrite with mixed weights is invalid (all or none) and is left out, with a log line.
    api.apply(REWRITES, rewrite("mixed", "res", [{ matches: ["a"], targets: [["b", 1], ["c"]] }]));
    await until(
      "mixed logged",
      () => logs.some((l) => l.includes("set a weight on every target or on none")),
      Boolean,
    );
    assert.deepEqual(
      p.resources().rewrites.map((w) => w.name),
      ["catch-all"],
    );
    assert.ok(seen.length >= 4, "a change event per change");
  } finally {
    await p.close();
    api.remove(POOLS, "res");
    for (const n of ["batch", "unset", "elsewhere"]) api.remove(OBJECTIVES, n);
    for (const n of ["catch-all", "mixed"]) api.remove(REWRITES, n);
  }
});

test("absent CRDs are skipped with one log line and picked up when installed; pods are discovered meanwhile", async () => {
  for (const c of [OBJECTIVES, LEGACY_OBJECTIVES, REWRITES, LEGACY_REWRITES]) api.setAbsent(c, true);
  api.apply(POOLS, poolV1("nocrd", { app: "nocrd" }, [8000]));
  api.apply(PODS, pod("nocrd-0", { ip: "10.7.0.1", labels: { app: "nocrd" } }));
  const from = logs.length;
  const p = start("nocrd");
  try {
    await p.ready;
    assert.deepEqual(ids(p), ["10.7.0.1:8000"]);
    // Let several absent-retries pass: still one line per resource.
    await new Promise((r) => setTimeout(r, 200));
    const absentLines = logs.slice(from).filter((l) => l.includes("CRD not installed"));
    assert.equal(absentLines.length, 4, absentLines.join("\n"));
    assert.equal(p.resources().objectives.size, 0);
    // Only the legacy group gets installed: its objectives are used.
    api.setAbsent(LEGACY_OBJECTIVES, false);
    api.apply(LEGACY_OBJECTIVES, {
      ...objective("legacy-obj", "nocrd", 2),
      apiVersion: "inference.networking.x-k8s.io/v1alpha2",
    });
    await until(
      "legacy objective",
      () => p.resources().objectives.get("legacy-obj"),
      (v) => v === 2,
    );
    // Then llm-d's group appears: it wins, the legacy objects are ignored (as llm-d-router does).
    api.setAbsent(OBJECTIVES, false);
    api.apply(OBJECTIVES, objective("new-obj", "nocrd", 7));
    await until(
      "llm-d.ai objective preferred",
      () => [...p.resources().objectives.keys()].join(),
      (v) => v === "new-obj",
    );
    // llm-d's CRD is uninstalled while watched: its objects go, the legacy ones are used again.
    api.setAbsent(OBJECTIVES, true);
    api.endWatches();
    await until(
      "fallback to legacy after uninstall",
      () => [...p.resources().objectives.keys()].join(),
      (v) => v === "legacy-obj",
    );
    api.setAbsent(OBJECTIVES, false);
    api.apply(PODS, pod("nocrd-1", { ip: "10.7.0.2", labels: { app: "nocrd" } }));
    await until(
      "pods still tracked",
      () => ids(p),
      (v) => v.length === 2,
    );
  } finally {
    await p.close();
    for (const c of [REWRITES, LEGACY_REWRITES]) api.setAbsent(c, false);
    api.remove(POOLS, "nocrd");
    api.remove(OBJECTIVES, "new-obj");
    api.remove(LEGACY_OBJECTIVES, "legacy-obj");
    for (const n of ["nocrd-0", "nocrd-1"]) api.remove(PODS, n);
  }
});

test("a kubeconfig file is read (as from KUBECONFIG); with no configuration at all the error says what to do", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-kube-"));
  const file = join(dir, "config");
  writeFileSync(
    file,
    `apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "${api.url}", insecure-skip-tls-verify: true}}]
users: [{name: me, user: {token: t0ken}}]
contexts: [{name: fake, context: {cluster: fake, user: me}}]
current-context: fake
`,
  );
  api.apply(POOLS, poolV1("kc", { app: "kc" }, [8000]));
  api.apply(PODS, pod("kc-0", { ip: "10.10.0.1", labels: { app: "kc" } }));
  const env = { KUBECONFIG: process.env.KUBECONFIG, HOME: process.env.HOME };
  const p = startKubernetesPool({
    poolName: "kc",
    namespace: NS,
    kubeconfig: file,
    log: () => {},
    retry: fast,
  });
  try {
    await p.ready;
    assert.deepEqual(ids(p), ["10.10.0.1:8000"]);
    // The kubeconfig's credentials go with every request, lists and watches alike.
    const mine = () => api.requests.filter((r) => r.query.get("fieldSelector") === "metadata.name=kc");
    await until("pool watched", mine, (rs) => rs.some((r) => r.query.get("watch") === "true"));
    for (const r of mine()) assert.equal(r.authorization, "Bearer t0ken");
    delete process.env.KUBECONFIG;
    process.env.HOME = dir; // no ~/.kube/config there, and no service account on this machine
    assert.throws(
      () => startKubernetesPool({ poolName: "kc", namespace: NS, log: () => {} }),
      /no cluster configured; run inside a pod with a service account, or set KUBECONFIG/,
    );
  } finally {
    if (env.KUBECONFIG !== undefined) process.env.KUBECONFIG = env.KUBECONFIG;
    process.env.HOME = env.HOME;
    await p.close();
    api.remove(POOLS, "kc");
    api.remove(PODS, "kc-0");
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an RBAC 403 on the pods is reported once, with the server's message and what to grant; granting it recovers", async () => {
  api.apply(POOLS, poolV1("rbac", { app: "rbac" }, [8000]));
  api.apply(PODS, pod("rbac-0", { ip: "10.11.0.1", labels: { app: "rbac" } }));
  api.setForbidden(PODS, true);
  const from = logs.length;
  const p = start("rbac");
  try {
    const denied = () => logs.slice(from).filter((l) => l.includes("HTTP 403"));
    await until("403 logged", denied, (l) => l.length > 0);
    // Several backoff rounds later, still one line.
    await until(
      "retried",
      () => api.requests.filter((r) => r.path === PODS).length,
      (n) => n >= 4,
    );
    assert.equal(denied().length, 1, denied().join("\n"));
    assert.match(denied()[0], /cannot list resource "pods" in the namespace "llm"/);
    assert.match(denied()[0], /grant this service account get, list and watch on Pods in namespace llm/);
    assert.equal(p.isReady(), false);
    api.setForbidden(PODS, false);
    await p.ready;
    assert.deepEqual(ids(p), ["10.11.0.1:8000"]);
    assert.ok(logs.slice(from).some((l) => l.includes("Pods in namespace llm: listed again after failures")));
  } finally {
    api.setForbidden(PODS, false);
    await p.close();
    api.remove(POOLS, "rbac");
    api.remove(PODS, "rbac-0");
  }
});
