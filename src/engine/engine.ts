/**
 * One simulated vLLM V1 engine, advanced step by step by its caller (an HTTP server in scaled real
 * time, or the fleet simulator in virtual time). Pure: `now` is always passed in.
 */
import type { EngineConfig, EngineRequest, EngineStats, RequestRecord, StepResult } from "./types.ts";

/** Bad request input (prompt too long, empty prompt...): the caller maps it to a 400. */
export class EngineInputError extends Error {
  override name = "EngineInputError";
}

export class Engine {
  readonly config: EngineConfig;
  constructor(config: EngineConfig) {
    this.config = config;
    throw new Error("not implemented yet");
  }
  /** Queues a request that arrived at `now`; it is considered at the next step. Throws EngineInputError. */
  addRequest(_req: EngineRequest, _now: number): void {}
  /** Aborts a request (client went away); its blocks are freed at once. Returns its record, or null if unknown. */
  abort(_requestId: string, _now: number): RequestRecord | null {
    return null;
  }
  /** True while any request is waiting or running: the caller keeps stepping. */
  hasUnfinishedRequests(): boolean {
    return false;
  }
  /** Schedules and runs one step starting at `now`; outputs are due at `result.endTime`. */
  step(_now: number): StepResult {
    throw new Error("not implemented yet");
  }
  /** vLLM's reset_prefix_cache: drops every cached free block, emitting AllBlocksCleared. False if blocks are in use. */
  resetPrefixCache(_now: number): boolean {
    return false;
  }
  stats(): EngineStats {
    throw new Error("not implemented yet");
  }
}
