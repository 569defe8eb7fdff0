"""The results store (SQLite), the typed contract between store and report, rows, and reading
runs back as frames (stage 4)."""
