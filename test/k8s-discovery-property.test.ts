/**
 * Property: whatever happens to the pods and the pool — adds, edits, readiness flips, deletions,
 * selector and port changes, cut watches, compacted history (410), bookmarks — once the client has
 * caught up, the endpoint set is exactly the Ready, non-terminating, selected pods with an IP ×
 * their active target ports. The expectation is computed here from the objects the test wrote,
 * independently of src/datalayer/kubernetes/view.ts.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { startKubernetesPool } from "../src/datalayer/kubernetes/pool.ts";
import { crdPath, FakeKubeApi, podsPath } from "./helpers/fake-kube-api.ts";
import { NS, type PodOpts, pod, poolV1, until } from "./helpers/kube-fixtures.ts";

const PODS = podsPath(NS);
const POOLS = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
const NAMES = ["p0", "p1", "p2", "p3", "p4"];
const PORT_SETS = [[8000], [8000, 8001], [8001, 8002, 8003]];

type Op =
  | { op: "pod"; name: string; o: Required<Omit<PodOpts, "annotations">> & { active: string | null } }
  | { op: "delete"; name: string }
  | { op: "selector"; app: string }
  | { op: "ports"; set: number }
  | { op: "break" }
  | { op: "expire" }
  | { op: "bookmark" }
  | { op: "end" }
  /** The watch connection is cut, things change, and history is compacted before it reconnects. */
  | { op: "outage"; during: Op[] };

const podOpArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant("pod" as const),
      name: fc.constantFrom(...NAMES),
      o: fc.record({
        ip: fc.constantFrom("10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::7", ""),
        labels: fc.constantFrom<Record<string, string>>({ app: "a" }, { app: "b" }, { app: "a", x: "y" }),
        // Mostly routable pods, so that losing one (a missed deletion) shows.
        ready: fc.constantFrom(true, true, true, false),
        deleting: fc.constantFrom(false, false, false, true),
        active: fc.constantFrom(null, "8001", "8000,8003", "nonsense"),
      }),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant("delete" as const), name: fc.constantFrom(...NAMES) }),
  },
);

const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 8, arbitrary: podOpArb },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant("selector" as const), app: fc.constantFrom("a", "b") }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant("ports" as const), set: fc.integer({ min: 0, max: 2 }) }),
  },
  { weight: 1, arbitrary: fc.constant({ op: "break" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "expire" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "bookmark" as const }) },
  { weight: 1, arbitrary: fc.constant({ op: "end" as const }) },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant("outage" as const),
      during: fc.array(podOpArb, { minLength: 1, maxLength: 4 }),
    }),
  },
);

test("any sequence of pod and pool events ends with exactly the Ready selected pods × active ports", async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 25 }), async (ops) => {
      const api = await FakeKubeApi.start();
      const pods = new Map<string, Op & { op: "pod" }>();
      let app = "a";
      let ports = PORT_SETS[0];
      api.apply(POOLS, poolV1("prop", { app }, ports));
      const p = startKubernetesPool({
        poolName: "prop",
        namespace: NS,
        kubeconfig: api.kubeConfig(),
        log: () => {},
        retry: { backoffMs: { initial: 5, max: 20 }, absentRetryMs: 1000 },
      });
      try {
        await p.ready;
        // Names are reused for different IPs; two live pods never share an IP (the real invariant).
        const ipOwner = (ip: string, name: string) =>
          [...pods.values()].some((q) => q.name !== name && q.o.ip === ip && ip !== "");
        const expectedIds = () => {
          const expected: string[] = [];
          for (const q of [...pods.values()].sort((x, y) => (x.name < y.name ? -1 : 1))) {
            const { ip, labels, ready, deleting, active } = q.o;
            if (!ready || deleting || ip === "" || labels.app !== app) continue;
            const listed = active === null ? null : active.split(",").map(Number);
            for (const port of ports)
              if (listed === null || listed.includes(port))
                expected.push(ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`);
          }
          return expected;
        };
        const ids = () => p.source.current().map((e) => e.id);
        const run = (op: Op) => {
          if (op.op === "pod") {
            if (ipOwner(op.o.ip, op.name)) return;
            pods.set(op.name, op);
            const annotations = op.o.active !== null ? { "llm-d.ai/active-ports": op.o.active } : undefined;
            api.apply(PODS, pod(op.name, { ...op.o, annotations }));
          } else if (op.op === "delete") {
            pods.delete(op.name);
            api.remove(PODS, op.name);
          } else if (op.op === "selector" || op.op === "ports") {
            if (op.op === "selector") app = op.app;
            else ports = PORT_SETS[op.set];
            api.apply(POOLS, poolV1("prop", { app }, ports));
          } else if (op.op === "break") api.breakWatches();
          else if (op.op === "expire") api.expire(PODS);
          else if (op.op === "bookmark") api.bookmark();
          else if (op.op === "end") api.endWatches();
          else {
            // (the caller waited until the client had caught up, so it knows what is lost)
            api.breakWatches();
            for (const d of op.during) run(d);
            api.expire(PODS);
          }
        };
        for (const [i, op] of ops.entries()) {
          if (op.op === "outage") {
            const want = expectedIds().join();
            await until(
              "caught up before an outage",
              () => ids().join(),
              (v) => v === want,
            );
          }
          run(op);
          // Let the client read some events mid-sequence, not only the final state.
          if (i % 3 === 0) await new Promise((r) => setImmediate(r));
        }
        // A marker pod written last: once it shows up, every earlier event has been applied.
        api.apply(PODS, pod("zz-marker", { ip: "10.9.9.9", labels: { app } }));
        const marker = `10.9.9.9:${ports[0]}`;
        await until(
          "marker",
          () => p.source.current().map((e) => e.id),
          (v) => v.includes(marker),
        );

        const expected = [...expectedIds(), ...ports.map((port) => `10.9.9.9:${port}`)];
        assert.deepEqual(
          p.source.current().map((e) => e.id),
          expected,
        );
      } finally {
        await p.close();
        await api.close();
      }
    }),
    { seed: 20261201, numRuns: 25 },
  );
});
