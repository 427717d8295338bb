// Worker-thread bootstrap: registers tsx (module hooks do not reach worker threads on Node 20), then
// loads the TypeScript worker, as bin/kvgate does for the main thread.
import { register } from "tsx/esm/api";

register();
await import(new URL("./router-worker.ts", import.meta.url).href);
