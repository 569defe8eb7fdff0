"""The state-space and delta-rule mixers (mamba2, mamba, gated_deltanet) against sequence
length: forward+backward time and activation memory, chunked and recurrent, with attention
as the reference. The measurement is benchmarks/mixers.py's (same model, same tables); only
the list of mixers differs.

    .venv/bin/python benchmarks/ssm.py [--threads 1] [--repeats 3] [--markdown F] [--plot F]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mixers as bench  # noqa: E402  (benchmarks/mixers.py)

bench.MIXERS = {
    "mha naive": {"kind": "mha"},
    "mha sdpa": {"kind": "mha", "impl": "sdpa"},
    "mamba2 chunked": {"kind": "mamba2"},
    "mamba chunked": {"kind": "mamba"},
    "gated_deltanet chunked": {"kind": "gated_deltanet"},
    "mamba2 recurrent": {"kind": "mamba2", "impl": "recurrent"},
    "mamba recurrent": {"kind": "mamba", "impl": "recurrent"},
    "gated_deltanet recurrent": {"kind": "gated_deltanet", "impl": "recurrent"},
}

if __name__ == "__main__":
    raise SystemExit(bench.main())
