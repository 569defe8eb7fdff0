"""A plugin that fails while being imported."""
raise RuntimeError("raises_on_import: this plugin is broken on purpose")
