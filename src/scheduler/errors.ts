/**
 * Errors a user can cause. A ConfigError names the culprit (plugin type and name, parameter,
 * profile) and says what to do; the CLI prints its message as is.
 */

export class ConfigError extends Error {
  readonly code = "KVG_ERR_CONFIG";

  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}
