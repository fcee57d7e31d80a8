"""Figures of explanation attacks: image, perturbation, original and attacked maps side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["plot_saliency_attack"]


def _plane(t: Tensor) -> Tensor:
    """A 2-D view: channel mean of an image, middle slice of a 3-D volume."""
    t = t.detach().float().cpu()
    while t.ndim > 2:
        t = t[t.shape[0] // 2] if t.ndim == 3 and t.shape[0] > 4 else t.mean(0)
    return t


def plot_saliency_attack(
    x: Tensor,
    x_adv: Tensor,
    map_clean: Tensor,
    map_adv: Tensor,
    *,
    rows: Sequence[int] | None = None,
    target_map: Tensor | None = None,
    row_titles: Sequence[str] | None = None,
    title: str | None = None,
    path: str | Path | None = None,
):
    """One row per sample: image, perturbation x' − x, clean map, attacked map (and target map).

    Args:
        x, x_adv: clean and adversarial batches ``(N, C, *spatial)`` (2-D or 3-D; 3-D shows the middle slice).
        map_clean, map_adv: saliency maps ``(N, *spatial)`` (e.g. ``AttackResult.extras["map"]`` / ``["map_adv"]``).
        rows: which samples to show (default: the first, at most 4).
        target_map: optional ``(N, *spatial)`` or ``(*spatial)`` target map, shown in a fifth column.
        row_titles: text under each row's image (e.g. the predictions and similarity numbers).
        title: figure title.
        path: save a PNG there (parent folders are created).

    Returns:
        the matplotlib ``Figure``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if x.shape != x_adv.shape or map_clean.shape != map_adv.shape or map_clean.shape[0] != x.shape[0]:
        raise ValueError("`x`/`x_adv` and `map_clean`/`map_adv` must have matching shapes and batch sizes")
    rows = list(range(min(4, x.shape[0]))) if rows is None else list(rows)
    ncol = 4 + (target_map is not None)
    fig, axes = plt.subplots(len(rows), ncol, figsize=(2.6 * ncol, 2.7 * len(rows)), squeeze=False)
    for r, i in enumerate(rows):
        img, adv = _plane(x[i]), _plane(x_adv[i])
        d = adv - img
        lim = float(d.abs().max()) or 1.0
        m0, m1 = _plane(map_clean[i]), _plane(map_adv[i])
        vmax = float(torch.maximum(m0.max(), m1.max())) or 1.0
        panels: list[tuple[Tensor, str, dict[str, Any]]] = [
            (img, "image", dict(cmap="gray")),
            (d, f"perturbation (max {lim:.3g})", dict(cmap="seismic", vmin=-lim, vmax=lim)),
            (m0, "original map", dict(cmap="inferno", vmin=0, vmax=vmax)),
            (m1, "attacked map", dict(cmap="inferno", vmin=0, vmax=vmax)),
        ]
        if target_map is not None:
            t = target_map[i] if target_map.ndim == map_clean.ndim else target_map
            panels.append((_plane(t), "target map", dict(cmap="inferno")))
        for c, (data, name, kw) in enumerate(panels):
            ax = axes[r][c]
            ax.imshow(data.numpy(), **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize=9)
        if row_titles is not None:
            axes[r][0].set_xlabel(row_titles[r], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        from ..safe_io import save_figure

        save_figure(fig, p, dpi=110)  # never through a link (issue 28)
    return fig
