/**
 * Leader election: the pure Lease decision (lease.ts) case by case and under random schedules, and
 * two LeaderElectors on one Lease in the fake API server, driven tick by tick on a fake clock.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import fc from "fast-check";
import { LeaderElector } from "../src/datalayer/kubernetes/leader-elector.ts";
import {
  checkTimings,
  DEFAULT_LEASE_TIMINGS,
  type LeaseRecord,
  leaseName,
  nextStep,
  observe,
  releaseRecord,
  stillLeader,
} from "../src/datalayer/kubernetes/lease.ts";
import { startKubernetesPool } from "../src/datalayer/kubernetes/pool.ts";
import { crdPath, FakeKubeApi } from "./helpers/fake-kube-api.ts";
import { NS, until } from "./helpers/kube-fixtures.ts";

const T = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 };
const held = (holder: string, renewTimeMs: number, transitions = 0): LeaseRecord => ({
  holderIdentity: holder,
  leaseDurationSeconds: 15,
  acquireTimeMs: 0,
  renewTimeMs,
  leaseTransitions: transitions,
});

test("the Lease name and timings are llm-d-router's (controller-runtime's defaults)", () => {
  assert.equal(leaseName("llm", "qwen-pool"), "epp-llm-qwen-pool.llm-d.ai");
  assert.deepEqual(DEFAULT_LEASE_TIMINGS, T);
  assert.throws(
    () => checkTimings({ leaseDurationMs: 10_000, renewDeadlineMs: 10_000, retryPeriodMs: 2_000 }),
    /leaseDuration .* > renewDeadline/,
  );
});

test("no Lease: create it; a free or expired one: take it (transitions + 1); our own: renew (acquireTime kept)", () => {
  const none = observe(null, null, 1000);
  assert.deepEqual(nextStep(none, "me", 1000, T), {
    kind: "create",
    record: {
      holderIdentity: "me",
      leaseDurationSeconds: 15,
      acquireTimeMs: 1000,
      renewTimeMs: 1000,
      leaseTransitions: 0,
    },
  });
  const released = observe(null, { ...held("", 500, 3), leaseDurationSeconds: 1 }, 1000);
  const take = nextStep(released, "me", 1000, T);
  assert.equal(take.kind, "update");
  assert.equal(take.kind === "update" && take.record.leaseTransitions, 4);
  assert.equal(take.kind === "update" && take.acquiring, true);

  const ours = observe(null, { ...held("me", 5000, 2), acquireTimeMs: 4000 }, 6000);
  const renew = nextStep(ours, "me", 6000, T);
  assert.deepEqual(renew, {
    kind: "update",
    acquiring: false,
    record: {
      holderIdentity: "me",
      leaseDurationSeconds: 15,
      acquireTimeMs: 4000,
      renewTimeMs: 6000,
      leaseTransitions: 2,
    },
  });
});

test("another holder's lease is valid for leaseDuration after WE last saw it change, whatever its renewTime says", () => {
  // The other pod's clock is an hour behind: its renewTime looks ancient, but it is renewing.
  let obs = observe(null, held("other", -3_600_000), 100_000);
  assert.deepEqual(nextStep(obs, "me", 114_999, T), { kind: "wait", holder: "other", expiresAtMs: 115_000 });
  // It renews (the record changes): the clock restarts.
  obs = observe(obs, held("other", -3_598_000), 110_000);
  assert.equal(nextStep(obs, "me", 124_999, T).kind, "wait");
  // The same record seen again does not restart it; 15 s after the last change it is ours.
  obs = observe(obs, held("other", -3_598_000), 120_000);
  assert.equal(obs.observedAtMs, 110_000);
  const step = nextStep(obs, "me", 125_000, T);
  assert.equal(step.kind === "update" && step.record.holderIdentity, "me");
});

test("a leader steps down when it has not renewed within renewDeadline; release clears the holder for a 1 s lease", () => {
  assert.equal(stillLeader(1000, 10_999, T), true);
  assert.equal(stillLeader(1000, 11_000, T), false);
  assert.deepEqual(releaseRecord(held("me", 5000, 7), "me", 9000), {
    holderIdentity: "",
    leaseDurationSeconds: 1,
    acquireTimeMs: 9000,
    renewTimeMs: 9000,
    leaseTransitions: 7,
  });
  assert.equal(releaseRecord(held("other", 5000), "me", 9000), null);
  assert.equal(releaseRecord(null, "me", 9000), null);
});

test("any schedule of attempts on a shared Lease never has two pods that count themselves leader", () => {
  // A model of the API server's compare-and-swap: a write succeeds only on the version it read.
  fc.assert(
    fc.property(
      fc.array(
        fc.record({
          who: fc.integer({ min: 0, max: 2 }),
          dt: fc.integer({ min: 0, max: 9_000 }),
          stale: fc.boolean(),
        }),
        {
          maxLength: 60,
        },
      ),
      (steps) => {
        type Stored = { record: LeaseRecord; version: number };
        let lease = null as Stored | null;
        const ids = ["a", "b", "c"];
        const obs = ids.map(() => null as ReturnType<typeof observe> | null);
        const lastRenew = ids.map(() => Number.NEGATIVE_INFINITY);
        const reads = ids.map(() => null as Stored | null);
        let now = 0;
        for (const s of steps) {
          now += s.dt;
          // `stale`: this attempt writes with what it read on its previous turn (a slow round trip).
          const read = s.stale ? reads[s.who] : lease;
          reads[s.who] = lease;
          obs[s.who] = observe(obs[s.who], read?.record ?? null, now);
          const step = nextStep(obs[s.who]!, ids[s.who], now, T);
          if (step.kind === "wait") continue;
          const expected = step.kind === "create" ? null : (read?.version ?? null);
          if ((lease?.version ?? null) !== expected) continue; // 409
          lease = { record: step.record, version: (lease?.version ?? 0) + 1 };
          lastRenew[s.who] = now;
          // Whoever still counts itself leader (renewed within renewDeadline) is at most one pod:
          // a new holder can only take over leaseDuration after it saw the old one's last renewal.
          const believers = ids.filter((_, i) => stillLeader(lastRenew[i], now, T));
          assert.ok(believers.length <= 1, `${believers.join(" and ")} both lead at ${now}`);
          assert.equal(believers[0], lease.record.holderIdentity);
        }
      },
    ),
    { seed: 11, numRuns: 300 },
  );
});

let api: FakeKubeApi;
before(async () => {
  api = await FakeKubeApi.start();
});
after(async () => {
  await api.close();
});

test("two electors on one Lease: exactly one leads; the other takes over when the holder stops renewing, and at once on release", async () => {
  let now = 1_000_000;
  const logs: string[] = [];
  const mk = (identity: string) =>
    new LeaderElector({
      kubeConfig: api.kubeConfig(),
      namespace: NS,
      name: leaseName(NS, "pool"),
      identity,
      now: () => now,
      log: (l) => logs.push(l),
    });
  const a = mk("pod-a_1");
  const b = mk("pod-b_2");
  const changes: string[] = [];
  a.on("change", (l) => changes.push(`a:${l}`));
  b.on("change", (l) => changes.push(`b:${l}`));
  const leases = crdPath("coordination.k8s.io", "v1", NS, "leases");
  const spec = () => (api.get(leases, "epp-llm-pool.llm-d.ai")?.spec ?? {}) as Record<string, unknown>;

  await a.tick();
  await b.tick();
  assert.deepEqual([a.isLeader(), b.isLeader()], [true, false]);
  assert.equal(spec().holderIdentity, "pod-a_1");
  assert.equal(spec().leaseDurationSeconds, 15);
  // MicroTime, as the API server requires it: six fractional digits.
  assert.match(String(spec().renewTime), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);

  // a renews every retry period; b keeps waiting.
  for (let i = 0; i < 10; i++) {
    now += 2_000;
    await a.tick();
    await b.tick();
    assert.deepEqual([a.isLeader(), b.isLeader()], [true, false], `round ${i}`);
  }
  // a stops renewing (hung or partitioned). b takes over 15 s after it last saw a renew, not before.
  now += 14_000;
  await b.tick();
  assert.equal(b.isLeader(), false);
  now += 1_000;
  await b.tick();
  assert.equal(b.isLeader(), true);
  assert.equal(spec().leaseTransitions, 1);
  // a wakes up: it sees b's valid lease and steps down rather than overwriting it.
  await a.tick();
  assert.deepEqual([a.isLeader(), b.isLeader()], [false, true]);

  // b releases on close: a takes over on its next attempt, without waiting out the lease.
  await b.stop();
  assert.equal(b.isLeader(), false);
  assert.equal(spec().holderIdentity, "");
  now += 100;
  await a.tick();
  assert.equal(a.isLeader(), true);
  assert.deepEqual(changes, ["a:true", "b:true", "a:false", "b:false", "a:true"]);
  await a.stop();
});

test("a write that loses the race (409 Conflict) is a failed attempt, and a leader that cannot renew steps down after renewDeadline", async () => {
  let now = 5_000_000;
  const logs: string[] = [];
  const name = leaseName(NS, "race");
  const leases = crdPath("coordination.k8s.io", "v1", NS, "leases");
  const a = new LeaderElector({
    kubeConfig: api.kubeConfig(),
    namespace: NS,
    name,
    identity: "a",
    now: () => now,
    log: (l) => logs.push(l),
  });
  await a.tick();
  assert.equal(a.isLeader(), true);
  // Someone else's write lands between a's read and a's write on every attempt: a's PUT gets 409.
  const realHandle = api.handle.bind(api);
  api.handle = (req, res) => {
    if (req.method === "PUT") {
      const cur = api.get(leases, name);
      if (cur) api.apply(leases, cur); // bumps resourceVersion
    }
    return realHandle(req, res);
  };
  try {
    for (let t = 2_000; t < 10_000; t += 2_000) {
      now += 2_000;
      await a.tick();
      assert.equal(a.isLeader(), true, `still within renewDeadline at +${t} ms`);
    }
    now += 2_000;
    await a.tick();
    assert.equal(a.isLeader(), false);
    assert.ok(logs.some((l) => l.includes("changed under us (409)")));
    assert.ok(logs.some((l) => l.includes("lost the lease, no renewal for 10000 ms")));
  } finally {
    api.handle = realHandle;
    await a.stop();
  }
});

test("startKubernetesPool with leader election: two replicas of one pool, one leads, closing it hands over at once", async () => {
  const leases = crdPath("coordination.k8s.io", "v1", NS, "leases");
  const pools = crdPath("inference.networking.k8s.io", "v1", NS, "inferencepools");
  api.apply(pools, {
    metadata: { name: "ha" },
    spec: { selector: { matchLabels: { app: "ha" } }, targetPorts: [{ number: 8000 }] },
  });
  // Long lease, quick retries: a hand-over that waited for expiry would not finish within the test.
  const timings = { leaseDurationMs: 60_000, renewDeadlineMs: 40_000, retryPeriodMs: 20 };
  const replica = (identity: string) =>
    startKubernetesPool({
      poolName: "ha",
      namespace: NS,
      kubeconfig: api.kubeConfig(),
      leaderElection: { identity, timings },
      log: () => {},
    });
  const a = replica("epp-a");
  await until("a leads", () => a.isLeader(), Boolean);
  const b = replica("epp-b");
  const bChanges: boolean[] = [];
  b.onLeaderChange((l) => bChanges.push(l));
  try {
    const holder = () =>
      (api.get(leases, "epp-llm-ha.llm-d.ai")?.spec as Record<string, unknown> | undefined)?.holderIdentity;
    assert.equal(holder(), "epp-a");
    // b keeps trying every 20 ms; a keeps renewing. Give b many attempts: it never leads.
    await until(
      "b tried several times",
      () => api.requests.filter((r) => r.method === "GET" && r.path.endsWith("/epp-llm-ha.llm-d.ai")).length,
      (n) => n > 20,
    );
    assert.equal(b.isLeader(), false);
    await a.close();
    assert.equal(a.isLeader(), false);
    await until("b leads after a released", () => b.isLeader(), Boolean);
    assert.equal(holder(), "epp-b");
    assert.deepEqual(bChanges, [true]);
  } finally {
    await a.close();
    await b.close();
    api.remove(pools, "ha");
  }
});
