"""Feature and label correlation under attack (Xu et al. 2021, §4.3 and §4.4).

* **Feature embedding**: the output of a named layer (a forward hook; feature maps are averaged over their
  spatial axes) for the clean and the adversarial samples, projected jointly onto two axes by PCA (the two
  groups share one projection, so distances between them mean something). Xu et al. use t-SNE; PCA is
  deterministic and needs no extra package.
* **Label co-occurrence** (multi-label): ``M = BᵀB`` of the thresholded predictions ``B`` (N × L), clean and
  attacked; ``M[a, b]`` counts the images where labels ``a`` and ``b`` are both predicted, its diagonal the
  label frequencies. Xu et al. find that attacks inflate the predicted labels and densify their co-occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    check_model,
    check_task,
    forward,
    key,
    named_attacks,
)
from .base import StudyResult

__all__ = ["correlation", "cooccurrence", "pca_2d", "layer_features"]


def cooccurrence(pred: Tensor) -> Tensor:
    """``(L, L)`` int64 ``BᵀB`` of multi-hot predictions ``B`` ``(N, L)``."""
    b = (pred.detach().cpu().double() > 0.5).double()
    return (b.T @ b).round().long()


def pca_2d(features: Tensor) -> tuple[Tensor, Tensor]:
    """Project ``(N, D)`` features onto their first two principal axes: ``(coords (N, 2), explained (2,))``.

    Exact (SVD of the centred matrix, float64); each axis' sign makes its largest loading positive, so the
    result is deterministic. ``explained`` is each axis' share of the total variance.
    """
    f = features.detach().cpu().double().reshape(features.shape[0], -1)
    f = f - f.mean(0, keepdim=True)
    if f.shape[1] < 2:
        f = torch.cat([f, torch.zeros(f.shape[0], 2 - f.shape[1], dtype=f.dtype)], 1)
    _, s, vh = torch.linalg.svd(f, full_matrices=False)
    comps = vh[:2]
    sign = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    comps = comps * torch.where(sign == 0, torch.ones_like(sign), sign)
    total = (s**2).sum()
    explained = (s[:2] ** 2) / total if total > 0 else torch.zeros(2, dtype=f.dtype)
    return f @ comps.T, explained


def layer_features(model: nn.Module, x: Tensor, layer: str | None) -> Tensor:
    """``(N, D)`` output of ``model.get_submodule(layer)`` on ``x`` (spatial axes averaged); ``None``: the logits."""
    if layer is None:
        out = forward(model, x)
    else:
        try:
            module = model.get_submodule(layer)
        except AttributeError:
            names = [n for n, _ in model.named_modules() if n]
            from ..params import closest

            c = closest(layer, names)
            raise ValueError(f"`layer` {layer!r} is not a submodule of the model"
                             f"{f'; did you mean {c!r}?' if c else ''} (layers: {', '.join(names[:20])}"
                             f"{', ...' if len(names) > 20 else ''})") from None
        captured: list[Tensor] = []

        def hook(_m: nn.Module, _inp: Any, output: Any) -> None:
            captured.append(output[0] if isinstance(output, tuple | list) else output)

        handle = module.register_forward_hook(hook)
        try:
            forward(model, x)
        finally:
            handle.remove()
        if not captured or not isinstance(captured[-1], Tensor):
            raise ValueError(f"layer {layer!r} produced no tensor output in the forward pass")
        out = captured[-1]
    out = out.detach()
    if out.ndim > 2:
        out = out.flatten(2).mean(2)
    return out.reshape(out.shape[0], -1).double().cpu()


def _labels(task: Task, y: Tensor, names: list[Any]) -> list[Any]:
    """Each sample's group (:meth:`Task.sample_group`: its class, its set of labels, its largest structure)."""
    y = y.detach().cpu()
    return [task.sample_group(y[i], names) for i in range(y.shape[0])]


