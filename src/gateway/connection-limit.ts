/**
 * `--max-connections` for the public port: client connections beyond the limit are still accepted,
 * so that each request on them gets a clean 503 in OpenAI's error format with `connection: close`
 * (instead of a reset, or a SYN left waiting in the backlog as net.Server#maxConnections does), and
 * the socket is closed after that answer. One that sends nothing is closed after 10 s.
 * The stream limit is the other half: `--max-concurrent-requests` (server.ts).
 */
import type { Socket } from "node:net";

const IDLE_OVER_LIMIT_MS = 10_000;

/**
 * A mark on the socket itself rather than a WeakSet of sockets: an HTTP/2 request's `socket` is
 * node:http2's proxy of the connection's socket, which forwards property reads but is not the same
 * object. An HTTP/2 connection counts once, however many streams it carries.
 */
const OVER_LIMIT = Symbol("kvgate.overConnectionLimit");
type Marked = Socket & { [OVER_LIMIT]?: boolean };

export class ConnectionLimit {
  readonly max: number;
  #open = 0;

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
      (s as Marked)[OVER_LIMIT] = true;
      s.setTimeout(IDLE_OVER_LIMIT_MS, () => s.destroy());
      return;
    }
    this.#open++;
    s.once("close", () => this.#open--);
  }

  /** True when requests on `s` are to be answered 503 (it arrived beyond the limit). */
  rejects(s: Socket | null | undefined): boolean {
    return s != null && (s as Marked)[OVER_LIMIT] === true;
  }
}
