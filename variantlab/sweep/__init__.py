"""From an experiment to units: unit keys and what they fingerprint, the size guard, the
preflight checks, the run folder and its lock, computing one unit (stage 7)."""
