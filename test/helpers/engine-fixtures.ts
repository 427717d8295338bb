/** Shared test fixtures for the engine: profile loading and small engine configs. */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { Engine } from "../../src/engine/engine.ts";
import { type Profile, validateProfile } from "../../src/engine/profile.ts";
import type { EngineConfig, StepResult } from "../../src/engine/types.ts";

export function loadProfileFile(name: string): Profile {
  const path = fileURLToPath(new URL(`../../profiles/${name}.yaml`, import.meta.url));
  return validateProfile(parse(readFileSync(path, "utf8")), path);
}

export function engineConfig(over: Partial<EngineConfig> = {}): EngineConfig {
  const profile = over.profile ?? loadProfileFile("llama-3.1-8b-h100");
  return {
    blockSize: 16,
    numGpuBlocks: 2000,
    maxNumSeqs: 64,
    maxNumBatchedTokens: 2048,
    maxModelLen: 16384,
    longPrefillTokenThreshold: 0,
    enablePrefixCaching: true,
    hashSeed: "0",
    seed: 1,
    modelName: "test-model",
    dataParallelRank: 0,
    enableKvCacheEvents: true,
    profile,
    ...over,
  };
}

/** Steps the engine until idle; returns every step result. Throws if it does not finish in `maxSteps`. */
export function runToIdle(engine: Engine, start = 0, maxSteps = 100000, check = false): StepResult[] {
  const results: StepResult[] = [];
  let now = start;
  while (engine.hasUnfinishedRequests()) {
    if (results.length >= maxSteps) throw new Error(`engine did not finish in ${maxSteps} steps`);
    const r = engine.step(now);
    results.push(r);
    if (check) engine.checkInvariants();
    if (r.numScheduledRequests === 0) throw new Error(`engine stalled at t=${now}: nothing schedulable`);
    now = r.endTime;
  }
  return results;
}

/** Token ids 0..n-1 offset by `base`, so prompts with the same base share a prefix. */
export function tokens(n: number, base = 0): number[] {
  return Array.from({ length: n }, (_, i) => base + i + 1);
}

export { Engine };
