"""How to load the plugin that would supply an unknown kind.

``unknown attention 'token_shift'`` alone leaves a plugin author guessing. When the kind is
unknown because its plugin is not loaded, the message says how to load it:

- a ``.py`` file beside the experiment that registers the kind (``register("token_shift",
  ...)``) but is not listed under ``plugins:``: add it there;
- an installed plugin (an entry point) that failed to load: the failure, and
  ``variantlab plugins`` to see its traceback.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

UNKNOWN = re.compile(r"unknown (?P<slot>[a-z_]+) '(?P<kind>[^']+)'")
MAX_FILES = 200  # .py files beside the experiment looked at, at most
MAX_BYTES = 1_000_000  # bytes read of each


def _registers(text: str, kind: str) -> bool:
    quoted = re.escape(kind)
    return re.search(rf"""register\(\s*['"]{quoted}['"]""", text) is not None


def files_registering(kind: str, base_dir: Path, listed: Sequence[str]) -> list[str]:
    """``.py`` files in ``base_dir`` (not listed under ``plugins:``) whose source registers
    ``kind``."""
    listed_names = {Path(p).name for p in listed}
    out = []
    try:
        candidates = sorted(base_dir.glob("*.py"))[:MAX_FILES]
    except OSError:
        return []
    for path in candidates:
        if path.name in listed_names:
            continue
        try:
            with path.open("r", encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_BYTES)
        except OSError:
            continue
        if _registers(text, kind):
            out.append(path.name)
    return out


def plugin_hint(message: str, base_dir: Path, listed: Sequence[str], registry: Any) -> str:
    """``message`` with how to load the plugin that would supply its unknown kind (as
    given when there is nothing to suggest)."""
    found = UNKNOWN.search(message)
    if found is None:
        return message
    kind = found["kind"]
    files = files_registering(kind, base_dir, listed)
    if files:
        shown = ", ".join(files)
        return (f"{message} ({shown} beside the experiment registers {kind!r} but is not "
                f"loaded: add `plugins: [{files[0]}]` to the experiment, or pass "
                f"--plugin {files[0]})")
    failed = [f.name for f in getattr(registry, "failures", [])]
    if failed:
        return (f"{message} (installed plugin(s) {', '.join(failed)} failed to load and may "
                "supply it: `variantlab plugins` shows why)")
    return message


__all__ = ["files_registering", "plugin_hint"]
