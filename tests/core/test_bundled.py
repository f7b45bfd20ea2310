"""The parsed-data cache of the bundled TOML files: the same dicts as tomllib, made again whenever the file, its place
or the cache entry is not what was cached, and never needed (no home, a read-only or unusable cache folder)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from servescope.core import bundled
from servescope.core.bundled import DATA_DIR, bundled_toml, cache_folder


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "servescope" / "data"


@pytest.fixture()
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder of one file, ``x.toml``, in place of the package's."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "x.toml").write_text('version = 1\nname = "first"\n')
    monkeypatch.setattr(bundled, "DATA_DIR", folder)
    return folder


@pytest.mark.parametrize("name", sorted(p.name for p in DATA_DIR.glob("*.toml")))
def test_every_bundled_file_reads_as_tomllib_reads_it_parsed_and_cached(name: str, cache: Path) -> None:
    expected = tomllib.loads((DATA_DIR / name).read_text(encoding="utf-8"))
    assert bundled_toml(name) == expected  # parsed, then cached
    assert len(list(cache.iterdir())) == 1
    assert bundled_toml(name) == expected  # from the cache


def test_the_cache_serves_a_fresh_copy(cache: Path, data: Path) -> None:
    bundled_toml("x.toml")["name"] = "changed by a caller"
    assert bundled_toml("x.toml")["name"] == "first"


def test_a_changed_file_is_parsed_again(cache: Path, data: Path) -> None:
    assert bundled_toml("x.toml")["name"] == "first"
    stat = (data / "x.toml").stat()
    (data / "x.toml").write_text('version = 1\nname = "other"\n')  # the same size
    os.utime(data / "x.toml", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert bundled_toml("x.toml")["name"] == "other"
    assert bundled_toml("x.toml")["name"] == "other"


def test_another_checkout_has_its_own_entry(cache: Path, data: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bundled_toml("x.toml")
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.toml").write_text('version = 1\nname = "elsewhere"\n')
    monkeypatch.setattr(bundled, "DATA_DIR", other)
    assert bundled_toml("x.toml")["name"] == "elsewhere"
    assert len(list(cache.iterdir())) == 2


def test_a_damaged_entry_is_not_read(cache: Path, data: Path) -> None:
    bundled_toml("x.toml")
    (entry,) = cache.iterdir()
    blob = bytearray(entry.read_bytes())
    blob[-3] ^= 0xFF  # a flipped byte in the marshalled data: the CRC no longer holds
    entry.write_bytes(bytes(blob))
    assert bundled_toml("x.toml") == {"version": 1, "name": "first"}
    entry.write_bytes(b"garbage")
    assert bundled_toml("x.toml") == {"version": 1, "name": "first"}


def test_a_file_marshal_cannot_hold_is_parsed_every_time(cache: Path, data: Path) -> None:
    (data / "x.toml").write_text("when = 2026-12-06\n")
    assert str(bundled_toml("x.toml")["when"]) == "2026-12-06"
    assert not cache.exists() or not list(cache.iterdir())


def test_no_cache_folder_at_all(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
    assert cache_folder() is None
    assert bundled_toml("x.toml")["name"] == "first"


def test_a_cache_folder_that_cannot_be_made(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "blocked"  # a file where the cache folder would be (root ignores a read-only folder)
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert bundled_toml("x.toml")["name"] == "first"
    assert bundled_toml("x.toml")["name"] == "first"
    assert blocked.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "data"]  # no temporary file left


def test_a_relative_xdg_cache_home_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_folder() == tmp_path / ".cache" / "servescope" / "data"


def test_bad_toml_is_an_error_and_never_cached(cache: Path, data: Path) -> None:
    (data / "x.toml").write_text("version = \n")
    with pytest.raises(tomllib.TOMLDecodeError):
        bundled_toml("x.toml")
    assert not cache.exists() or not list(cache.iterdir())
