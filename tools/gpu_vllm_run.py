#!/usr/bin/env python3
"""Prepare a real-vLLM session on the lent H200 and bring its captures home (stdlib only, runs here).

The lent machine has no network and no vLLM; ``../shared/gpu-vllm/build_payload.sh`` builds a ~117 MB
payload (vLLM 0.26.0 for its torch 2.11 + CUDA 13) that travels in parts, one per device call (a call
carries the working tree plus at most 64 MiB). ``tools/gpu_vllm/device_session.sh`` is every call's command
there: it stages the parts it is given, installs once all are there, and runs the loop on real servers.

  python3 tools/gpu_vllm_run.py build            # ~5 min once: payload into the cache (--cache DIR)
  python3 tools/gpu_vllm_run.py stage            # .p0 .. .pN-1 (git-ignored), sized to fit beside the tree;
                                                 # the last one holds install.sh, make_models.py, SHA256SUMS,
                                                 # a wheel of this checkout, the cp312 wheels of deflate
                                                 # and pyahocorasick
  python3 tools/gpu_vllm_run.py calls            # the device calls to make, in order, back to back
  python3 tools/gpu_vllm_run.py collect DIR      # captures.tar from a call's files -> tests/data/h200-vllm/

The part size: 64 MiB less what travels anyway (tracked + untracked-not-ignored files), less the wheels,
less a margin; ``--parts N`` forces N parts instead.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO / ".." / "shared" / "gpu-vllm").resolve()
CACHE = Path(os.environ.get("SERVESCOPE_GPU_VLLM_CACHE", Path.home() / ".cache" / "servescope" / "gpu-vllm"))
ARCHIVE = "vllm-site.tar.xz"
MIB = 1 << 20
CALL_LIMIT = 64 * MIB
MARGIN = 3 * MIB
SCRIPTS = ("install.sh", "make_models.py")
DATA = REPO / "tests" / "data" / "h200-vllm"
PLAT = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux2014_x86_64"]


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def tree_bytes() -> int:
    """What every call carries anyway: tracked files plus untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True).stdout
    total = 0
    for name in out.decode().split("\0"):
        p = REPO / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def cmd_build(args: argparse.Namespace) -> None:
    cache = Path(args.cache)
    if (cache / "SHA256SUMS").is_file() and not args.force:
        print(f"payload already built in {cache} (--force to rebuild)")
        return
    cache.mkdir(parents=True, exist_ok=True)
    _run(["bash", str(SHARED / "build_payload.sh"), str(cache)])


def _archive_parts(cache: Path) -> list[Path]:
    parts = sorted(cache.glob(f"{ARCHIVE}.part-*"))
    if not parts or not (cache / "SHA256SUMS").is_file():
        raise SystemExit(f"no payload in {cache}: run `{sys.argv[0]} build` first")
    want = next(line.split()[0] for line in (cache / "SHA256SUMS").read_text().splitlines()
                if line.split()[-1].lstrip("*") == ARCHIVE)
    h = hashlib.sha256()
    for p in parts:
        with p.open("rb") as f:
            while chunk := f.read(8 * MIB):
                h.update(chunk)
    if h.hexdigest() != want:
        raise SystemExit(f"{cache}: joined parts do not match SHA256SUMS; rebuild with --force")
    return parts


