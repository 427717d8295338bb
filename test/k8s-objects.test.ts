/** Parsing Kubernetes objects (objects.ts) and the pure views over them (view.ts). */
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  KubeObjectError,
  parseObjective,
  parsePod,
  parsePool,
  parseRewrite,
} from "../src/datalayer/kubernetes/objects.ts";
import { activePorts, endpointsFor, poolResources, sameResources } from "../src/datalayer/kubernetes/view.ts";
import { objective, pod, poolV1, poolV1alpha2, rewrite } from "./helpers/kube-fixtures.ts";

const V1 = "inference.networking.k8s.io";
const LEGACY = "inference.networking.x-k8s.io";

test("pods: Ready means condition Ready=True; the list API's Date objects count as a deletionTimestamp", () => {
  assert.equal(parsePod(pod("a")).ready, true);
  assert.equal(parsePod(pod("a", { ready: false })).ready, false);
  const noConditions = parsePod({ metadata: { name: "a" }, status: { podIP: "10.0.0.1" } });
  assert.equal(noConditions.ready, false);
  const p = pod("a") as { metadata: Record<string, unknown> };
  p.metadata.deletionTimestamp = new Date(0);
  assert.equal(parsePod(p).meta.deleting, true);
  assert.throws(() => parsePod({ metadata: {} }), /Pod without metadata.name/);
  assert.throws(
    () => parsePod({ metadata: { name: "a", labels: { k: 1 } } }),
    /Pod a: metadata.labels.k: value must be a string/,
  );
});

test("pools: v1 selector.matchLabels + targetPorts[].number; v1alpha2 selector + targetPortNumber; bad shapes named", () => {
  assert.deepEqual(parsePool(poolV1("p", { app: "x" }, [8000, 8001]), V1).targetPorts, [8000, 8001]);
  const legacy = parsePool(poolV1alpha2("p", { app: "x" }, 8080), LEGACY);
  assert.deepEqual([legacy.matchLabels, legacy.targetPorts], [{ app: "x" }, [8080]]);
  // One version's shape read as the other's says which --pool-group to use.
  assert.throws(
    () => parsePool(poolV1("p", { app: "x" }, [8000]), LEGACY),
    /has the v1 shape \(selector.matchLabels\); use --pool-group inference.networking.k8s.io/,
  );
  assert.throws(
    () => parsePool(poolV1alpha2("p", { app: "x" }, 8080), V1),
    /has the v1alpha2 shape \(targetPortNumber\); use --pool-group inference.networking.x-k8s.io/,
  );
  assert.throws(() => parsePool(poolV1("p", { app: "x" }, [8000, 8000]), V1), /has a port twice/);
  assert.throws(
    () => parsePool(poolV1("p", { app: "x" }, [70000]), V1),
    /targetPorts\[0\].number: must be an integer in \[1, 65535\]/,
  );
  assert.throws(() => parsePool(poolV1("p", {}, [8000]), V1), /needs at least one label/);
  assert.throws(
    () => parsePool({ metadata: { name: "p" }, spec: { selector: {} } }, V1),
    /spec.targetPorts needs at least one/,
  );
});

test("objectives and rewrites: priority unset = 0; poolRef required; only Exact matches; weights all or none", () => {
  assert.equal(parseObjective(objective("o", "p")).priority, 0);
  assert.equal(parseObjective(objective("o", "p", -3)).priority, -3);
  assert.throws(
    () => parseObjective({ metadata: { name: "o" }, spec: { priority: 1 } }),
    /spec.poolRef.name is required/,
  );
  assert.throws(
    () => parseObjective({ ...objective("o", "p"), spec: { priority: 1.5, poolRef: { name: "p" } } }),
    /integer/,
  );
  const r = rewrite("r", "p", [
    {
      matches: ["m"],
      targets: [
        ["t", 3],
        ["u", 1],
      ],
    },
  ]);
  assert.deepEqual(parseRewrite(r).rules, [
    {
      matches: ["m"],
      targets: [
        { model: "t", weight: 3 },
        { model: "u", weight: 1 },
      ],
    },
  ]);
  const regex = structuredClone(r) as {
    spec: { rules: Array<{ matches: Array<{ model: { type: string } }> }> };
  };
  regex.spec.rules[0].matches[0].model.type = "RegularExpression";
  assert.throws(() => parseRewrite(regex), /model.type must be Exact/);
  assert.throws(
    () => parseRewrite(rewrite("r", "p", [{ matches: ["m"], targets: [] }])),
    /targets needs at least one/,
  );
  assert.throws(
    () => parseRewrite(rewrite("r", "p", [{ matches: ["m"], targets: [["t", 0]] }])),
    /weight must be an integer in \[1, 1000000\]/,
  );
  assert.ok(new KubeObjectError("x") instanceof Error);
});

