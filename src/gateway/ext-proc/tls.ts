/**
 * The ext_proc server's TLS identity, as llm-d's endpoint picker chooses it (`--secure-serving`
 * default true, `--cert-path`): `tls.crt` and `tls.key` from the given directory (a mounted
 * Kubernetes TLS Secret), or else a self-signed certificate made at start (Envoy's ext_proc cluster
 * then uses TLS without verifying it, as in llm-d's reference Envoy config).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { generate } from "selfsigned";

export interface TlsIdentity {
  cert: string;
  key: string;
  /** "self-signed" or the directory it came from. */
  origin: string;
}

/** Reads DIR/tls.crt and DIR/tls.key; an error names the missing file and what to give instead. */
export function readTlsDir(dir: string): TlsIdentity {
  const read = (name: string) => {
    try {
      return readFileSync(join(dir, name), "utf8");
    } catch (err) {
      throw new Error(
        `--cert-path ${dir}: cannot read ${name} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); give a directory holding tls.crt and tls.key (a Kubernetes TLS Secret's layout), or omit --cert-path for a self-signed certificate`,
      );
    }
  };
  return { cert: read("tls.crt"), key: read("tls.key"), origin: dir };
}

/** A fresh self-signed certificate (EC P-256, one year) for localhost and the loopback addresses. */
export async function selfSigned(): Promise<TlsIdentity> {
  const notBeforeDate = new Date(Date.now() - 60_000);
  const pems = await generate([{ name: "commonName", value: "kvgate-epp" }], {
    keyType: "ec",
    curve: "P-256",
    algorithm: "sha256",
    notBeforeDate,
    notAfterDate: new Date(notBeforeDate.getTime() + 365 * 24 * 3600 * 1000),
    extensions: [
      { name: "basicConstraints", cA: false },
      { name: "keyUsage", digitalSignature: true, keyEncipherment: true },
      { name: "extKeyUsage", serverAuth: true },
      {
        name: "subjectAltName",
        altNames: [
          { type: 2, value: "localhost" },
          { type: 2, value: "kvgate-epp" },
          { type: 7, ip: "127.0.0.1" },
          { type: 7, ip: "::1" },
        ],
      },
    ],
  });
  return { cert: pems.cert, key: pems.private, origin: "self-signed" };
}
