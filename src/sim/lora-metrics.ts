/**
 * vllm:lora_requests_info on the simulated replica, as vLLM writes it (vLLM v0.26.0
 * vllm/v1/metrics/loggers.py): a gauge with labels max_lora, waiting_lora_adapters and
 * running_lora_adapters (adapter names joined by ","), set to the current Unix time after every
 * engine step. Each label combination is its own series and stays in the exposition, so a reader
 * takes the series with the latest value. No series until the first step, as in vLLM.
 */
import { Gauge, type Registry } from "prom-client";
import type { LoraState } from "../engine/lora-slots.ts";

export class LoraMetrics {
  readonly #gauge: Gauge<string>;
  #last = 0;

  constructor(
    registry: Registry,
    private readonly state: () => LoraState | null,
  ) {
    this.#gauge = new Gauge({
      name: "vllm:lora_requests_info",
      help: "Running stats on lora requests.",
      labelNames: ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
      registers: [registry],
    });
  }

  /** Records the engine's adapters after a step, stamped `nowSeconds` (wall clock, Unix seconds). */
  observe(nowSeconds: number): void {
    const s = this.state();
    if (s === null) return;
    // Strictly increasing, so two steps in one clock tick still leave the newer series latest.
    const t = Math.max(nowSeconds, this.#last + 1e-6);
    this.#last = t;
    this.#gauge.set(
      {
        max_lora: String(s.maxLoras),
        running_lora_adapters: s.running.join(","),
        waiting_lora_adapters: s.waiting.join(","),
      },
      t,
    );
  }
}
