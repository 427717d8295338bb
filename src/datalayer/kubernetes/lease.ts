/**
 * Leader election on a coordination.k8s.io/v1 Lease, the decision part only: what to write (or
 * whether to wait) given the Lease as read, when it was first seen in that state, the clock and
 * our identity. Pure (time is passed in) so every case is testable without timers; the
 * LeaderElector in leader-elector.ts does the I/O. The rules are client-go's `leaderelection`
 * package's: another holder's lease is valid until leaseDuration after we last saw it change
 * (our own clock, not its renewTime, so clock skew between pods does not matter); a leader that has
 * not renewed within renewDeadline steps down; releasing clears holderIdentity and shortens the
 * lease to 1 s so a standby takes over at once.
 */

export interface LeaseRecord {
  /** "" when nobody holds it (released). */
  holderIdentity: string;
  leaseDurationSeconds: number;
  acquireTimeMs: number | null;
  renewTimeMs: number | null;
  leaseTransitions: number;
}

export interface LeaseTimings {
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
}

/**
 * llm-d-router's EPP leaves these to controller-runtime's manager defaults (`pkg/epp/server/
 * controller_manager.go` sets only the lock, name, namespace and release-on-cancel).
 */
export const DEFAULT_LEASE_TIMINGS: LeaseTimings = {
  leaseDurationMs: 15_000,
  renewDeadlineMs: 10_000,
  retryPeriodMs: 2_000,
};

/** llm-d-router's Lease name for an EPP of one pool, in the pool's namespace. */
export function leaseName(namespace: string, pool: string): string {
  return `epp-${namespace}-${pool}.llm-d.ai`;
}

export function checkTimings(t: LeaseTimings): void {
  if (!(t.retryPeriodMs > 0 && t.renewDeadlineMs > t.retryPeriodMs && t.leaseDurationMs > t.renewDeadlineMs))
    throw new Error(
      `leader election: need leaseDuration (${t.leaseDurationMs} ms) > renewDeadline (${t.renewDeadlineMs} ms) > retryPeriod (${t.retryPeriodMs} ms) > 0`,
    );
}

/** The Lease as last seen and when (our clock) it was first seen like that. */
export interface Observation {
  record: LeaseRecord | null;
  observedAtMs: number;
}

const same = (a: LeaseRecord | null, b: LeaseRecord | null) =>
  a === b ||
  (a !== null &&
    b !== null &&
    a.holderIdentity === b.holderIdentity &&
    a.leaseDurationSeconds === b.leaseDurationSeconds &&
    a.acquireTimeMs === b.acquireTimeMs &&
    a.renewTimeMs === b.renewTimeMs &&
    a.leaseTransitions === b.leaseTransitions);

/** A new observation when the record changed (the holder renewed, or someone else took it). */
export function observe(prev: Observation | null, current: LeaseRecord | null, nowMs: number): Observation {
  if (prev && same(prev.record, current)) return prev;
  return { record: current, observedAtMs: nowMs };
}

export type LeaseStep =
  /** No Lease yet: create it holding it. */
  | { kind: "create"; record: LeaseRecord }
  /** Acquire (free or expired) or renew (ours): write this with the read's resourceVersion. */
  | { kind: "update"; record: LeaseRecord; acquiring: boolean }
  /** Someone else holds a valid lease. */
  | { kind: "wait"; holder: string; expiresAtMs: number };

export function nextStep(obs: Observation, identity: string, nowMs: number, t: LeaseTimings): LeaseStep {
  const cur = obs.record;
  const durationSeconds = Math.max(1, Math.ceil(t.leaseDurationMs / 1000));
  if (cur === null)
    return {
      kind: "create",
      record: {
        holderIdentity: identity,
        leaseDurationSeconds: durationSeconds,
        acquireTimeMs: nowMs,
        renewTimeMs: nowMs,
        leaseTransitions: 0,
      },
    };
  const ours = cur.holderIdentity === identity;
  if (!ours && cur.holderIdentity !== "") {
    const expiresAtMs = obs.observedAtMs + cur.leaseDurationSeconds * 1000;
    if (expiresAtMs > nowMs) return { kind: "wait", holder: cur.holderIdentity, expiresAtMs };
  }
  return {
    kind: "update",
    acquiring: !ours,
    record: {
      holderIdentity: identity,
      leaseDurationSeconds: durationSeconds,
      acquireTimeMs: ours ? (cur.acquireTimeMs ?? nowMs) : nowMs,
      renewTimeMs: nowMs,
      leaseTransitions: ours ? cur.leaseTransitions : cur.leaseTransitions + 1,
    },
  };
}

/** A leader that last renewed at `lastRenewMs` is still leader at `nowMs`. */
export function stillLeader(lastRenewMs: number, nowMs: number, t: LeaseTimings): boolean {
  return nowMs - lastRenewMs < t.renewDeadlineMs;
}

/** What to write to give the lease up (null when it is not ours to release). */
export function releaseRecord(cur: LeaseRecord | null, identity: string, nowMs: number): LeaseRecord | null {
  if (cur === null || cur.holderIdentity !== identity) return null;
  return {
    holderIdentity: "",
    leaseDurationSeconds: 1,
    acquireTimeMs: nowMs,
    renewTimeMs: nowMs,
    leaseTransitions: cur.leaseTransitions,
  };
}
