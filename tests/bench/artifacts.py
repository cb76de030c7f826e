"""Artifacts: saving and loading against copying the file; a step that saves an artifact against
one that returns the same bytes inline.

* ``files``: for 1 MiB and 100 MiB, ``ArtifactStore.save_blocking`` of a file's bytes (read from
  the file, hashed, checked, written through a temporary file and renamed, its record committed
  to SQLite) and ``load_blocking`` (read, digest checked) against ``shutil.copyfile`` of the same
  file, in the same folder. Each timed save is of a different file (identical bytes would be
  stored once: no write at all); everything is in the page cache, as a second read would be.
  Target (issue 35): each at most 1.5x the copy, median against median.
* ``steps``: a one-step plan run by the engine with a SQLite state store (the journal keeps each
  output), its tool making N bytes of text and either returning them inline (``{"content":
  ...}``) or saving them as an artifact and returning its reference. At 1 KiB the target is at
  most 2x the inline step; at 10 MiB the ratio is stated.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from stratagem.agents import Tool, ToolRegistry, tool
from stratagem.planning import (
    ArtifactsConfig,
    ArtifactStore,
    Engine,
    Plan,
    PlanStatus,
    SqliteStateStore,
    ToolContext,
    ToolStep,
)

__all__ = [
    "FILE_TARGET",
    "STEP_TARGET",
    "ArtifactsBenchConfig",
    "artifacts_section",
    "run_artifacts_benchmark",
]

FILE_TARGET: Final = 1.5
STEP_TARGET: Final = 2.0
_API: Final = {
    "save": "save (bytes)",
    "load": "load (bytes)",
    "save_file": "save_file",
    "load_file": "load_file",
}
_MIB: Final = 1 << 20


@dataclass(frozen=True)
class ArtifactsBenchConfig:
    """Sizes and repeats."""

    file_sizes: tuple[int, ...] = (_MIB, 100 * _MIB)
    file_repeats: tuple[int, ...] = (30, 5)
    step_sizes: tuple[int, ...] = (1024, 10 * _MIB)
    step_repeats: tuple[int, ...] = (200, 5)


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


_CPU: dict[str, list[float]] = {}
"""CPU time (every thread of the process) of the timed actions by the name ``_timed`` gives."""


def _timed(action: Callable[[], object], cpu: str = "") -> float:
    started, used = time.perf_counter(), time.process_time()
    action()
    took = time.perf_counter() - started
    if cpu:
        _CPU.setdefault(cpu, []).append(time.process_time() - used)
    return took


def _files(folder: Path, size: int, repeats: int) -> dict[str, Any]:
    sources = []
    for i in range(repeats + 1):
        path = folder / f"src-{size}-{i}.bin"
        with path.open("wb") as handle:
            handle.write(i.to_bytes(8, "big") + os.urandom(size - 8))
        sources.append(path)
    store = ArtifactStore.open(folder / f"store-{size}")
    _CPU.clear()
    save, load, copy, hashed, plain, save_file, load_file = [], [], [], [], [], [], []
    # one untimed round of each, then the timed ones, interleaved
    for i, path in enumerate(sources):
        name = f"a{i}.bin"
        took_save = _timed(
            lambda p=path, n=name: store.save_blocking(
                n, p.read_bytes(), media_type="application/octet-stream"
            )
        )
        took_copy = _timed(
            lambda p=path, i=i: shutil.copyfile(p, folder / f"copy-{size}-{i}"), "copy" if i else ""
        )
        took_load = _timed(lambda n=name: store.load_blocking(n))
        took_save_file = _timed(
            lambda p=path, n=name: store.save_file_blocking(
                f"f{n}", p, media_type="application/octet-stream"
            ),
            "save_file" if i else "",
        )
        took_load_file = _timed(
            lambda n=name, i=i: store.load_file_blocking(f"f{n}", folder / f"out-{size}-{i}"),
            "load_file" if i else "",
        )
        data = path.read_bytes()
        took_hash = _timed(lambda d=data: hashlib.sha256(d).hexdigest(), "sha256" if i else "")
        took_plain = _timed(
            lambda p=path, i=i: (folder / f"plain-{size}-{i}").write_bytes(p.read_bytes())
        )
        del data
        if i:
            save.append(took_save)
            copy.append(took_copy)
            load.append(took_load)
            hashed.append(took_hash)
            plain.append(took_plain)
            save_file.append(took_save_file)
            load_file.append(took_load_file)
    store.index.close()
    for path in folder.iterdir():
        if path.is_file():
            path.unlink()
    shutil.rmtree(folder / f"store-{size}", ignore_errors=True)
    result = {
        "bytes": size,
        "repeats": repeats,
        "save_ms": _median_ms(save),
        "load_ms": _median_ms(load),
        "copy_ms": _median_ms(copy),
        "read_write_ms": _median_ms(plain),
        "sha256_ms": _median_ms(hashed),
        "save_file_ms": _median_ms(save_file),
        "load_file_ms": _median_ms(load_file),
    }
    for kind in ("save_file", "load_file", "copy", "sha256"):
        result[f"{kind}_cpu_ms"] = _median_ms(_CPU[kind])
    result["save_file_ratio"] = round(result["save_file_ms"] / result["copy_ms"], 2)
    result["load_file_ratio"] = round(result["load_file_ms"] / result["copy_ms"], 2)
    result["save_ratio"] = round(result["save_ms"] / result["copy_ms"], 2)
    result["load_ratio"] = round(result["load_ms"] / result["copy_ms"], 2)
    return result


async def _steps(folder: Path, size: int, repeats: int) -> dict[str, Any]:
    store = ArtifactStore.open(folder / f"steps-{size}")
    # The same save with every blob a file (what a small artifact cost before its bytes were
    # kept with its record), measured in the same run.
    files = ArtifactStore.open(folder / f"steps-files-{size}", ArtifactsConfig(index_bytes=0))
    plans = SqliteStateStore(folder / f"plans-{size}.sqlite3")
    counter = [0]

    def text(ctx: ToolContext) -> str:
        counter[0] += 1
        head = f"{ctx.plan_id}:{counter[0]}:"
        return head + "x" * (size - len(head))

    @tool
    async def inline(ctx: ToolContext) -> dict[str, Any]:
        """Return the bytes inline."""
        return {"content": text(ctx)}

    def saving(into: ArtifactStore, name: str, what: str) -> Tool[Any, Any]:
        async def save(ctx: ToolContext) -> dict[str, Any]:
            record = await into.save(
                "out.txt",
                text(ctx).encode(),
                media_type="text/plain",
                scope="plan",
                scope_id=ctx.plan_id,
            )
            return {"artifact": record.ref.to_json()["$artifact"]}

        return tool(name=name, description=f"Save the bytes as an artifact {what}.")(save)

    saved = saving(store, "saved", "(kept with its record when small)")
    saved_file = saving(files, "saved_file", "in a blob file")

    registry = ToolRegistry("tactical")
    registry.register(inline)
    registry.register(saved)
    registry.register(saved_file)
    engine = Engine(tools=registry, agent="tactical", store=plans)
    variants = (("inline", "inline"), ("artifact", "saved"), ("file", "saved_file"))
    times: dict[str, list[float]] = {variant: [] for variant, _ in variants}
    cpu: dict[str, list[float]] = {variant: [] for variant, _ in variants}
    for i in range(repeats + 1):
        for variant, name in variants:
            plan = Plan(
                id=f"bench-{size}-{variant}-{i}",
                owner="tactical",
                goal="bench",
                steps=[ToolStep(id="make", tool=name)],
            )
            started, used = time.perf_counter(), time.process_time()
            result = await engine.run(plan)
            took = time.perf_counter() - started
            used = time.process_time() - used
            if result.status is not PlanStatus.SUCCEEDED:
                raise RuntimeError(f"{variant} at {size} bytes: {result.failures}")
            if i:
                times[variant].append(took)
                cpu[variant].append(used)
    await plans.aclose()
    store.index.close()
    files.index.close()
    out = {
        "bytes": size,
        "repeats": repeats,
        "kept": size <= store.config.index_bytes,
        "inline_ms": _median_ms(times["inline"]),
        "artifact_ms": _median_ms(times["artifact"]),
        "file_ms": _median_ms(times["file"]),
    }
    out["ratio"] = round(out["artifact_ms"] / out["inline_ms"], 2)
    out["file_ratio"] = round(out["file_ms"] / out["inline_ms"], 2)
    out["inline_cpu_ms"] = _median_ms(cpu["inline"])
    out["artifact_cpu_ms"] = _median_ms(cpu["artifact"])
    out["cpu_ratio"] = round(out["artifact_cpu_ms"] / max(out["inline_cpu_ms"], 1e-6), 2)
    return out


def run_artifacts_benchmark(
    config: ArtifactsBenchConfig | None = None, *, folder: Path | None = None
) -> dict[str, Any]:
    """Both parts; the folder (a temporary one by default) is emptied after."""
    config = config or ArtifactsBenchConfig()
    started_load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        root = Path(tmp)
        files = [
            _files(root, size, repeats)
            for size, repeats in zip(config.file_sizes, config.file_repeats, strict=True)
        ]
        # The files above leave gigabytes for the disk to write back; file creations wait on that
        # writeback (the inline steps make none), so the steps start once it is done.
        os.sync()
        steps = [
            asyncio.run(_steps(root, size, repeats))
            for size, repeats in zip(config.step_sizes, config.step_repeats, strict=True)
        ]
    targets = [
        {
            "what": f"{_API[kind]} {_size(item['bytes'])} vs copying the file",
            "ratio": item[f"{kind}_ratio"],
            "max_ratio": FILE_TARGET,
            "met": item[f"{kind}_ratio"] <= FILE_TARGET,
        }
        for item in files
        for kind in ("save", "load", "save_file", "load_file")
    ]
    small = steps[0]
    targets.append(
        {
            "what": f"a step saving {small['bytes']} bytes vs returning them inline",
            "ratio": small["ratio"],
            "max_ratio": STEP_TARGET,
            "met": small["ratio"] <= STEP_TARGET,
        }
    )
    return {
        "config": asdict(config),
        "files": files,
        "steps": steps,
        "targets": targets,
        "load_average": [round(x, 1) for x in (*started_load, *os.getloadavg())],
        "cpus": os.cpu_count(),
    }


def _size(size: int) -> str:
    return f"{size // _MIB} MiB" if size >= _MIB else f"{size // 1024} KiB"


def artifacts_section(result: dict[str, Any] | None) -> list[str]:
    """The section of BENCHMARKS.md."""
    lines = ["## Artifacts: save and load vs copying, a saving step vs an inline one", ""]
    if not result or "files" not in result:
        return [*lines, f"Not measured: {(result or {}).get('skipped', 'no result')}.", ""]
    lines += [
        "How it was measured (`tests/bench/artifacts.py`): `ArtifactStore.save_blocking` of a "
        "file's bytes (read, SHA-256, media type checked, written to a temporary file and renamed, "
        "record committed to SQLite) and `load_blocking` (read, digest checked) against "
        "`shutil.copyfile` of the same file in the same folder, and `save_file_blocking`/"
        "`load_file_blocking` (the file copied in one pass through a reused 256 KiB buffer to a "
        "private temporary file, each chunk hashed as it passes, then renamed), each timed save "
        "of a different file; "
        "medians, page cache warm. Then (after `os.sync()`, so the files' writeback does not "
        "land on the steps' file creations) a one-step plan on the engine with a SQLite state "
        "store whose tool returns N bytes of text inline, against one that saves them as an "
        "artifact and returns the reference. `shutil.copyfile` copies in the kernel "
        "(`copy_file_range`/`sendfile`) without reading the bytes into the process; a save and a "
        "load must read and hash every byte (the digest is the address, and every read is "
        "checked), so the read+write and SHA-256 columns show what that floor costs here.",
        "",
        "| bytes | save ms | load ms | save_file ms | load_file ms | copy ms | read+write ms | "
        "SHA-256 alone ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for item in result["files"]:
        lines.append(
            f"| {_size(item['bytes'])} | {item['save_ms']} | {item['load_ms']} | "
            f"{item.get('save_file_ms', '-')} | {item.get('load_file_ms', '-')} | "
            f"{item['copy_ms']} | {item.get('read_write_ms', '-')} | {item.get('sha256_ms', '-')} |"
        )
    if all("save_file_cpu_ms" in item for item in result["files"]):
        lines += [
            "",
            "CPU time of the same actions (every thread of the process, medians): what the machine "
            "spends whatever its load, where wall times above also count the waits for a CPU on a "
            "busy machine.",
            "",
            "| bytes | save_file CPU ms | load_file CPU ms | copy CPU ms | SHA-256 alone CPU ms |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for item in result["files"]:
            lines.append(
                f"| {_size(item['bytes'])} | {item['save_file_cpu_ms']} | "
                f"{item['load_file_cpu_ms']} | {item['copy_cpu_ms']} | {item['sha256_cpu_ms']} |"
            )
    cpu = all("cpu_ratio" in item for item in result["steps"])
    lines += [
        "",
        "| bytes | bytes kept with the record | inline step ms | artifact step ms | "
        "artifact / inline | blob-file step ms | blob file / inline |"
        + (" inline CPU ms | artifact CPU ms | CPU artifact / inline |" if cpu else ""),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
        + (" ---: | ---: | ---: |" if cpu else ""),
    ]
    for item in result["steps"]:
        lines.append(
            f"| {_size(item['bytes'])} | {'yes' if item.get('kept') else 'no'} | "
            f"{item['inline_ms']} | {item['artifact_ms']} | {item['ratio']}x | "
            f"{item.get('file_ms', '-')} | {item.get('file_ratio', '-')}x |"
            + (
                f" {item['inline_cpu_ms']} | {item['artifact_cpu_ms']} | {item['cpu_ratio']}x |"
                if cpu
                else ""
            )
        )
    lines += ["", "| target | measured | verdict |", "| --- | ---: | ---: |"]
    for target in result["targets"]:
        verdict = "**met**" if target["met"] else "**not met**"
        lines.append(
            f"| {target['what']} ≤ {target['max_ratio']}x | {target['ratio']}x | {verdict} |"
        )
    lines.append("")
    if result.get("load_average"):
        load = result["load_average"]
        lines += [
            f"Machine load during the run (1, 5, 15 min averages, at the start then the end, on "
            f"{result.get('cpus')} CPUs): {load[:3]} then {load[3:]}; a busy machine (and the "
            f"disk's writeback of 100 MiB files) makes every figure here noisy (compare runs "
            "on a quiet machine).",
            "",
        ]
    for item in result["files"]:
        if not item.get("sha256_ms"):
            continue
        alone = item["sha256_ms"] / item["copy_ms"]
        lines.append(
            f"Floor at {_size(item['bytes'])}: SHA-256 alone takes {alone:.2f}x the kernel copy, "
            f"so a save or load that copies and hashes every byte (the digest is the address, "
            f"and every read is checked) costs at least {1 + alone:.2f}x the copy on one core."
        )
    lines.append(
        "A step saving a small artifact runs the save on the caller's thread "
        "(`ArtifactsConfig.on_loop_bytes`, no hop to a worker thread), and its bytes are kept "
        "with its record (`ArtifactsConfig.index_bytes`, 16 KiB): what it adds to the inline "
        "step is the index's own SQLite transaction, apart from the journal's. The blob-file "
        "column is the same save with `index_bytes=0` (a file created, written and renamed per "
        "save), in the same run."
    )
    return [*lines, ""]
