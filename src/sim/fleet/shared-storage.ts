/**
 * The shared-storage tier in fleet scenarios: the scenario field (`fleet.sharedStorage: {sizeGiB,
 * readBandwidthGBps, writeBandwidthGBps}`, or a router's own fleet), the one SharedStorage
 * (engine/storage-tier.ts) every replica of a run reaches behind its CPU tier, and what the run
 * reports about it. Modelled in the fleet simulator only: `kvgate sim-replica` processes do not
 * share one.
 */
import { z } from "zod";
import {
  DEFAULT_STORAGE_BYTES_PER_SECOND,
  DEFAULT_STORAGE_CAPACITY_BYTES,
  SharedStorage,
  type SharedStorageConfig,
} from "../../engine/storage-tier.ts";
import type { FleetConfig, Replica } from "./replica.ts";

const positive = z.number().finite().positive();

/** `sharedStorage` of a scenario's fleet; every field optional (defaults in storage-tier.ts). */
export const SharedStorageSchema = z.strictObject({
  /** Capacity, GiB (default 18,000: the Lustre volume of llm-d's storage guide). */
  sizeGiB: positive.optional(),
  /** Fleet-wide read / write throughput, GB/s (default 10 each: llm-d's cloud filesystem run). */
  readBandwidthGBps: positive.optional(),
  writeBandwidthGBps: positive.optional(),
});
export type SharedStorageInput = z.infer<typeof SharedStorageSchema>;

/** The engine-side config of a scenario's `sharedStorage`. */
export function sharedStorageConfig(s: SharedStorageInput): SharedStorageConfig {
  return {
    capacityBytes: s.sizeGiB !== undefined ? s.sizeGiB * 2 ** 30 : DEFAULT_STORAGE_CAPACITY_BYTES,
    readBandwidth:
      s.readBandwidthGBps !== undefined ? s.readBandwidthGBps * 1e9 : DEFAULT_STORAGE_BYTES_PER_SECOND,
    writeBandwidth:
      s.writeBandwidthGBps !== undefined ? s.writeBandwidthGBps * 1e9 : DEFAULT_STORAGE_BYTES_PER_SECOND,
  };
}

/** A fresh shared storage for one fleet run, or undefined when the fleet has none. */
export function fleetStorage(fleet: FleetConfig): SharedStorage | undefined {
  return fleet.sharedStorage === undefined ? undefined : new SharedStorage(fleet.sharedStorage);
}

/** What a run reports about its shared storage (results JSON, simulation.shared_storage). */
export interface StorageSummary {
  capacity_chunks: number;
  chunks: number;
  read_bytes: number;
  write_bytes: number;
  read_chunks: number;
  written_chunks: number;
  evicted_chunks: number;
  allocation_failures: number;
  /** Prompt tokens loaded from storage, and from the replicas' CPU tiers, over every replica. */
  storage_hit_tokens: number;
  cpu_hit_tokens: number;
}

export function storageSummary(s: SharedStorage, replicas: readonly Replica[]): StorageSummary {
  let storageHits = 0;
  let external = 0;
  for (const r of replicas) {
    const o = r.stats().offload;
    if (o === undefined) continue;
    storageHits += o.storageHits;
    external += o.externalHits;
  }
  const c = s.counters;
  return {
    capacity_chunks: s.capacityChunks,
    chunks: s.size,
    read_bytes: c.readBytes,
    write_bytes: c.writeBytes,
    read_chunks: c.readChunks,
    written_chunks: c.writtenChunks,
    evicted_chunks: c.evictedChunks,
    allocation_failures: c.allocationFailures,
    storage_hit_tokens: storageHits,
    cpu_hit_tokens: external - storageHits,
  };
}
