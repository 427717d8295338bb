/**
 * Entry point of bench:ext-proc's fake endpoints as their own process (`node --import tsx
 * fake-fleet-main.ts N MODEL HOLD_MS`): it prints `{"endpoints":[...]}` on one line and serves until SIGTERM.
 * Kept out of the load generator's process so its scrapes are answered at once even when the load
 * generator's event loop is saturated by thousands of streams.
 */
import { startFakeFleet } from "./bench-fleet.ts";

const [n, model, hold] = process.argv.slice(2);
const fleet = await startFakeFleet(Number(n ?? 8), model ?? "m", Number(hold ?? 0));
console.log(JSON.stringify({ endpoints: fleet.endpoints }));
process.on("SIGTERM", () => void fleet.close().then(() => process.exit(0)));