def correlation(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    layer: str | None = None,
    label_names: Sequence[str] | None = None,
    max_points: int = 2000,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Feature embedding (clean vs adversarial) from a named layer, and label co-occurrence under attack.

    Args:
        model, task, data, attacks, target_fn: as for ``evaluate``. The embedding and co-occurrence matrices in
            ``meta`` use the first attack; the rows cover every attack.
        layer: a submodule name (``model.get_submodule``), e.g. ``"4"`` for the fifth layer of a Sequential;
            ``None``: the logits.
        label_names: names of the classes / labels (default: indices).
        max_points: at most this many samples (the first ones) in the embedding.

    Returns:
        ``StudyResult("correlation")``: one row per (attack, budget, label): ``clean_count``/``adv_count`` (samples
        predicted with the label: the co-occurrence diagonal for multi-label), ``clean_rowsum``/``adv_rowsum``
        (multi-label: the co-occurrence row sums, Xu et al.'s chord arc sizes), and per attack the
        ``feature_shift`` (mean distance between a sample's clean and adversarial features over the mean
        distance of clean features to their centroid). ``meta``: ``embedding`` ``{"clean": [[x, y]...], "adv":
        [[x, y]...], "labels": [...], "explained": [..]}``, ``cooccurrence`` ``{"clean": M, "adv": M, "labels":
        names}`` (multi-label), ``layer``, ``attack``.
    """
    check_model(model)
    check_task(task)
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the correlation study compares clean and attacked samples")
    if int(max_points) < 2:
        raise ValueError(f"`max_points` must be >= 2, got {max_points}")
    ys: list[Tensor] = []
    clean_pred: list[Tensor] = []
    adv_pred: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    f_clean: list[Tensor] = []
    f_adv: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    outputs = 0
    for batch in attacked_batches(model, task, data, named, target_fn):
        ys.append(batch.y.detach().cpu())
        clean_pred.append(task.predict(batch.clean_logits).detach().cpu())
        outputs = task.num_groups(batch.clean_logits)
        f_clean.append(layer_features(model, batch.x, layer))
        for i, att in enumerate(batch.attacked):
            adv_pred[i].append(task.predict(att.result.logits).detach().cpu())
            f_adv[i].append(layer_features(model, att.result.x_adv, layer))
    if not ys:
        raise ValueError("`data` is empty")
    y, cp = torch.cat(ys), torch.cat(clean_pred)
    num = outputs
    names: list[Any] = list(range(num)) if label_names is None else [str(n) for n in label_names]
    if len(names) != num:
        raise ValueError(f"`label_names` has {len(names)} names for {num} classes/labels")
    fc = torch.cat(f_clean)
    spread = float((fc - fc.mean(0)).norm(dim=1).mean()) or 1.0
    rows: list[dict[str, Any]] = []
    multilabel = task.classwise_view == "labels"  # 0/1 label vectors: label co-occurrence
    m_clean = cooccurrence(cp) if multilabel else None
    for i, (aname, atk) in enumerate(named):
        ap = torch.cat(adv_pred[i])
        shift = float((torch.cat(f_adv[i]) - fc).norm(dim=1).mean()) / spread
        if multilabel:
            assert m_clean is not None
            m_adv = cooccurrence(ap)
            counts_c, counts_a = m_clean.diagonal(), m_adv.diagonal()
            rs_c, rs_a = m_clean.sum(1), m_adv.sum(1)
        else:
            counts_c = torch.bincount(cp.reshape(-1).long(), minlength=num)
            counts_a = torch.bincount(ap.reshape(-1).long(), minlength=num)
        for j in range(num):
            row: dict[str, Any] = {"attack": aname, "budget": atk.budget, "label": names[j],
                                   "clean_count": int(counts_c[j]), "adv_count": int(counts_a[j])}
            if multilabel:
                row.update(clean_rowsum=int(rs_c[j]), adv_rowsum=int(rs_a[j]))
            row["feature_shift"] = shift
            rows.append(row)
    # the embedding: the first attack, the first max_points samples, one joint projection
    k = min(int(max_points), fc.shape[0])
    first = torch.cat(f_adv[0])
    coords, explained = pca_2d(torch.cat([fc[:k], first[:k]]))
    labels = [str(v) for v in _labels(task, y[:k], names)]
    meta: dict[str, Any] = {
        "layer": layer, "attack": key(named[0][0], named[0][1].budget), "labels": [str(n) for n in names],
        "embedding": {"clean": coords[:k].tolist(), "adv": coords[k:].tolist(), "labels": labels,
                      "explained": explained.tolist()},
    }
    if multilabel:
        assert m_clean is not None
        meta["cooccurrence"] = {"clean": m_clean.tolist(), "adv": cooccurrence(torch.cat(adv_pred[0])).tolist(),
                                "labels": [str(n) for n in names]}
    return StudyResult("correlation", rows, meta)
