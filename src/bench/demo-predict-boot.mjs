// Worker-thread bootstrap for the demo's prediction: registers tsx (module hooks do not reach worker
// threads on Node 20), then loads the TypeScript worker, as bin/kvgate does for the main thread.
import { register } from "tsx/esm/api";

register();
await import(new URL("./demo-predict-worker.ts", import.meta.url).href);
