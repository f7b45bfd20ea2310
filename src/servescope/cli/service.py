"""service render / lint / import / install / start / stop / status / restart."""

from __future__ import annotations
