/**
 * Binding a server to its port: a taken or foreign address becomes an error naming it and the flag
 * to change, and the bound address comes back with a URL that reaches it from this machine (loopback
 * for a wildcard bind). Shared by `kvgate serve` and `kvgate epp`.
 */
import type { AddressInfo, Server } from "node:net";

/** Where a server is bound, and a URL that reaches it from this machine. */
export interface BoundAddress {
  /** The address given to listen(): "0.0.0.0" or "::" mean every interface. */
  host: string;
  port: number;
  /** True for a wildcard bind (reachable on every interface, including from other machines). */
  allInterfaces: boolean;
  /** A URL to use from this machine (loopback for a wildcard bind). */
  url: string;
}

/**
 * Accept-queue length asked of the kernel (capped there by net.core.somaxconn). Node's default, 511,
 * overflows when thousands of clients connect while the event loop is busy: the kernel then drops
 * their handshakes' last ACK and resets them ~15 s later, after its SYN-ACK retries (seen in
 * bench:streams: ~5% of 2,000 streams opened in 2 s reset at once, none with a larger queue).
 */
export const LISTEN_BACKLOG = 8192;

/** Listens; a taken or foreign address becomes an error naming it and the flag to change. */
export function listen(
  server: Server,
  port: number,
  host: string,
  flag: { port: string; host: string },
): Promise<BoundAddress> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      const at = `${host.includes(":") ? `[${host}]` : host}:${port}`;
      const why =
        err.code === "EADDRINUSE"
          ? `${at} (${flag.port}) is already in use by another process; pick another ${flag.port}, or ${flag.port} 0 for any free port`
          : err.code === "EACCES"
            ? `${at} (${flag.port}): permission denied (ports below 1024 need privileges); pick another ${flag.port}`
            : err.code === "EADDRNOTAVAIL" || err.code === "ENOTFOUND"
              ? `${host} (${flag.host}) is not an address of this machine; give one it has, or 0.0.0.0 for every interface`
              : `cannot listen on ${at} (${flag.host}, ${flag.port}): ${err.message}`;
      reject(new Error(why));
    };
    server.once("error", onError);
    server.listen({ port, host, backlog: LISTEN_BACKLOG }, () => {
      server.off("error", onError);
      resolve(boundAddress(host, (server.address() as AddressInfo).port));
    });
  });
}

function boundAddress(host: string, port: number): BoundAddress {
  const allInterfaces = host === "0.0.0.0" || host === "::" || host === "";
  const reach = allInterfaces
    ? host === "::"
      ? "[::1]"
      : "127.0.0.1"
    : host.includes(":")
      ? `[${host}]`
      : host;
  return { host, port, allInterfaces, url: `http://${reach}:${port}` };
}