def cmd_stage(args: argparse.Namespace) -> None:
    cache = Path(args.cache)
    parts = _archive_parts(cache)
    total = sum(p.stat().st_size for p in parts)
    for old in REPO.glob(".p[0-9]*"):
        shutil.rmtree(old)
    wheels = REPO / ".p-wheels.tmp"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir()
    # The wheel is made from the last commit, not the working tree: others may be mid-edit, and the results
    # then name one commit (session.txt prints servescope's version and the commit).
    with tempfile.TemporaryDirectory() as src:
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True, text=True,
                              capture_output=True).stdout.strip()
        (wheels / "SERVESCOPE_COMMIT").write_text(head + "\n")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
              src], cwd=src)
    print(f"servescope wheel from HEAD {head}")
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLAT, "-d", str(wheels), "deflate>=0.7",
          "pyahocorasick>=2.0"])
    extra = sum(p.stat().st_size for p in wheels.iterdir()) + sum((SHARED / s).stat().st_size for s in SCRIPTS)
    tree = tree_bytes()
    room = CALL_LIMIT - tree - MARGIN
    if room - extra <= MIB:
        raise SystemExit(f"the tree ({tree / MIB:.1f} MiB) leaves no room for a payload part beside it in a "
                         f"{CALL_LIMIT / MIB:.0f} MiB call: carry less (untrack large test data for the staging calls)")
    if args.parts:
        n = args.parts
    else:
        n = 1
        while -(-total // n) + extra > room:
            n += 1
    size = -(-total // n)
    if size + extra > room:
        raise SystemExit(f"{n} parts of {size / MIB:.1f} MiB do not fit beside the tree ({tree / MIB:.1f} MiB)")
    dirs = [REPO / f".p{i}" for i in range(n)]
    for d in dirs:
        d.mkdir()
    # re-split the joined archive into n parts; SHA256SUMS for the new parts and the whole
    lines = []
    whole = hashlib.sha256()
    buf = b""
    i = 0

    def flush(data: bytes, index: int) -> None:
        name = f"{ARCHIVE}.part-{index:02d}"
        (dirs[index] / name).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")

    for p in parts:
        with p.open("rb") as f:
            while chunk := f.read(8 * MIB):
                whole.update(chunk)
                buf += chunk
                while len(buf) >= size and i < n - 1:
                    flush(buf[:size], i)
                    buf, i = buf[size:], i + 1
    flush(buf, i)
    lines.append(f"{whole.hexdigest()}  {ARCHIVE}")
    last = dirs[-1]
    (last / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    for s in SCRIPTS:
        shutil.copy2(SHARED / s, last / s)
    for w in wheels.iterdir():
        shutil.move(str(w), last / w.name)
    wheels.rmdir()
    print(f"tree {tree / MIB:.1f} MiB travels with every call; payload {total / MIB:.1f} MiB in {n} parts")
    for d in dirs:
        b = sum(p.stat().st_size for p in d.iterdir())
        print(f"  {d.name}: {b / MIB:5.1f} MiB  -> a call carries {(b + tree) / MIB:5.1f} MiB of 64  "
              f"({', '.join(sorted(p.name for p in d.iterdir()))})")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(dirs[0])], cwd=REPO).returncode == 0
    if not ignored:
        print("WARNING: .p0 is not git-ignored: it would travel with every call; add `/.p[0-9]*/` to .gitignore")


def calls(plan: list[str]) -> list[dict[str, object]]:
    dirs = sorted(REPO.glob(".p[0-9]*"), key=lambda d: int(d.name[2:]))
    if not dirs:
        raise SystemExit(f"nothing staged: run `{sys.argv[0]} stage` first")
    script = "bash tools/gpu_vllm/device_session.sh"
    out: list[dict[str, object]] = [{"carry": [d.name], "command": script, "timeout_s": 300} for d in dirs[:-1]]
    out.append({"carry": [dirs[-1].name], "command": f"{script} {plan[0]}".strip(), "timeout_s": 600})
    out += [{"carry": [], "command": f"{script} {word}", "timeout_s": 600} for word in plan[1:]]
    return out


def cmd_calls(args: argparse.Namespace) -> None:
    todo = calls(args.plan)
    if args.json:
        print(json.dumps(todo, indent=1))
        return
    print("Make these `run` calls back to back (a machine stays warm ~30 s between calls; /tmp there is lost "
          "when it goes back): ")
    for i, c in enumerate(todo, 1):
        print(f"{i}. carry={json.dumps(c['carry'])} timeout_s={c['timeout_s']} command={c['command']!r}")


def cmd_collect(args: argparse.Namespace) -> None:
    src = Path(args.files_at)
    tars = sorted(src.glob("captures*.tar"))  # captures.tar, or one captures-<folder>.tar each when large
    if not tars:
        raise SystemExit(f"no captures.tar in {src}")
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    keep = {"rank0.pt.trace.json.gz", "frontend.async_llm.pt.trace.json.gz", "profiler_out_0.txt", "provenance.json",
            "settings.json", "server-log-lines.txt"}
    for tar in tars:
        _extract(tar, dest, keep)
    if args.without_python_frames:
        for trace in sorted(dest.glob("*/rank0.pt.trace.json.gz")):
            _drop_python_frames(trace)
    _report(dest, keep)


# Where the device's run tool keeps the checkout and $OUT; a settings document names them (the server's cwd and
# environment), and the project keeps no machine's paths: they are written as these.
DEVICE_PATHS = {"/work/main": "/srv/checkout", "/root/out": "/srv/out"}


def _drop_python_frames(trace: Path) -> None:
    """Rewrite ``trace`` without its ``python_function`` events (three quarters of a capture with python stacks),
    and say so in the folder's provenance.json: every other event stays as recorded."""
    with gzip.open(trace, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    kept = [e for e in events if e.get("cat") != "python_function"]
    doc["traceEvents"] = kept
    with gzip.open(trace, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(doc, fh, separators=(",", ":"))
    prov_path = trace.parent / "provenance.json"
    prov = json.loads(prov_path.read_text(encoding="utf-8"))
    prov["python_frames_removed"] = (f"{len(events) - len(kept)} python_function events removed by "
                                     f"tools/gpu_vllm_run.py collect --without-python-frames; every other event "
                                     f"as recorded")
    prov_path.write_text(json.dumps(prov, indent=1) + "\n", encoding="utf-8")


def _extract(tar: Path, dest: Path, keep: set[str]) -> None:
    with tarfile.open(tar) as t:
        for m in t.getmembers():
            parts = Path(m.name).parts
            if not m.isfile() or len(parts) != 3 or parts[0] != "captures" or parts[2] not in keep:
                continue
            target = dest / parts[1] / parts[2]
            target.parent.mkdir(parents=True, exist_ok=True)
            f = t.extractfile(m)
            assert f is not None
            data = f.read()
            if parts[2] == "settings.json":
                text = data.decode("utf-8")
                for there, here in DEVICE_PATHS.items():
                    text = text.replace(f'"{there}', f'"{here}')
                data = text.encode("utf-8")
            target.write_bytes(data)


def _report(dest: Path, keep: set[str]) -> None:
    for d in sorted(p for p in dest.iterdir() if p.is_dir()):
        size = sum(p.stat().st_size for p in d.iterdir())
        missing = keep - {p.name for p in d.iterdir()} - {"frontend.async_llm.pt.trace.json.gz", "settings.json",
                                                          "server-log-lines.txt"}
        print(f"{d.name:22s} {size / 1e6:6.2f} MB" + (f"  MISSING {sorted(missing)}" if missing else ""))
    print(f"total {sum(p.stat().st_size for p in dest.rglob('*') if p.is_file()) / 1e6:.2f} MB in {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the payload into the cache (~5 min)")
    b.add_argument("--cache", default=str(CACHE))
    b.add_argument("--force", action="store_true")
    s = sub.add_parser("stage", help="the part folders .p0 .. .pN-1, the wheels and scripts in the last")
    s.add_argument("--cache", default=str(CACHE))
    s.add_argument("--parts", type=int, default=0, help="number of parts (default: the fewest that fit)")
    c = sub.add_parser("calls", help="the device calls, in order")
    c.add_argument("plan", nargs="*", default=["graphs", "eager"], help="plan words: graphs, eager")
    c.add_argument("--json", action="store_true")
    k = sub.add_parser("collect", help="unpack captures.tar from a call's files into the test data")
    k.add_argument("files_at")
    k.add_argument("--dest", default=str(DATA))
    k.add_argument("--without-python-frames", action="store_true",
                   help="drop the rank traces' python_function events (said in each provenance.json)")
    args = ap.parse_args()
    {"build": cmd_build, "stage": cmd_stage, "calls": cmd_calls, "collect": cmd_collect}[args.cmd](args)


if __name__ == "__main__":
    main()
