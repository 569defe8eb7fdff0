"""From an experiment to units: unit keys and what they fingerprint, the size guard, the
preflight checks, the run folder and its lock (stage 7); computing a unit is the executors'."""
