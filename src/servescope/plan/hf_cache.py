"""A model's ``config.json`` in the Hugging Face hub cache, where vLLM and SGLang put the models they download.

``plan --model Qwen/Qwen3-30B-A3B`` on the serving box reads the config the server loaded, without the user
finding its folder. The cache's layout is the one the Hub documents for other implementations
(huggingface.co/docs/hub/local-cache): ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``;
in it ``models--ORG--NAME/refs/main`` holds the commit of the revision ``main`` and
``models--ORG--NAME/snapshots/COMMIT/`` that revision's files. Nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "cached_config"]


def cache_dir() -> Path:
    """The hub cache this environment uses."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def cached_config(repo_id: str) -> Path | None:
    """The cached ``config.json`` of the model ``repo_id`` (``ORG/NAME``) at the revision ``main`` names, else
    the only snapshot that holds one; ``None`` when the cache has none (or several snapshots and no ``main``)."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".")):
        return None
    repo = cache_dir() / ("models--" + repo_id.replace("/", "--"))
    try:
        main = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        main = ""
    if main and (repo / "snapshots" / main / "config.json").is_file():
        return repo / "snapshots" / main / "config.json"
    found = sorted((repo / "snapshots").glob("*/config.json")) if (repo / "snapshots").is_dir() else []
    return found[0] if len(found) == 1 else None
