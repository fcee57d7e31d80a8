"""Feature and label correlation under attack (Xu et al. 2021, §4.3 and §4.4).

* **Feature embedding** (Fig. 7): the output of a named layer (a forward hook; feature maps are averaged over
  their spatial axes) for four groups: the model's **training** data (Xu et al.'s control group: where each
  class lives; given as ``train_data``, or ``train: {source: ...}`` in a config), the **clean** test samples,
  the same samples with **noise** of the adversarial perturbation's norm (a control: is the shift a matter of
  size?), and the **adversarial** samples. All groups are embedded jointly (one fit, so distances between them
  mean something) by PCA (exact, deterministic) and t-SNE (scikit-learn, seeded; spec 000 A29: PCA to 50 axes
  first, perplexity 30, PCA initialisation). Each space (the features themselves, and each embedding) gets the
  distances between group centroids and a kNN separability of group pairs; with training data, a kNN probe
  reads each test group's labels off the training features (Xu et al.'s layer "accuracy").
* **Label co-occurrence** (multi-label): ``M = BᵀB`` of the thresholded predictions ``B`` (N × L), clean and
  attacked; ``M[a, b]`` counts the images where labels ``a`` and ``b`` are both predicted, its diagonal the
  label frequencies. Xu et al. find that attacks inflate the predicted labels and densify their co-occurrence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ..config_schema import DataSection
from ..report.blocks import (
    MARKERS,
    PALETTE,
    Section,
    StudyLike,
    data_table,
    figure_image,
    grid,
    heatmap,
    pretty_key,
    pyplot,
    raw_table,
    style_axes,
)
from ..tasks import Task
from ._common import (
    AttackSpec,
    TargetFn,
    attacked_batches,
    batches,
    check_model,
    check_task,
    forward,
    key,
    named_attacks,
)
from .base import StudyResult
from .registry import Int, Number, StudySpec, one_model, register_study

__all__ = ["correlation", "cooccurrence", "pca_2d", "tsne_2d", "layer_features", "knn_separability", "knn_probe",
           "matched_noise"]


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


def tsne_2d(features: Tensor, *, seed: int = 0, perplexity: float = 30.0, pca_dims: int = 50) -> Tensor:
    """Joint 2-D t-SNE of ``(N, D)`` features (scikit-learn ``TSNE``; spec 000 A29: PCA to at most ``pca_dims``
    axes first, perplexity ``min(perplexity, (N − 1) / 3)``, PCA initialisation, ``random_state=seed``).

    t-SNE is non-parametric: every group (train, clean, noisy, adversarial) must be embedded in the same call.
    Deterministic for a seed (and a machine); distances between far clusters carry little meaning, neighbours do.
    """
    n = features.shape[0]
    if n < 8:
        raise ValueError(f"t-SNE needs at least 8 points, got {n}; use `embedding: [pca]` for so few samples")
    try:
        from sklearn.manifold import TSNE
    except ImportError as e:  # pragma: no cover - scikit-learn is a dependency
        raise ImportError("the t-SNE embedding needs scikit-learn (pip install scikit-learn); or use "
                          "`embedding: [pca]`") from e
    f = features.detach().cpu().double().reshape(n, -1)
    f = f - f.mean(0, keepdim=True)
    k = min(int(pca_dims), f.shape[1], n)
    if f.shape[1] > k:  # exact PCA (SVD) to k axes, as in pca_2d
        _, _, vh = torch.linalg.svd(f, full_matrices=False)
        f = f @ vh[:k].T
    perp = float(min(perplexity, max(1.0, (n - 1) / 3)))
    out = TSNE(n_components=2, perplexity=perp, init="pca", random_state=int(seed)).fit_transform(f.numpy())
    return torch.as_tensor(out, dtype=torch.float64)


def knn_separability(a: Tensor, b: Tensor, k: int = 5) -> float:
    """How well a point's ``k`` nearest neighbours tell group ``a`` from group ``b`` (``(n_a, d)``, ``(n_b, d)``):
    leave-one-out kNN balanced accuracy of the group label. 0.5: the groups are mixed; 1: fully separated."""
    pts = torch.cat([a, b]).double()
    lab = torch.cat([torch.zeros(a.shape[0]), torch.ones(b.shape[0])]).bool()
    n = pts.shape[0]
    k = max(1, min(int(k), n - 1))
    d = torch.cdist(pts, pts)
    d.fill_diagonal_(math.inf)
    nn_idx = d.topk(k, largest=False).indices
    votes = lab[nn_idx].double().mean(1)
    pred = votes > 0.5  # k odd: no tie between the two groups; an even k's tie counts as group a
    acc_a = float((~pred[~lab]).double().mean()) if a.shape[0] else math.nan
    acc_b = float(pred[lab].double().mean()) if b.shape[0] else math.nan
    return (acc_a + acc_b) / 2


def knn_probe(ref: Tensor, ref_labels: Sequence[str], query: Tensor, query_labels: Sequence[str], k: int = 5) -> float:
    """Share of ``query`` points whose ``k`` nearest ``ref`` points vote for their own label (majority, ties to
    the nearest): Xu et al.'s layer "accuracy" of test features against the training features (spec 000 A29)."""
    k = max(1, min(int(k), ref.shape[0]))
    idx = torch.cdist(query.double(), ref.double()).topk(k, largest=False).indices
    right = 0
    for i, row in enumerate(idx.tolist()):
        votes: dict[str, int] = {}
        for j in row:
            votes[ref_labels[j]] = votes.get(ref_labels[j], 0) + 1
        best = max(votes.values())
        winner = next(ref_labels[j] for j in row if votes[ref_labels[j]] == best)  # tie: the nearest
        right += winner == query_labels[i]
    return right / max(1, len(query_labels))


