"""The plugin system every stage builds on: hook specifications, the registry of components,
probes and executors, and the strict settings base (stage 1)."""
