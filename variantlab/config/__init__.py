"""The experiment file: YAML reading with locations, the experiment schema and checks,
overrides, ``measure:``, the JSON schema and the catalogue of registered kinds (stage 6)."""