def matched_noise(x: Tensor, x_adv: Tensor, box: Any, *, norm: str = "l2",
                  generator: torch.Generator | None = None, iters: int = 30) -> Tensor:
    """Gaussian noise with each sample's L2 (``norm="l2"``) or L∞ (``"linf"``) norm equal to its adversarial
    perturbation's, *after* clipping to ``box``: a fixed draw ``z`` per sample, its scale found by bisection so
    that ``‖clip(x + s z) − x‖`` matches (clipping removes part of the noise on dark backgrounds). A control group:
    is the adversarial shift a matter of perturbation size? Where even a huge scale cannot reach the norm (a
    sample at the box's corner), the largest reachable is used."""
    if norm not in ("l2", "linf"):
        raise ValueError(f"`noise` must be 'l2' or 'linf', got {norm!r}")
    x = x.detach()
    p = 2.0 if norm == "l2" else math.inf
    target = (x_adv.detach() - x).flatten(1).norm(p=p, dim=1)
    z = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(device=x.device, dtype=x.dtype)
    z = z / z.flatten(1).norm(p=p, dim=1).clamp_min(1e-12).reshape(-1, *([1] * (x.ndim - 1)))
    shape = (-1, *([1] * (x.ndim - 1)))

    def measure(scale: Tensor) -> Tensor:
        return (box.clip(x + z * scale.reshape(shape)) - x).flatten(1).norm(p=p, dim=1)

    lo = torch.zeros_like(target)
    hi = target.clone()
    for _ in range(8):  # clipping only shrinks: grow the bracket until it reaches the target
        hi = torch.where(measure(hi) < target, hi * 2, hi)
    for _ in range(int(iters)):
        mid = (lo + hi) / 2
        short = measure(mid) < target
        lo, hi = torch.where(short, mid, lo), torch.where(short, hi, mid)
    return box.clip(x + z * hi.reshape(shape))


