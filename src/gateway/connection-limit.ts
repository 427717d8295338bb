/**
 * `--max-connections` for the public port: client connections beyond the limit are still accepted,
 * so that each request on them gets a clean 503 in OpenAI's error format with `connection: close`
 * (instead of a reset, or a SYN left waiting in the backlog as net.Server#maxConnections does), and
 * the socket is closed after that answer. One that sends nothing is closed after 10 s.
 * The stream limit is the other half: `--max-concurrent-requests` (server.ts).
 */
import type { Socket } from "node:net";

const IDLE_OVER_LIMIT_MS = 10_000;

export class ConnectionLimit {
  readonly max: number;
  #open = 0;
  readonly #over = new WeakSet<Socket>();

  constructor(max: number) {
    this.max = max;
  }

  /** Connections counted against the limit that are open now. */
  get open(): number {
    return this.#open;
  }

  /** Call on every new connection of the public server. */
  accept(s: Socket): void {
    if (this.#open >= this.max) {
      this.#over.add(s);
      s.setTimeout(IDLE_OVER_LIMIT_MS, () => s.destroy());
      return;
    }
    this.#open++;
    s.once("close", () => this.#open--);
  }

  /** True when requests on `s` are to be answered 503 (it arrived beyond the limit). */
  rejects(s: Socket | null | undefined): boolean {
    return s != null && this.#over.has(s);
  }
}
