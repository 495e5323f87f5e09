"""Fixtures for the SageMaker job lane: payloads/ on the import path, like the job's code channel."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "payloads") not in sys.path:
    sys.path.insert(0, str(REPO / "payloads"))
