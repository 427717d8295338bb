/**
 * LoRA adapters in one simulated engine (vLLM --enable-lora): the GPU adapter slots and what a
 * batch may use. vLLM's scheduler (vllm/v1/core/sched/scheduler.py) admits a waiting request for an
 * adapter only while the step's scheduled requests use fewer than max_loras distinct adapters or
 * already use that one; the others stay waiting, in order. The worker keeps max_loras adapters in
 * GPU slots, least recently used evicted first (vllm/lora/models.py AdapterLRUCache); a step whose
 * batch needs an adapter not in a slot pays `loadSeconds` for it. Pure.
 */

export interface LoraConfig {
  /** vLLM --max-loras: distinct adapters in one batch, and GPU adapter slots (default 1). */
  maxLoras: number;
  /** Seconds a step takes longer for each adapter it brings into a GPU slot. */
  loadSeconds: number;
}

/** The adapter state of an engine, for vllm:lora_requests_info. */
export interface LoraState {
  maxLoras: number;
  /** Adapters with running requests, in order of first running request. */
  running: string[];
  /** Adapters with waiting requests, in queue order. */
  waiting: string[];
  /** Adapters in GPU slots, least recently used first. */
  resident: string[];
  /** Adapter loads into GPU slots since start. */
  loads: number;
}

export class LoraSlots {
  /** Adapter name → true, least recently used first (Map order). */
  readonly #resident = new Map<string, true>();
  #loads = 0;

  constructor(readonly config: LoraConfig) {
    if (!Number.isInteger(config.maxLoras) || config.maxLoras < 1)
      throw new RangeError(`engine config: lora.maxLoras must be an integer ≥ 1, got ${config.maxLoras}`);
    if (!(config.loadSeconds >= 0 && Number.isFinite(config.loadSeconds)))
      throw new RangeError(`engine config: lora.loadSeconds must be a number ≥ 0, got ${config.loadSeconds}`);
  }

  /**
   * Makes the step's adapters (at most maxLoras distinct, as the scheduler guarantees) resident,
   * evicting the least recently used others; returns the load time this costs the step.
   */
  activate(names: readonly string[]): number {
    let loaded = 0;
    for (const n of names) {
      if (!this.#resident.delete(n)) loaded++;
      this.#resident.set(n, true);
    }
    for (const n of this.#resident.keys()) {
      if (this.#resident.size <= this.config.maxLoras) break;
      this.#resident.delete(n);
    }
    this.#loads += loaded;
    return loaded * this.config.loadSeconds;
  }

  get loads(): number {
    return this.#loads;
  }

  resident(): string[] {
    return [...this.#resident.keys()];
  }
}

/** Distinct adapter names of `reqs` in order of first appearance (requests without one skipped). */
export function adaptersOf(reqs: readonly { input: { loraName?: string } }[]): string[] {
  const out: string[] = [];
  for (const r of reqs) {
    const n = r.input.loraName;
    if (n !== undefined && n !== "" && !out.includes(n)) out.push(n);
  }
  return out;
}