def _ssim_noise(x: Tensor, x_adv: Tensor, box: Any, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Gaussian noise with each sample's SSIM to ``x`` equal to its adversarial example's (Paschali et al.'s
    control, :func:`~medadv.studies.corruptions.match_noise`): ``(x_noise, ssim_adv, ssim_noise)``, the SSIMs
    ``(N,)`` float64 on the CPU."""
    from ..metrics.image import ssim
    from .corruptions import _win, match_noise

    x, x_adv = x.detach(), x_adv.detach().to(x.device)
    rng, win = box.data_range(x), _win(x)
    s_adv = ssim(x, x_adv, data_range=rng, win_size=win)
    x_noise, _ = match_noise(x, s_adv, box=box, match="ssim", noise="gaussian", generator=generator)
    s_noise = ssim(x, x_noise, data_range=rng, win_size=win)
    return x_noise, s_adv.double().cpu(), s_noise.detach().double().cpu()


_GROUPS = ("train", "clean", "noisy", "adv")
_PAIRS = (("clean", "adv"), ("clean", "noisy"), ("noisy", "adv"), ("train", "clean"), ("train", "adv"))


def _space_stats(space: str, points: dict[str, Tensor], labels: dict[str, list[str]], k: int,
                 attack: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Centroid distances (over the clean spread) and kNN separability of the group pairs; the kNN label probe
    of the test groups against the training group."""
    clean = points["clean"]
    spread = float((clean - clean.mean(0)).norm(dim=1).mean()) or 1.0
    sep = []
    for a, b in _PAIRS:
        if a in points and b in points:
            dist = float((points[a].mean(0) - points[b].mean(0)).norm()) / spread
            sep.append({"attack": attack, "space": space, "pair": f"{a}|{b}", "centroid_distance": dist,
                        "knn_separability": knn_separability(points[a], points[b], k)})
    probe = []
    if "train" in points:
        for g in ("clean", "noisy", "adv"):
            probe.append({"attack": attack, "space": space, "group": g,
                          "knn_label_accuracy": knn_probe(points["train"], labels["train"], points[g],
                                                          labels[g], k)})
    return sep, probe


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
    embedding: Sequence[str] = ("pca", "tsne"),
    train_data: Any = None,
    noise: str = "l2",
    seed: int = 0,
    perplexity: float = 30.0,
    knn: int = 5,
) -> StudyResult:
    """Feature embedding (train / clean / noisy / adversarial) from a named layer, and label co-occurrence under
    attack (Xu et al. 2021, §4.3 Fig. 7 and §4.4 Fig. 8).

    Args:
        model, task, data, attacks, target_fn: as for ``evaluate``. The embeddings and co-occurrence matrices in
            ``meta`` use the first attack; the rows cover every attack.
        layer: a submodule name (``model.get_submodule``), e.g. ``"4"`` for the fifth layer of a Sequential;
            ``None``: the logits. Feature maps are averaged over their spatial axes.
        label_names: names of the classes / labels (default: indices).
        max_points: at most this many samples per group (the first ones) in the embeddings.
        embedding: ``"pca"`` (exact, :func:`pca_2d`) and/or ``"tsne"`` (:func:`tsne_2d`, Xu et al.'s), each
            fitted jointly on all groups.
        train_data: the model's training data (any form ``data`` takes): Xu et al.'s control group, whose clean
            features show where each class lives; the kNN probe reads the test groups' labels off it. ``None``:
            no train group and no probe.
        noise: the noisy control group: Gaussian noise with each sample's ``"l2"`` or ``"linf"`` norm equal to
            its adversarial perturbation's (data units), clipped to the attack's box; or ``"ssim"``: Gaussian
            noise with each sample's SSIM to the clean image equal to its adversarial example's (Paschali et al.
            2018, Fig. 3; :func:`~medadv.studies.corruptions.match_noise`; the box must have one data range).
        seed: seed of the noise (a private generator) and of t-SNE.
        perplexity: t-SNE perplexity (capped at (N − 1) / 3).
        knn: neighbours of the kNN separability and probe.

    Returns:
        ``StudyResult("correlation")``: one row per (attack, budget, label): ``clean_count``/``adv_count`` (samples
        predicted with the label: the co-occurrence diagonal for multi-label), ``clean_rowsum``/``adv_rowsum``
        (multi-label: the co-occurrence row sums, Xu et al.'s chord arc sizes), and per attack the
        ``feature_shift`` (mean distance between a sample's clean and adversarial features over the mean
        distance of clean features to their centroid) and ``noise_shift`` (the same for the norm-matched noise:
        the control). ``meta``: ``embeddings`` ``{method: {"groups": {group: [[x, y]...]}, "labels": {group:
        [...]}, "explained": [..] (pca)}}``; ``embedding`` (the first method, ``clean``/``adv``/``labels`` as
        before); ``separation``: rows ``{attack, space ("features" or a method), pair ("clean|adv", ...),
        centroid_distance (over the clean spread), knn_separability (0.5 mixed .. 1 separated)}``; ``probe``
        (with ``train_data``): rows ``{attack, space, group, knn_label_accuracy}``; ``noise`` (``match``, the mean
        norms ``adv_norm`` / ``noise_norm`` (L2 for ``"ssim"``), and for ``"ssim"`` the mean SSIMs ``ssim_adv``
        / ``ssim_noise``); ``cooccurrence`` ``{"clean": M, "adv": M, "labels": names}`` (multi-label),
        ``layer``, ``attack``.
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    named = named_attacks(attacks)
    if not named:
        raise ValueError("`attacks` is empty: the correlation study compares clean and attacked samples")
    if int(max_points) < 2:
        raise ValueError(f"`max_points` must be >= 2, got {max_points}")
    methods = list(dict.fromkeys(str(m) for m in embedding))
    if not methods or any(m not in ("pca", "tsne") for m in methods):
        raise ValueError(f"`embedding` must list 'pca' and/or 'tsne', got {list(embedding)}")
    if noise not in ("l2", "linf", "ssim"):
        raise ValueError(f"`noise` must be 'l2', 'linf' or 'ssim', got {noise!r}")
    if noise == "ssim":  # SSIM needs one data range: a per-channel box of several widths is refused before any work
        for _, atk in named:
            if atk.box.bounds is not None:
                atk.box.data_range()
    if int(knn) < 1:
        raise ValueError(f"`knn` must be >= 1, got {knn}")
    gen = torch.Generator().manual_seed(int(seed))
    ys: list[Tensor] = []
    clean_pred: list[Tensor] = []
    adv_pred: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    f_clean: list[Tensor] = []
    f_adv: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    f_noise: dict[int, list[Tensor]] = {i: [] for i in range(len(named))}
    norms: dict[str, list[Tensor]] = {"adv": [], "noise": [], "ssim_adv": [], "ssim_noise": []}
    outputs = 0
    for batch in attacked_batches(model, task, data, named, target_fn):
        ys.append(batch.y.detach().cpu())
        clean_pred.append(task.predict(batch.clean_logits).detach().cpu())
        outputs = task.num_groups(batch.clean_logits)
        f_clean.append(layer_features(model, batch.x, layer))
        for i, att in enumerate(batch.attacked):
            adv_pred[i].append(task.predict(att.result.logits).detach().cpu())
            f_adv[i].append(layer_features(model, att.result.x_adv, layer))
            if noise == "ssim":
                x_noise, s_adv, s_noise = _ssim_noise(batch.x, att.result.x_adv, att.attack.box, gen)
            else:
                x_noise = matched_noise(batch.x, att.result.x_adv, att.attack.box, norm=noise, generator=gen)
            f_noise[i].append(layer_features(model, x_noise, layer))
            if i == 0:
                # SSIM matching keeps no norm: its L2 norms are recorded, to show how much noise the SSIM allows
                p = math.inf if noise == "linf" else "fro"
                norms["adv"].append((att.result.x_adv - batch.x).flatten(1).norm(p=p, dim=1).detach().double().cpu())
                norms["noise"].append((x_noise - batch.x).flatten(1).norm(p=p, dim=1).detach().double().cpu())
                if noise == "ssim":
                    norms["ssim_adv"].append(s_adv)
                    norms["ssim_noise"].append(s_noise)
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
        nshift = float((torch.cat(f_noise[i]) - fc).norm(dim=1).mean()) / spread
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
            row["noise_shift"] = nshift
            rows.append(row)
    # the embeddings: the first attack, the first max_points samples of each group, one joint fit per method
    k = min(int(max_points), fc.shape[0])
    groups: dict[str, Tensor] = {}
    labels: dict[str, list[str]] = {}
    if train_data is not None:
        ft, yt = [], []
        for xt, ytb in batches(train_data):
            ft.append(layer_features(model, xt, layer))
            yt.append(ytb.detach().cpu())
            if sum(f.shape[0] for f in ft) >= int(max_points):
                break
        if not ft:
            raise ValueError("`train_data` is empty")
        groups["train"] = torch.cat(ft)[: int(max_points)]
        labels["train"] = [str(v) for v in _labels(task, torch.cat(yt)[: int(max_points)], names)]
        if groups["train"].shape[1] != fc.shape[1]:
            raise ValueError(f"`train_data` gives {groups['train'].shape[1]} features per sample, `data` "
                             f"{fc.shape[1]}: the two must be the same kind of input")
    test_labels = [str(v) for v in _labels(task, y[:k], names)]
    groups.update(clean=fc[:k], noisy=torch.cat(f_noise[0])[:k], adv=torch.cat(f_adv[0])[:k])
    labels.update(clean=test_labels, noisy=test_labels, adv=test_labels)
    order = [g for g in _GROUPS if g in groups]
    sizes = [groups[g].shape[0] for g in order]
    stacked = torch.cat([groups[g] for g in order])
    attack_key = key(named[0][0], named[0][1].budget)
    separation, probe = _space_stats("features", groups, labels, knn, attack_key)
    embeddings: dict[str, Any] = {}
    for method in methods:
        if method == "pca":
            coords, explained = pca_2d(stacked)
        else:
            coords, explained = tsne_2d(stacked, seed=seed, perplexity=perplexity), None
        parts = dict(zip(order, coords.split(sizes), strict=True))
        sep, prb = _space_stats(method, parts, labels, knn, attack_key)
        separation += sep
        probe += prb
        embeddings[method] = {"groups": {g: parts[g].tolist() for g in order}, "labels": labels}
        if explained is not None:
            embeddings[method]["explained"] = explained.tolist()
    first = embeddings[methods[0]]
    meta: dict[str, Any] = {
        "layer": layer, "attack": attack_key, "labels": [str(n) for n in names],
        "embeddings": embeddings, "separation": separation,
        "embedding": {"method": methods[0], "clean": first["groups"]["clean"], "adv": first["groups"]["adv"],
                      "noisy": first["groups"]["noisy"], "labels": test_labels,
                      "explained": first.get("explained")},
        "noise": {"match": noise, "adv_norm": float(torch.cat(norms["adv"]).mean()),
                  "noise_norm": float(torch.cat(norms["noise"]).mean()),
                  **({"kind": "gaussian", "norm": "l2", "ssim_adv": float(torch.cat(norms["ssim_adv"]).mean()),
                      "ssim_noise": float(torch.cat(norms["ssim_noise"]).mean())} if noise == "ssim" else {})},
        "seed": seed,
    }
    if probe:
        meta["probe"] = probe
    if multilabel:
        assert m_clean is not None
        meta["cooccurrence"] = {"clean": m_clean.tolist(), "adv": cooccurrence(torch.cat(adv_pred[0])).tolist(),
                                "labels": [str(n) for n in names]}
    return StudyResult("correlation", rows, meta)


# --- the report section -------------------------------------------------------------------------------------------
def _draw_correlation(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    blocks: list[Any] = []
    emb = study.meta.get("embedding")
    embs = study.meta.get("embeddings")
    if isinstance(embs, Mapping) and embs:  # train / clean / noisy / adversarial, one panel per method
        from matplotlib.lines import Line2D

        colours = {"train": "#BBBBBB", "clean": PALETTE[0], "noisy": PALETTE[2], "adv": PALETTE[1]}
        match = (study.meta.get("noise") or {}).get("match") if isinstance(study.meta.get("noise"), Mapping) else None
        same = "Gaussian noise, same SSIM" if match == "ssim" else "noise, same norm"
        shown = {"train": "train (control)", "clean": "clean", "noisy": same, "adv": "adversarial"}
        fig, axes = grid(len(embs), 2, 5.0, 4.2)
        for ax, (method, e) in zip(axes, embs.items(), strict=False):
            groups = e.get("groups") or {}
            labels = e.get("labels") or {}
            tops = sorted({str(v) for vs in labels.values() for v in vs})[:4]
            for g in ("train", "clean", "noisy", "adv"):
                pts = groups.get(g) or []
                labs = [str(v) for v in labels.get(g, [])]
                for mi, lab in enumerate(tops + ["other"]):
                    sel = [p for p, q in zip(pts, labs or ["other"] * len(pts), strict=False)
                           if (q == lab) or (lab == "other" and q not in tops)]
                    if sel:
                        ax.scatter([p[0] for p in sel], [p[1] for p in sel], s=12 if g == "train" else 18,
                                   marker=MARKERS[mi % len(MARKERS)], color=colours[g],
                                   alpha=0.45 if g == "train" else 0.85, linewidths=0)
            ex = e.get("explained")
            note = f" ({100 * sum(ex):.0f}% of the variance)" if ex else ""
            style_axes(ax, "axis 1", "axis 2", f"{'PCA' if method == 'pca' else 't-SNE'}{note}")
        handles = [Line2D([], [], ls="", marker="o", color=colours[g], label=shown[g])
                   for g in ("train", "clean", "noisy", "adv") if any(g in (e.get("groups") or {}) for e in embs.values())]
        first = next(iter(embs.values()))
        tops = sorted({str(v) for vs in (first.get("labels") or {}).values() for v in vs})[:4]
        handles += [Line2D([], [], ls="", marker=MARKERS[i % len(MARKERS)], color="#444444", label=f"label {t}")
                    for i, t in enumerate(tops)]
        fig.legend(handles=handles, loc="upper center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
        what = f" of layer {study.meta['layer']}" if study.meta.get("layer") else ""
        under = f" under {pretty_key(study.meta['attack'])}" if study.meta.get("attack") else ""
        blocks.append(figure_image(fig, f"PCA and t-SNE of the features{what}{under}",
                                   "Features of the groups embedded jointly (colour: group; marker: label). Xu et al. "
                                   "(Fig. 7): adversarial samples leave their class among the training features, "
                                   f"{'Gaussian noise of the same SSIM' if match == 'ssim' else 'noise of the same norm'}"
                                   " (the control) does not."))
        sep = study.meta.get("separation") or []
        if sep:
            blocks.append(data_table(sep, ["space", "pair", "centroid_distance", "knn_separability"],
                                     "Per space and pair of groups: distance between centroids (over the clean spread) "
                                     "and kNN separability (0.5: mixed, 1: separated)."))
        probe = study.meta.get("probe") or []
        if probe:
            blocks.append(data_table(probe, ["space", "group", "knn_label_accuracy"],
                                     "kNN probe: the share of test samples whose nearest training features carry "
                                     "their label."))
    elif isinstance(emb, Mapping) and emb.get("clean"):
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7.2, 4.6))
        from matplotlib.lines import Line2D

        clean_pts, adv_pts = emb["clean"], emb.get("adv") or []
        labels = [str(v) for v in (emb.get("labels") or ["all"] * len(clean_pts))]
        # the 7 most frequent labels (or label sets) get a colour, the rest are grey "other"
        counts: dict[str, int] = {}
        for lab in labels:
            counts[lab] = counts.get(lab, 0) + 1
        top = sorted(counts, key=lambda c: -counts[c])[:7]
        colour = {c: PALETTE[i] for i, c in enumerate(top)}
        if len(adv_pts) == len(clean_pts):  # where each sample moved
            for p, q in zip(clean_pts, adv_pts, strict=True):
                ax.plot([p[0], q[0]], [p[1], q[1]], color="#999999", lw=0.5, alpha=0.35, zorder=1)
        for pts, marker in ((clean_pts, "o"), (adv_pts, "x")):
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=22, zorder=2, alpha=0.9,
                       c=[colour.get(lab, "#BBBBBB") for lab in labels[: len(pts)]])
        handles = [Line2D([], [], ls="", marker="s", color=colour[c], label=c) for c in top]
        if len(counts) > len(top):
            handles.append(Line2D([], [], ls="", marker="s", color="#BBBBBB", label="other"))
        handles += [Line2D([], [], ls="", marker="o", color="#444444", label="clean"),
                    Line2D([], [], ls="", marker="x", color="#444444", label="attacked")]
        what = f" of layer {study.meta['layer']}" if study.meta.get("layer") else ""
        under = f" under {pretty_key(study.meta['attack'])}" if study.meta.get("attack") else ""
        style_axes(ax, "component 1", "component 2", f"feature embedding{what}{under}")
        ax.legend(handles=handles, fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  title="label", title_fontsize=7)
        fig.tight_layout()
        blocks.append(figure_image(fig, "2-D projection of clean and adversarial feature embeddings",
                                   "2-D projection of the features. Circles: clean samples; crosses: the same samples "
                                   "attacked (a grey line joins the two), coloured by true label. Attacked samples "
                                   "that land in another label's cluster are read by the model as that label."))
    co = study.meta.get("cooccurrence")
    if isinstance(co, Mapping) and co.get("clean"):
        names = list(co.get("labels") or class_names or [str(j) for j in range(len(co["clean"]))])
        mats = [("clean", co["clean"])] + ([("attacked", co["adv"])] if co.get("adv") else [])
        if co.get("adv"):
            mats.append(("attacked − clean", [[(float(a or 0) - float(b or 0)) for a, b in zip(ra, rb, strict=False)]
                                              for ra, rb in zip(co["adv"], co["clean"], strict=False)]))
        size = min(4.8, 1.8 + 0.35 * len(names))
        fig, axes = grid(len(mats), 3, size + 0.8, size)
        vmax = max([1e-9] + [abs(float(v or 0)) for _, m in mats[:2] for row in m for v in row])
        dmax = max([1e-9] + [abs(float(v)) for row in mats[-1][1] for v in row]) if len(mats) == 3 else 1.0
        for ax, (title, m) in zip(axes, mats, strict=False):
            diff = title.startswith("attacked −")
            integer = all(float(v or 0).is_integer() for row in m for v in row)
            heatmap(ax, m, names, names, title=title, cmap="RdBu_r" if diff else "viridis",
                    vmin=-dmax if diff else 0.0, vmax=dmax if diff else vmax, digits=0 if integer else 2)
        fig.tight_layout()
        blocks.append(figure_image(fig, "label co-occurrence, clean vs attacked",
                                   "How often two labels are predicted together; the attack changes which labels "
                                   "appear together."))
    if study.rows:
        blocks.append(raw_table(study.rows, "all rows of the correlation study"))
    return Section("study-correlation", "Feature and label correlation (Xu et al.)",
                   "Where attacked samples land in the model's feature space, and how labels co-occur.", blocks)


# --- the config entry ---------------------------------------------------------------------------------------------
@register_study("correlation", draw=_draw_correlation, check_options={"embedding": ["pca"]})
class CorrelationSpec(StudySpec):
    """Feature embedding from ``layer`` (``null``: the logits) and label co-occurrence under attack (Xu et al.).

    ``embedding``: ``pca`` and/or ``tsne`` (each fitted jointly on all groups). ``train``: the model's training data
    as a ``data:`` section (``{source: mni152, n: 200, kwargs: {...}}``, any source; paths relative to the config's
    folder): Xu et al.'s control group in the embedding and the kNN probe's reference
    (without it: no train group). ``noise``: the noisy control matches each adversarial perturbation's ``l2`` or
    ``linf`` norm, or (``ssim``) each adversarial example's SSIM, as Paschali et al. (Fig. 3) matched it. ``seed``: the noise and t-SNE. ``knn``: neighbours of the separability score and the probe."""

    study: Literal["correlation"]
    layer: str | None = Field(None, min_length=1)
    label_names: list[str] | None = None
    max_points: Int = Field(2000, ge=2)
    embedding: Annotated[list[Literal["pca", "tsne"]], Field(min_length=1)] = ["pca", "tsne"]
    train: DataSection | None = None
    noise: Literal["l2", "linf", "ssim"] = "l2"
    seed: Int = 0
    perplexity: Number = Field(30.0, gt=0.0)
    knn: Int = Field(5, ge=1)

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        train = None if self.train is None else self.load(self.train, task)
        return correlation(one_model(models, self), task, data, attacks if attacks is not None else {}, layer=self.layer,
                           label_names=self.label_names, max_points=self.max_points, target_fn=target_fn,
                           embedding=self.embedding, train_data=train, noise=self.noise, seed=self.seed,
                           perplexity=self.perplexity, knn=self.knn)
