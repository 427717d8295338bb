/**
 * Kubernetes discovery end to end: startKubernetesPool with the real @kubernetes/client-node
 * against the in-process fake API server (list + chunked watch, 410, bookmarks): pods and pools.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { DataLayer } from "../src/datalayer/datalayer.ts";
import { type KubernetesPool, startKubernetesPool } from "../src/datalayer/kubernetes/pool.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, pod, poolV1, poolV1alpha2, until } from "./helpers/kube-fixtures.ts";

const PODS = podsPath(NS);
const POOLS = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
const LEGACY_POOLS = crdPath("inference.networking.x-k8s.io", "v1alpha2", NS, "inferencepools");

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

test("Ready pods matching the pool's selector become endpoints; pods that leave are dropped at once", async () => {
  api.apply(POOLS, poolV1("p1", { app: "qwen" }, [8000]));
  api.apply(PODS, pod("qwen-a", { ip: "10.1.0.1", labels: { app: "qwen", tier: "gpu" } }));
  api.apply(PODS, pod("qwen-b", { ip: "10.1.0.2", labels: { app: "qwen" }, ready: false }));
  api.apply(PODS, pod("other", { ip: "10.1.0.3", labels: { app: "other" } }));
  const p = start("p1");
  try {
    await p.ready;
    assert.deepEqual(ids(p), ["10.1.0.1:8000"]);
    assert.deepEqual(p.source.current()[0].labels, { app: "qwen", tier: "gpu" });
    const removed: string[] = [];
    p.source.on("remove", (e) => removed.push(e.id));

    api.apply(PODS, pod("qwen-b", { ip: "10.1.0.2", labels: { app: "qwen" } })); // becomes Ready
    await until(
      "qwen-b added",
      () => ids(p),
      (v) => v.length === 2,
    );
    assert.deepEqual(ids(p), ["10.1.0.1:8000", "10.1.0.2:8000"]);

    api.apply(PODS, pod("qwen-a", { ip: "10.1.0.1", labels: { app: "qwen" }, ready: false }));
    await until(
      "qwen-a not Ready",
      () => ids(p),
      (v) => !v.includes("10.1.0.1:8000"),
    );
    api.apply(PODS, pod("qwen-a", { ip: "10.1.0.1", labels: { app: "qwen" } }));
    await until(
      "qwen-a Ready again",
      () => ids(p),
      (v) => v.includes("10.1.0.1:8000"),
    );
    api.apply(PODS, pod("qwen-a", { ip: "10.1.0.1", labels: { app: "qwen" }, deleting: true }));
    await until(
      "qwen-a terminating",
      () => ids(p),
      (v) => !v.includes("10.1.0.1:8000"),
    );
    api.remove(PODS, "qwen-a");
    api.apply(PODS, pod("qwen-b", { ip: "10.1.0.2", labels: { app: "moved" } })); // labels changed
    await until(
      "qwen-b relabelled",
      () => ids(p),
      (v) => v.length === 0,
    );
    // qwen-a left twice (not Ready, then terminating), qwen-b once (labels).
    assert.deepEqual(removed, ["10.1.0.1:8000", "10.1.0.1:8000", "10.1.0.2:8000"]);

    // The pool's selector changes: the pods it now selects come in without any pod event.
    api.apply(POOLS, poolV1("p1", { app: "other" }, [8000]));
    await until(
      "selector change",
      () => ids(p),
      (v) => v.length === 1,
    );
    assert.deepEqual(ids(p), ["10.1.0.3:8000"]);
    // The pool is deleted: everything goes.
    api.remove(POOLS, "p1");
    await until(
      "pool deleted",
      () => ids(p),
      (v) => v.length === 0,
    );
    // The pool is watched by name, not listed whole.
    const poolLists = api.requests.filter((r) => r.path === POOLS);
    assert.ok(poolLists.length >= 2, "the pool was listed and watched");
    for (const r of poolLists) assert.equal(r.query.get("fieldSelector"), "metadata.name=p1");
  } finally {
    await p.close();
    for (const n of ["qwen-b", "other"]) api.remove(PODS, n);
  }
});

test("several target ports give one endpoint per port (data-parallel ranks), narrowed by llm-d.ai/active-ports", async () => {
  api.apply(POOLS, poolV1("dp", { app: "dp" }, [8000, 8001, 8002]));
  api.apply(PODS, pod("dp-0", { ip: "10.2.0.1", labels: { app: "dp" } }));
  api.apply(
    PODS,
    pod("dp-1", {
      ip: "10.2.0.2",
      labels: { app: "dp" },
      annotations: { "llm-d.ai/active-ports": "8002, 8000,9999" },
    }),
  );
  api.apply(
    PODS,
    pod("dp-2", {
      ip: "10.2.0.3",
      labels: { app: "dp" },
      annotations: { "inference.networking.k8s.io/active-ports": "8001" },
    }),
  );
  const p = start("dp");
  try {
    await p.ready;
    assert.deepEqual(
      p.source.current().map((e) => e.id),
      ["10.2.0.1:8000", "10.2.0.1:8001", "10.2.0.1:8002", "10.2.0.2:8000", "10.2.0.2:8002", "10.2.0.3:8001"],
    );
    // Dropping a port from the pool drops that rank on every pod.
    api.apply(POOLS, poolV1("dp", { app: "dp" }, [8000]));
    await until(
      "port 8001/8002 gone",
      () => ids(p),
      (v) => v.length === 2,
    );
    assert.deepEqual(ids(p), ["10.2.0.1:8000", "10.2.0.2:8000"]);
  } finally {
    await p.close();
    api.remove(POOLS, "dp");
    for (const n of ["dp-0", "dp-1", "dp-2"]) api.remove(PODS, n);
  }
});

test("a 410 during the watch re-lists, and changes made meanwhile (including deletions) end consistent", async () => {
  api.apply(POOLS, poolV1("g", { app: "g" }, [8000]));
  for (let i = 0; i < 3; i++) api.apply(PODS, pod(`g-${i}`, { ip: `10.3.0.${i + 1}`, labels: { app: "g" } }));
  const p = start("g");
  try {
    await p.ready;
    assert.equal(ids(p).length, 3);
    await until(
      "pod watch open",
      () => api.watchCount(PODS),
      (n) => n >= 1,
    );
    const listsBefore = api.requests.filter((r) => r.path === PODS && r.query.get("watch") !== "true").length;
    // Cut the watch, change things while it is down, and compact history past them.
    api.breakWatches();
    api.remove(PODS, "g-0");
    api.apply(PODS, pod("g-3", { ip: "10.3.0.4", labels: { app: "g" } }));
    api.expire(PODS);
    await until(
      "re-listed",
      () => ids(p).join(),
      (v) => v === "10.3.0.2:8000,10.3.0.3:8000,10.3.0.4:8000",
    );
    const listsAfter = api.requests.filter((r) => r.path === PODS && r.query.get("watch") !== "true").length;
    assert.ok(listsAfter > listsBefore, "a new list was made after the 410");
    assert.ok(logs.some((l) => l.includes("expired (410)")));
    // An ERROR 410 on a live watch does the same.
    await until(
      "pod watch open again",
      () => api.watchCount(PODS),
      (n) => n >= 1,
    );
    api.expire(PODS);
    api.apply(PODS, pod("g-4", { ip: "10.3.0.5", labels: { app: "g" } }));
    await until(
      "g-4 after second 410",
      () => ids(p),
      (v) => v.includes("10.3.0.5:8000"),
    );
  } finally {
    await p.close();
    api.remove(POOLS, "g");
    for (let i = 0; i < 5; i++) api.remove(PODS, `g-${i}`);
  }
});

test("bookmarks advance the resume point: after the server ends the watch, no event is replayed or lost", async () => {
  api.apply(POOLS, poolV1("bm", { app: "bm" }, [8000]));
  api.apply(PODS, pod("bm-0", { ip: "10.4.0.1", labels: { app: "bm" } }));
  const p = start("bm");
  try {
    await p.ready;
    await until(
      "pod watch open",
      () => api.watchCount(PODS),
      (n) => n >= 1,
    );
    const watches = () => api.requests.filter((r) => r.path === PODS && r.query.get("watch") === "true");
    assert.equal(watches()[watches().length - 1].query.get("allowWatchBookmarks"), "true");
    api.apply(PODS, pod("unrelated", { ip: "10.4.9.9", labels: { app: "x" } }));
    api.bookmark();
    const rvAtBookmark = String(api.resourceVersion);
    // The bookmark line precedes the end of the stream, so the client has read it when the watch ends.
    const n = watches().length;
    api.endWatches();
    await until(
      "watch resumed",
      () => watches().length,
      (k) => k > n,
    );
    assert.equal(watches()[n].query.get("resourceVersion"), rvAtBookmark);
    api.apply(PODS, pod("bm-1", { ip: "10.4.0.2", labels: { app: "bm" } }));
    await until(
      "bm-1 added",
      () => ids(p),
      (v) => v.length === 2,
    );
  } finally {
    await p.close();
    api.remove(POOLS, "bm");
    for (const n of ["bm-0", "bm-1", "unrelated"]) api.remove(PODS, n);
  }
});

test("a malformed pod or pool is logged and skipped; garbage on the watch stream is ignored", async () => {
  api.apply(POOLS, poolV1("mf", { app: "mf" }, [8000]));
  api.apply(PODS, pod("mf-0", { ip: "10.5.0.1", labels: { app: "mf" } }));
  api.apply(PODS, { metadata: { name: "mf-bad", labels: { app: "mf", replicas: 2 } } });
  const p = start("mf");
  try {
    await p.ready;
    assert.deepEqual(ids(p), ["10.5.0.1:8000"]);
    assert.ok(logs.some((l) => l.includes("skipping malformed object") && l.includes("mf-bad")));
    await until(
      "pod watch open",
      () => api.watchCount(PODS),
      (n) => n >= 1,
    );
    api.injectLine(PODS, "this is not json");
    api.injectLine(PODS, JSON.stringify({ type: "ADDED", object: { kind: "Pod" } }));
    api.apply(PODS, pod("mf-1", { ip: "10.5.0.2", labels: { app: "mf" } }));
    await until(
      "mf-1 after garbage",
      () => ids(p),
      (v) => v.length === 2,
    );
    // A pod that turns malformed is dropped (what the cluster says now cannot be used).
    api.apply(PODS, { metadata: { name: "mf-1", labels: 7 } });
    await until(
      "mf-1 dropped",
      () => ids(p),
      (v) => v.length === 1,
    );
    // A pool edited into an invalid shape leaves no endpoints rather than stale ones.
    api.apply(POOLS, {
      metadata: { name: "mf" },
      spec: { selector: { matchLabels: {} }, targetPorts: [{ number: 8000 }] },
    });
    await until(
      "invalid pool",
      () => ids(p),
      (v) => v.length === 0,
    );
    assert.ok(logs.some((l) => l.includes("the selector needs at least one label")));
  } finally {
    await p.close();
    api.remove(POOLS, "mf");
    for (const n of ["mf-0", "mf-1", "mf-bad"]) api.remove(PODS, n);
  }
});

test("the legacy v1alpha2 pool shape (selector map, targetPortNumber) with --pool-group inference.networking.x-k8s.io", async () => {
  api.apply(LEGACY_POOLS, poolV1alpha2("old", { app: "old" }, 8080));
  api.apply(PODS, pod("old-0", { ip: "10.6.0.1", labels: { app: "old" } }));
  const p = start("old", "inference.networking.x-k8s.io");
  try {
    await p.ready;
    assert.deepEqual(ids(p), ["10.6.0.1:8080"]);
  } finally {
    await p.close();
    api.remove(LEGACY_POOLS, "old");
    api.remove(PODS, "old-0");
  }
  assert.throws(() => start("x", "example.com"), /--pool-group "example.com" is not an InferencePool group/);
});

test("a pool that does not exist yet: not ready, then ready when it is created", async () => {
  api.apply(PODS, pod("late-0", { ip: "10.8.0.1", labels: { app: "late" } }));
  const p = start("late");
  try {
    await until(
      "pool missing logged",
      () => logs.some((l) => l.includes("llm/late") && l.includes("not found")),
      Boolean,
    );
    assert.equal(p.isReady(), false);
    assert.deepEqual(ids(p), []);
    api.apply(POOLS, poolV1("late", { app: "late" }, [8000]));
    await p.ready;
    assert.deepEqual(ids(p), ["10.8.0.1:8000"]);
  } finally {
    await p.close();
    api.remove(POOLS, "late");
    api.remove(PODS, "late-0");
  }
});

test("the discovered source feeds the gateway's DataLayer: endpoints appear in and leave store.all()", async () => {
  api.apply(POOLS, poolV1("dl", { app: "dl" }, [8000, 8001]));
  api.apply(PODS, pod("dl-0", { ip: "10.9.0.1", labels: { app: "dl" } }));
  const p = start("dl");
  const changes: string[][] = [];
  try {
    await p.ready;
    const layer = new DataLayer(p.source, { onEndpointsChanged: (s) => changes.push([...s].sort()) });
    const stored = () =>
      layer.store
        .all()
        .map((r) => r.spec.id)
        .sort();
    assert.deepEqual(stored(), ["10.9.0.1:8000", "10.9.0.1:8001"]);
    api.apply(PODS, pod("dl-1", { ip: "10.9.0.2", labels: { app: "dl" } }));
    await until("dl-1 in the store", stored, (v) => v.length === 4);
    api.remove(PODS, "dl-0");
    await until("dl-0 out of the store", stored, (v) => v.length === 2);
    assert.deepEqual(stored(), ["10.9.0.2:8000", "10.9.0.2:8001"]);
    assert.deepEqual(changes[changes.length - 1], ["10.9.0.2:8000", "10.9.0.2:8001"]);
    await layer.close(); // closes the source too
  } finally {
    await p.close();
    api.remove(POOLS, "dl");
    api.remove(PODS, "dl-1");
  }
});
