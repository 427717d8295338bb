/**
 * Calls back when a file changes: fs.watch on its directory (editors and ConfigMap updates replace
 * the file rather than write it in place) plus a stat poll for filesystems where fs.watch says
 * nothing, debounced so a burst of events is one call. Used for the endpoints file and the pools file.
 */
import { type FSWatcher, statSync, watch } from "node:fs";
import { basename, dirname } from "node:path";

export interface FileWatch {
  close(): void;
}

export interface FileWatchOptions {
  /** Stat-poll period; 0 disables polling (fs.watch only). Default 1000. */
  pollMs?: number;
  /** Quiet time before the callback. Default 30. */
  debounceMs?: number;
}

/** A key that changes when the file is replaced, rewritten or removed. */
export function statKey(path: string): string {
  try {
    const s = statSync(path);
    return `${s.ino}:${s.size}:${s.mtimeMs}`;
  } catch {
    return "missing";
  }
}

export function watchFile(path: string, onChange: () => void, opts: FileWatchOptions = {}): FileWatch {
  const pollMs = opts.pollMs ?? 1000;
  const debounceMs = opts.debounceMs ?? 30;
  const name = basename(path);
  let closed = false;
  let debounce: NodeJS.Timeout | null = null;
  let watcher: FSWatcher | null = null;
  let last = statKey(path);
  const schedule = () => {
    if (closed) return;
    if (debounce) clearTimeout(debounce);
    debounce = setTimeout(() => {
      debounce = null;
      if (!closed) onChange();
    }, debounceMs);
  };
  try {
    watcher = watch(dirname(path), { persistent: false }, (_event, file) => {
      if (!file || file === name) schedule();
    });
    watcher.on("error", () => {
      watcher?.close();
      watcher = null;
    });
  } catch {
    watcher = null; // the poll below still notices changes
  }
  const poll =
    pollMs > 0
      ? setInterval(() => {
          const key = statKey(path);
          if (key !== last) {
            last = key;
            schedule();
          }
        }, pollMs)
      : null;
  return {
    close() {
      closed = true;
      watcher?.close();
      if (poll) clearInterval(poll);
      if (debounce) clearTimeout(debounce);
    },
  };
}
