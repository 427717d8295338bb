/**
 * The fake API server itself, seen through @kubernetes/client-node: list shape, watch replay from a
 * resourceVersion, label-selector watches turning relabels into DELETED / ADDED as the real watch
 * cache does, 410 for a compacted version, 409 for a stale write. The discovery tests rely on these.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { CoordinationV1Api, CoreV1Api, Watch } from "@kubernetes/client-node";
import { crdPath, FakeKubeApi, labelSelectorMatches, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, pod, until } from "./helpers/kube-fixtures.ts";

let api: FakeKubeApi;
before(async () => {
  api = await FakeKubeApi.start();
});
after(async () => {
  await api.close();
});

test("label selectors: equality, inequality, existence and absence", () => {
  const l = { app: "a", tier: "gpu" };
  assert.equal(labelSelectorMatches("app=a,tier==gpu", l), true);
  assert.equal(labelSelectorMatches("app!=a", l), false);
  assert.equal(labelSelectorMatches("tier,!canary", l), true);
  assert.equal(labelSelectorMatches("canary", l), false);
  assert.equal(labelSelectorMatches("", l), true);
});

test("list and watch through client-node: PodList with resourceVersion, replay from it, selector transitions, 410", async () => {
  const core = api.kubeConfig().makeApiClient(CoreV1Api);
  api.apply(podsPath(NS), pod("w-0", { labels: { app: "a" } }));
  const list = await core.listNamespacedPod({ namespace: NS, labelSelector: "app=a" });
  assert.equal(list.kind, "PodList");
  assert.deepEqual(
    list.items.map((p) => p.metadata?.name),
    ["w-0"],
  );
  const rv = list.metadata?.resourceVersion ?? "";
  api.apply(podsPath(NS), pod("w-1", { labels: { app: "a" } })); // before the watch: replayed
  const events: string[] = [];
  let ended: unknown = "open";
  const ctrl = await new Watch(api.kubeConfig()).watch(
    podsPath(NS),
    { resourceVersion: rv, labelSelector: "app=a", allowWatchBookmarks: true },
    (type, obj) => events.push(`${type} ${obj.metadata?.name ?? ""}`),
    (err) => (ended = err),
  );
  api.apply(podsPath(NS), pod("w-0", { labels: { app: "b" } })); // leaves the selector
  api.apply(podsPath(NS), pod("w-0", { labels: { app: "a" } })); // comes back
  api.apply(podsPath(NS), pod("w-2", { labels: { app: "z" } })); // never matches
  api.bookmark();
  api.remove(podsPath(NS), "w-1");
  await until(
    "events",
    () => events.length,
    (n) => n >= 5,
  );
  assert.deepEqual(events, ["ADDED w-1", "DELETED w-0", "ADDED w-0", "BOOKMARK ", "DELETED w-1"]);
  ctrl.abort();
  // A watch from before a compaction gets a Status 410 event, then the stream ends.
  api.expire(podsPath(NS));
  const late: Array<[string, unknown]> = [];
  await new Watch(api.kubeConfig()).watch(
    podsPath(NS),
    { resourceVersion: rv },
    (type, obj) => late.push([type, obj.code]),
    (err) => (ended = err),
  );
  await until(
    "410",
    () => late.length,
    (n) => n === 1,
  );
  assert.deepEqual(late, [["ERROR", 410]]);
  await until(
    "ended",
    () => ended,
    (e) => e === null,
  );
});

test("Lease writes: POST twice is 409 AlreadyExists, PUT with a stale resourceVersion is 409 Conflict", async () => {
  const coord = api.kubeConfig().makeApiClient(CoordinationV1Api);
  const body = { metadata: { name: "l", namespace: NS }, spec: { holderIdentity: "x" } };
  const created = await coord.createNamespacedLease({ namespace: NS, body });
  await assert.rejects(
    coord.createNamespacedLease({ namespace: NS, body }),
    (e: { code?: number }) => e.code === 409,
  );
  const stale = created.metadata?.resourceVersion;
  await coord.replaceNamespacedLease({ name: "l", namespace: NS, body: created });
  await assert.rejects(
    coord.replaceNamespacedLease({
      name: "l",
      namespace: NS,
      body: { ...created, metadata: { ...created.metadata, resourceVersion: stale } },
    }),
    (e: { code?: number }) => e.code === 409,
  );
  assert.equal(api.get(crdPath("coordination.k8s.io", "v1", NS, "leases"), "l")?.metadata.name, "l");
});
