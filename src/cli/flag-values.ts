/**
 * Commander argument parsers shared by the kvgate commands: each turns a flag's text into a value or
 * throws InvalidArgumentError with what a valid value looks like (commander prefixes the flag name).
 */
import { InvalidArgumentError } from "commander";

export const integer = (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isInteger(n)) throw new InvalidArgumentError("must be an integer.");
  return n;
};

export const positive = (v: string): number => {
  const n = integer(v);
  if (n < 1) throw new InvalidArgumentError("must be ≥ 1.");
  return n;
};

/** A number above 0, fractions allowed ("0.5", "2"). */
export const positiveNumber = (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isFinite(n) || n <= 0)
    throw new InvalidArgumentError("must be a number above 0.");
  return n;
};

export const port = (v: string): number => {
  const n = integer(v);
  if (n < 0 || n > 65535) throw new InvalidArgumentError("must be in [0, 65535] (0 = any free port).");
  return n;
};

export const bool = (v: string): boolean => {
  const s = v.trim().toLowerCase();
  if (["true", "1", "yes", "on"].includes(s)) return true;
  if (["false", "0", "no", "off"].includes(s)) return false;
  throw new InvalidArgumentError("must be true or false (e.g. --secure-serving=false).");
};

/** A Go-style duration ("30s", "1m30s", "500ms") or plain seconds, in milliseconds. */
export function durationMs(v: string): number {
  const s = v.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Math.round(Number(s) * 1000);
  const unit: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let total = 0;
  let rest = s;
  while (rest !== "") {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)/.exec(rest);
    if (!m) throw new InvalidArgumentError(`"${v}" is not a duration; write e.g. 30s, 1m30s or 500ms.`);
    total += Number(m[1]) * unit[m[2]];
    rest = rest.slice(m[0].length);
  }
  return Math.round(total);
}

export const nonNegative = (v: string): number => {
  const n = integer(v);
  if (n < 0) throw new InvalidArgumentError("must be ≥ 0.");
  return n;
};

/** A parser accepting one of `values`. */
export const oneOf =
  <T extends string>(...values: T[]) =>
  (v: string): T => {
    if (!(values as string[]).includes(v))
      throw new InvalidArgumentError(`must be one of ${values.join(", ")}.`);
    return v as T;
  };
