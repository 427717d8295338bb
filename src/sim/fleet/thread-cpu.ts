/**
 * CPU time of the calling thread, for per-router timings when routers run in worker threads:
 * Node 20's process.cpuUsage() counts the whole process. Reads Linux's /proc/thread-self/stat
 * (utime + stime, in clock ticks of 1/100 s); elsewhere returns NaN. V8's helper threads (parallel
 * GC, compilers) are not counted, so it is the router's JavaScript thread alone.
 */
import { readFileSync } from "node:fs";

const TICKS_PER_SECOND = 100;

/** Seconds of CPU the calling thread has used, or NaN where the OS does not say. */
export function threadCpuSeconds(): number {
  try {
    const stat = readFileSync("/proc/thread-self/stat", "utf8");
    // Fields after the command name (which may hold spaces, inside parentheses): state is field 3.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const utime = Number(rest[11]);
    const stime = Number(rest[12]);
    return Number.isFinite(utime) && Number.isFinite(stime) ? (utime + stime) / TICKS_PER_SECOND : Number.NaN;
  } catch {
    return Number.NaN;
  }
}
