/**
 * bench:ext-proc's request bodies: seeded OpenAI chat requests of about `bytes` each (an ~8k-token
 * prompt is ~35–45 KB of English text), `groups` shared system prompts with a question per request,
 * and their request_body messages encoded once with the upstream protos (≤ chunkBytes of body each,
 * end_of_stream on the last), so the load generator does not re-encode 40 KB per request.
 */
import { Mulberry32 } from "../../scheduler/rng.ts";
import { extProcProtocol } from "./protos.ts";

const WORDS = (
  "the of and to in is that for it as with was on be by this are from at or an have not which but " +
  "model request token cache prefix replica router latency throughput memory block decode prefill " +
  "system user assistant question answer context window document section figure table result value " +
  "data process server client stream header body message error status report measure observe learn"
).split(" ");

/** Seeded chat bodies: `groups` shared system prompts, each request its own question; ~`bytes` each. */
export function chatBodies(count: number, groups: number, bytes: number, seed = 1): Buffer[] {
  const rng = new Mulberry32(seed);
  const text = (n: number) => {
    const out: string[] = [];
    let len = 0;
    while (len < n) {
      const w = WORDS[rng.int(WORDS.length)]!;
      out.push(w);
      len += w.length + 1;
    }
    return out.join(" ");
  };
  const systems = Array.from({ length: groups }, (_, g) => `Group ${g} instructions. ${text(bytes * 0.8)}`);
  return Array.from({ length: count }, (_, i) =>
    Buffer.from(
      JSON.stringify({
        model: "m",
        messages: [
          { role: "system", content: systems[i % groups] },
          { role: "user", content: `Question ${i}: ${text(bytes * 0.2)}` },
        ],
        max_tokens: 16,
      }),
    ),
  );
}

/** Each body's request_body messages (≤ chunkBytes each, end_of_stream on the last), encoded. */
export function encodeBodies(bodies: Buffer[], chunkBytes: number): Buffer[][] {
  const { encodeRequest } = extProcProtocol();
  return bodies.map((body) => {
    const out: Buffer[] = [];
    for (let off = 0; off < body.length; off += chunkBytes) {
      const end = off + chunkBytes >= body.length;
      out.push(
        encodeRequest({ request_body: { body: body.subarray(off, off + chunkBytes), end_of_stream: end } }),
      );
    }
    return out;
  });
}
