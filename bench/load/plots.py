"""PNG plots of a harness run (matplotlib, the ``bench`` extra; Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

TARGET_STEP_MS = 50.0
TARGET_HELLO_MS = 20.0


def _cdf(ax: Any, samples: list[float], label: str) -> None:
    if not samples:
        return
    xs = sorted(samples)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


def latency_cdf(runs: list[dict[str, Any]], hellos: dict[str, Any] | None, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    ax = axes[0]
    for run in runs:
        _cdf(ax, run["samples_ms"], f"{run['lessons']} lessons, {run['start']}")
    ax.axvline(TARGET_STEP_MS, color="red", linestyle="--", label="target p99 ≤ 50 ms")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("audio.completed + window → next PLAY_MEDIA at the board: error (ms)")
    ax.set_ylabel("share of steps")
    ax.set_title("Next clip: error seen by the boards")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    if hellos is not None:
        for phase in ("staggered", "burst"):
            label = f"{hellos['sessions']} devices, {phase}"
            _cdf(ax, hellos[phase]["samples_ms"], label)
    ax.axvline(TARGET_HELLO_MS, color="red", linestyle="--", label="target p99 ≤ 20 ms")
    ax.set_xscale("log")
    ax.set_xlabel("hello published → reply received at the device (ms)")
    ax.set_ylabel("share of hellos")
    ax.set_title("Xiaozhi hello → reply")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cpu_vs_n(runs: list[dict[str, Any]], stream: dict[str, Any] | None, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    ax = axes[0]
    for start, marker in (("staggered", "o"), ("simultaneous", "s")):
        mine = sorted((r for r in runs if r["start"] == start), key=lambda r: r["lessons"])
        if not mine:
            continue
        ns = [r["lessons"] for r in mine]
        ax.plot(ns, [r["gateway_core_share"] for r in mine], marker=marker,
                label=f"gateway, {start}")  # fmt: skip
        ax.plot(ns, [r["broker_core_share"] for r in mine], marker=marker, linestyle=":",
                label=f"broker, {start}")  # fmt: skip
        ax.plot(ns, [r["others_core_share"] for r in mine], marker=marker, linestyle="--",
                color="grey", alpha=0.6, label=f"other work on the machine (cores), {start}")  # fmt: skip
    ax.axhline(1.0, color="red", linestyle="--", label="one core")
    ax.set_xlabel("concurrent lessons")
    ax.set_ylabel("CPU (share of one core) over the lessons")
    ax.set_title("Lessons: CPU vs N")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    if stream is not None and stream["runs"]:
        runs_k = sorted(stream["runs"], key=lambda r: r["sessions"])
        ks = [r["sessions"] for r in runs_k]
        ax.plot(ks, [r["gateway_core_share"] for r in runs_k], marker="o",
                label="gateway CPU (share of a core)")  # fmt: skip
        ax.plot(ks, [r["others_core_share"] for r in runs_k], linestyle="--", color="grey",
                alpha=0.6, label="other work on the machine (cores)")  # fmt: skip
        if stream["floor"]["sessions_per_core"]:  # 0: no floor tick fell in the window
            floor_share = [k / stream["floor"]["sessions_per_core"] for k in ks]
            ax.plot(ks, floor_share, linestyle=":", label="floor: the libraries, on its thread")
        bad = [r for r in runs_k if not r["zero_drops"]]
        if bad:
            ax.scatter([r["sessions"] for r in bad], [r["gateway_core_share"] for r in bad],
                       color="red", zorder=3, label="datagrams lost")  # fmt: skip
    ax.axhline(1.0, color="red", linestyle="--", label="one core")
    ax.set_xlabel("streaming Xiaozhi sessions (listening)")
    ax.set_ylabel("CPU (share of one core)")
    ax.set_title("Streaming: CPU vs sessions")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
