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

export const port = (v: string): number => {
  const n = integer(v);
  if (n < 0 || n > 65535) throw new InvalidArgumentError("must be in [0, 65535] (0 = any free port).");
  return n;
};