test("endpoints: IPv6 pods are bracketed, a shared address is kept once, and no pool means no endpoints", () => {
  const pool = parsePool(poolV1("p", { app: "vllm" }, [8000, 8001]), V1);
  const pods = [
    parsePod(pod("b", { ip: "FD00::1" })),
    parsePod(pod("a", { ip: "10.0.0.1" })),
    parsePod(pod("c", { ip: "10.0.0.1" })), // the same IP as a (hostNetwork, or a stale record)
    parsePod(pod("d", { ip: "not an ip!" })),
    parsePod(pod("e", { ip: "" })),
  ];
  const r = endpointsFor(pool, pods);
  assert.deepEqual(
    r.specs.map((s) => s.id),
    ["10.0.0.1:8000", "10.0.0.1:8001", "[fd00::1]:8000", "[fd00::1]:8001"],
  );
  assert.equal(r.specs[2].host, "fd00::1");
  assert.equal(r.problems.length, 4, r.problems.join("\n")); // c twice, d twice
  assert.match(r.problems[0], /also pod a's address; kept a/);
  assert.deepEqual(endpointsFor(null, pods).specs, []);
});

test("active ports: the llm-d annotation wins over the legacy one; unknown or junk ports are ignored", () => {
  const ports = [8000, 8001, 8002];
  const withAnn = (a: Record<string, string>) => parsePod(pod("a", { annotations: a }));
  assert.deepEqual(activePorts(withAnn({}), ports), ports);
  assert.deepEqual(
    activePorts(withAnn({ "llm-d.ai/active-ports": " 8002,x,9000, 8000" }), ports),
    [8000, 8002],
  );
  assert.deepEqual(
    activePorts(
      withAnn({ "llm-d.ai/active-ports": "8001", "inference.networking.k8s.io/active-ports": "8000" }),
      ports,
    ),
    [8001],
  );
  assert.deepEqual(
    activePorts(withAnn({ "inference.networking.k8s.io/active-ports": "8000" }), ports),
    [8000],
  );
  assert.deepEqual(activePorts(withAnn({ "llm-d.ai/active-ports": "" }), ports), []);
});

test("pool resources: only objects referring to this pool (name, and group when given), rewrites oldest first", () => {
  const objs = [
    parseObjective(objective("mine", "p", 2)),
    parseObjective(objective("other-pool", "q", 2)),
    parseObjective(objective("other-group", "p", 2, LEGACY)),
    parseObjective({ metadata: { name: "no-group" }, spec: { priority: 4, poolRef: { name: "p" } } }),
  ];
  const rws = [
    parseRewrite(rewrite("new", "p", [{ matches: ["a"], targets: [["b"]] }], "2026-03-01T00:00:00Z")),
    parseRewrite(rewrite("old", "p", [{ matches: ["a"], targets: [["c"]] }], "2026-01-01T00:00:00Z")),
    parseRewrite(rewrite("elsewhere", "q", [{ matches: ["a"], targets: [["d"]] }])),
  ];
  const r = poolResources(objs, rws, "p", V1);
  assert.deepEqual(
    [...r.objectives],
    [
      ["mine", 2],
      ["no-group", 4],
    ],
  );
  assert.deepEqual(
    r.rewrites.map((w) => w.name),
    ["old", "new"],
  );
  // With the legacy pool group, the legacy-group objective is the one that refers to it.
  assert.deepEqual([...poolResources(objs, [], "p", LEGACY).objectives.keys()], ["no-group", "other-group"]);
  assert.equal(sameResources(r, poolResources(objs, rws, "p", V1)), true);
  assert.equal(sameResources(r, poolResources(objs.slice(1), rws, "p", V1)), false);
});
