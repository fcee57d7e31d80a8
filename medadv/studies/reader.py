"""Two-alternative forced-choice (2AFC) reader study (Zhang et al., Radiology: AI 2024, §"observer study").

Zhang et al. showed two radiologists 270 pairs (original, perturbed) in random order and asked which image
was altered; they reported the share correct (23.3% and 44.8%) without a test. This study prepares such a
reading and scores it against chance:

1. :func:`reader_study` attacks the data and keeps ``pairs`` (clean, adversarial) pairs: the images
   themselves (``show="image"``, the paper's setting) or one explanation's maps of them (``show="map"``).
   Each pair's order is drawn with ``seed``: which side holds the adversarial one is the *key*. Images are
   rendered as 8-bit greyscale/RGB PNGs (the paper's radiographs were presumably 8-bit exports, spec 002
   A12): pixel values are mapped from the data box (or the pair's joint range on unbounded data),
   maps min–max scaled per map. The PNGs live in ``StudyResult.meta`` (base64), so the study runs from a
   config without an output folder, and its JSON holds everything.
2. :func:`export_reader_study` writes, for the readers, ``pair_XXX_left.png`` / ``pair_XXX_right.png`` and
   ``answers.csv`` (``pair_id, left, right, answer`` with an empty ``answer`` column), and, for the
   experimenter only, ``key.csv`` (``pair_id, adversarial, attack, budget, sample``) into a separate folder
   (default ``<folder>/../<name>_key``): give the readers the first folder only.
3. :func:`score_reader_study` reads the filled answer sheet (``left``/``right``) and the key: number
   correct, n, the share correct with its exact (Clopper–Pearson) 95% CI, and the exact one-sided binomial
   test against chance (H1: the readers find the adversarial image more often than 1/2); a second p value
   tests the other side (below chance, as the paper's 23.3% reader: the images were distinguishable and the
   cue read backwards). Per-attack breakdowns are given where the key names attacks.

Config entry::

    studies:
      - {study: reader_study, pairs: 20, seed: 0, show: image}
      - {study: reader_study, pairs: 20, show: map, explanation: gradient, attack: relevance}

Rows of the result: one per pair (``pair_id, attack, budget, sample, adversarial``, the key).
"""

from __future__ import annotations

import base64
import csv
import io
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field, Strict
from torch import Tensor, nn

from ..attacks.base import Attack
from ..explain import Explanation, get_explanation
from ..explain.base import ClassScores
from ..report.blocks import Section, StudyLike, escape, raw_table
from ..tasks import Task
from ._common import AttackSpec, TargetFn, attacked_batches, check_model, check_task, key, named_attacks
from .base import StudyResult
from .registry import StudySpec, one_model, register_study

__all__ = ["reader_study", "export_reader_study", "score_reader_study", "ReaderStudySpec", "SIDES"]

SIDES = ("left", "right")


def _images_only(x: Tensor) -> None:
    """Refuse a batch that is not 2-D images (the readers see PNGs), before anything runs on it."""
    if x.ndim != 4:
        raise ValueError(f"the reader study shows 2-D images (N, C, H, W); got a batch of shape {tuple(x.shape)}")


# --- building the pairs ---------------------------------------------------------------------------------------------
def _to_uint8(img: Tensor, lo: float, hi: float) -> np.ndarray:
    """``(C, H, W)`` → ``(H, W)`` or ``(H, W, 3)`` uint8 over ``[lo, hi]``."""
    span = hi - lo if hi > lo else 1.0
    a = ((img.detach().double().cpu() - lo) / span).clamp(0, 1).mul(255).round().to(torch.uint8).numpy()
    return a[0] if a.shape[0] == 1 else np.moveaxis(a[:3], 0, -1)


def _png(a: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _range(attack: Attack, clean: Tensor, adv: Tensor) -> tuple[float, float]:
    b = attack.box.bounds
    if b is not None and all(isinstance(v, int | float) for v in b):
        lo, hi = float(b[0]), float(b[1])
        if math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            return lo, hi
    both = torch.stack([clean, adv])
    return float(both.min()), float(both.max())


def _map_label(model: nn.Module, x: Tensor, label: int | None) -> Tensor:
    if label is not None:
        return torch.full((x.shape[0],), int(label), dtype=torch.long, device=x.device)
    with torch.no_grad():
        return ClassScores(model)(x).argmax(1)


def reader_study(
    model: nn.Module,
    task: Task,
    data: Any,
    attacks: AttackSpec,
    *,
    pairs: int = 20,
    seed: int = 0,
    show: str = "image",
    explanation: str | Mapping[str, Any] | Explanation = "gradient",
    label: int | None = None,
    attack: str | None = None,
    target_fn: TargetFn | None = None,
) -> StudyResult:
    """Attack ``data`` and prepare ``pairs`` randomised (clean, adversarial) pairs for a 2AFC reading.

    Args:
        model: the attacked network.
        task: its task.
        data: ``(x, y)`` or an iterable of batches (as in ``evaluate``); 2-D images ``(N, C, H, W)``.
        attacks: the attacks (one, a list or ``{name: attack}``); samples are taken in data order, each
            attack in turn, until ``pairs`` pairs are collected.
        pairs: number of pairs (>= 1).
        seed: seed of the left/right order of each pair and of the order of the pairs.
        show: ``"image"`` (the input images, the paper's setting) or ``"map"`` (``explanation``'s maps of
            the clean and the adversarial image, both on ``model``).
        explanation: for ``show="map"``: a registered explanation name, ``{name: ..., **params}`` or an
            instance (evaluation-only ones such as ``"xrai"`` are fine).
        label: for ``show="map"``: the class whose map is shown; default each clean image's top class.
        attack: use only the attack of this name.
        target_fn: ``target_fn(x, y, clean_logits)`` for targeted attacks (as in ``evaluate``).

    Returns:
        ``StudyResult("reader_study")``: one row per pair (the key); ``meta["images"]`` ``{pair_id: {"left":
        b64 PNG, "right": b64 PNG}}``, ``meta["show"]``, ``meta["seed"]``. Write the readers' folder with
        :func:`export_reader_study`, score it with :func:`score_reader_study`.
    """
    model = check_task(task).logits_model(check_model(model))  # declared probabilities: logits
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"`pairs` must be an int >= 1, got {pairs!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int, got {seed!r}")
    if show not in ("image", "map"):
        raise ValueError(f"`show` must be 'image' or 'map', got {show!r}")
    expl = get_explanation(explanation) if show == "map" else None
    named = named_attacks(attacks)
    if attack is not None:
        named = [(n, a) for n, a in named if n == attack]
        if not named:
            raise ValueError(f"`attack` names no attack of the study: {attack!r} (attacks: "
                             f"{', '.join(n for n, _ in named_attacks(attacks)) or 'none'})")
    if not named:
        raise ValueError("the reader study needs at least one attack (its pairs are clean vs attacked)")
    found: list[dict[str, Any]] = []
    offset = 0
    for batch in attacked_batches(model, task, data, named, target_fn, check=_images_only):
        for att in batch.attacked:
            x_adv = att.result.x_adv
            if expl is not None:
                lab = _map_label(model, batch.x, label)
                shown_clean, shown_adv = expl(model, batch.x, lab)[:, None], expl(model, x_adv, lab)[:, None]
            for i in range(batch.x.shape[0]):
                if expl is None:
                    lo, hi = _range(att.attack, batch.x[i], x_adv[i])
                    a, b = _to_uint8(batch.x[i], lo, hi), _to_uint8(x_adv[i], lo, hi)
                else:
                    a = _to_uint8(shown_clean[i], float(shown_clean[i].min()), float(shown_clean[i].max()))
                    b = _to_uint8(shown_adv[i], float(shown_adv[i].min()), float(shown_adv[i].max()))
                found.append({"attack": att.name, "budget": att.attack.budget, "sample": offset + i,
                              "clean": a, "adv": b})
        offset += batch.x.shape[0]
        if len(found) >= pairs * len(named):
            break
    # one attack after the other in turn, in data order, until `pairs` are collected
    by_attack = {n: [f for f in found if f["attack"] == n] for n, _ in named}
    chosen: list[dict[str, Any]] = []
    for k in range(max((len(v) for v in by_attack.values()), default=0)):
        chosen += [v[k] for v in by_attack.values() if k < len(v)]
    if len(chosen) < pairs:
        raise ValueError(f"the data gave {len(chosen)} attacked samples, fewer than `pairs` = {pairs}")
    chosen = chosen[:pairs]
    rng = random.Random(seed)
    rng.shuffle(chosen)
    rows, images = [], {}
    width = max(3, len(str(pairs)))
    for j, c in enumerate(chosen, start=1):
        pid = f"pair_{j:0{width}d}"
        side = rng.choice(SIDES)
        left, right = (c["adv"], c["clean"]) if side == "left" else (c["clean"], c["adv"])
        images[pid] = {"left": _png(left), "right": _png(right)}
        rows.append({"pair_id": pid, "attack": c["attack"], "budget": c["budget"], "sample": c["sample"],
                     "adversarial": side})
    meta = {"images": images, "show": show, "seed": seed, "pairs": pairs,
            "explanation": None if expl is None else expl.config(),
            "attacks": [key(n, a.budget) for n, a in named]}
    return StudyResult("reader_study", rows, meta)


# --- export ---------------------------------------------------------------------------------------------------------
def export_reader_study(study: StudyResult | Mapping[str, Any] | str | Path, folder: str | Path,
                        key_folder: str | Path | None = None) -> tuple[Path, Path]:
    """Write the readers' folder (PNGs + ``answers.csv``) and, separately, the experimenter's ``key.csv``.

    Args:
        study: the :func:`reader_study` result, its JSON (path or loaded mapping, as the CLI writes it).
        folder: the readers' folder (created): ``<pair_id>_left.png``, ``<pair_id>_right.png``,
            ``answers.csv`` with columns ``pair_id, left, right, answer`` (``answer`` empty: fill in ``left``
            or ``right``, the side the reader thinks is altered).
        key_folder: where ``key.csv`` goes (created); default ``<folder>_key`` beside ``folder``. Keep it away
            from the readers.

    Returns:
        ``(answers.csv path, key.csv path)``.
    """
    rows, meta = _study_parts(study)
    images = meta.get("images")
    if not isinstance(images, Mapping):
        raise ValueError("`study` has no images (meta['images']): pass a reader_study result")
    out = Path(folder)
    kdir = Path(key_folder) if key_folder is not None else out.with_name(out.name + "_key")
    if kdir.resolve() == out.resolve():
        raise ValueError("`key_folder` must differ from `folder`: the readers must not see the key")
    out.mkdir(parents=True, exist_ok=True)
    kdir.mkdir(parents=True, exist_ok=True)
    answers = out / "answers.csv"
    from ..safe_io import open_output, write_bytes

    with open_output(answers, "w", newline="") as f:  # every file never through a link (issue 28)
        w = csv.writer(f)
        w.writerow(["pair_id", "left", "right", "answer"])
        for r in rows:
            pid = str(r["pair_id"])
            for side in SIDES:
                write_bytes(out / f"{pid}_{side}.png", base64.b64decode(images[pid][side]))
            w.writerow([pid, f"{pid}_left.png", f"{pid}_right.png", ""])
    key_path = kdir / "key.csv"
    with open_output(key_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pair_id", "adversarial", "attack", "budget", "sample"])
        for r in rows:
            w.writerow([r["pair_id"], r["adversarial"], r.get("attack", ""), r.get("budget", ""), r.get("sample", "")])
    return answers, key_path


def _study_parts(study: Any) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
    if isinstance(study, StudyResult):
        return list(study.rows), study.meta
    if isinstance(study, str | Path):
        import json

        study = json.loads(Path(study).read_text())
    if isinstance(study, Mapping) and "rows" in study:
        return list(study["rows"]), study.get("meta") or {}
    raise TypeError(f"`study` must be a reader_study StudyResult, its JSON mapping or path; got {type(study).__name__}")


# --- scoring --------------------------------------------------------------------------------------------------------
def _read_csv(source: Any, what: str) -> list[dict[str, str]]:
    if isinstance(source, str | Path):
        p = Path(source)
        if not p.is_file():
            raise FileNotFoundError(f"`{what}`: no such file {str(p)!r}")
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise ValueError(f"`{what}` {str(p)!r} is empty (expected a header row)")
            return [{str(k).strip(): (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    if isinstance(source, Iterable) and not isinstance(source, Mapping | str | bytes):
        rows = list(source)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError(f"`{what}` must be a CSV path or a list of row mappings")
        return [{str(k): str(v if v is not None else "").strip() for k, v in r.items()} for r in rows]
    raise TypeError(f"`{what}` must be a CSV path or a list of row mappings, got {type(source).__name__}")


def _key_map(key_src: Any) -> tuple[dict[str, str], dict[str, str]]:
    """``({pair_id: side}, {pair_id: attack})`` from key.csv, a reader_study result or a mapping."""
    if isinstance(key_src, StudyResult):
        rows: Sequence[Mapping[str, Any]] = list(key_src.rows)
    elif isinstance(key_src, Mapping):
        if "rows" in key_src:
            rows = list(key_src["rows"])
        else:
            rows = [{"pair_id": k, "adversarial": v} for k, v in key_src.items()]
    else:
        rows = _read_csv(key_src, "key")
    sides, attacks = {}, {}
    for i, r in enumerate(rows):
        pid, side = str(r.get("pair_id", "")).strip(), str(r.get("adversarial", "")).strip().lower()
        if not pid or side not in SIDES:
            raise ValueError(f"`key` row {i + 1} must have a pair_id and adversarial 'left' or 'right'; got {dict(r)}")
        if pid in sides:
            raise ValueError(f"`key` lists pair {pid!r} twice")
        sides[pid] = side
        if r.get("attack"):
            attacks[pid] = str(r["attack"])
    if not sides:
        raise ValueError("`key` is empty")
    return sides, attacks


def _answer(value: str) -> str | None:
    v = value.strip().lower()
    return {"left": "left", "l": "left", "right": "right", "r": "right"}.get(v)


def _binomial(correct: int, n: int) -> dict[str, float]:
    """Exact one-sided binomial p values against 1/2 and the Clopper–Pearson 95% CI of the share correct."""
    from scipy.stats import binomtest

    t_hi = binomtest(correct, n, 0.5, alternative="greater")
    t_lo = binomtest(correct, n, 0.5, alternative="less")
    ci = binomtest(correct, n, 0.5).proportion_ci(confidence_level=0.95, method="exact")
    return {"p_value": float(t_hi.pvalue), "p_value_below_chance": float(t_lo.pvalue),
            "ci_low": float(ci.low), "ci_high": float(ci.high)}


def score_reader_study(answers: Any, key: Any) -> dict[str, Any]:
    """Score a filled 2AFC answer sheet against the key.

    Args:
        answers: the filled ``answers.csv`` (path) or a list of ``{"pair_id": ..., "answer": ...}`` rows; the
            answer is ``left``/``right`` (also ``l``/``r``, any case): the side the reader picked as altered.
            Every pair of the key must be answered exactly once; unknown pairs and blank or other answers are
            refused (``ValueError`` naming the pair).
        key: ``key.csv`` (path), the :func:`reader_study` result (or its JSON mapping), or ``{pair_id: side}``.

    Returns:
        ``{"correct", "n", "accuracy", "p_value"`` (exact one-sided binomial test, H1: correct more often
        than chance 1/2), ``"p_value_below_chance"`` (H1: less often), ``"ci_low", "ci_high"`` (exact
        Clopper–Pearson 95% CI of the share correct), ``"by_attack"`` (the same per attack, where the key
        names attacks)``}``. Example: 15 of 20 correct gives p = 0.0207.
    """
    sides, attacks = _key_map(key)
    rows = _read_csv(answers, "answers")
    if rows and ("pair_id" not in rows[0] or "answer" not in rows[0]):
        raise ValueError(f"`answers` needs the columns pair_id and answer; got {sorted(rows[0])}")
    given: dict[str, str] = {}
    for i, r in enumerate(rows):
        pid = r.get("pair_id", "")
        if pid not in sides:
            raise ValueError(f"`answers` row {i + 1} names pair {pid!r}, which is not in the key")
        if pid in given:
            raise ValueError(f"`answers` answers pair {pid!r} twice")
        a = _answer(r.get("answer", ""))
        if a is None:
            raise ValueError(f"`answers` pair {pid!r}: the answer must be 'left' or 'right', got {r.get('answer', '')!r}")
        given[pid] = a
    missing = [p for p in sides if p not in given]
    if missing:
        raise ValueError(f"`answers` leaves {len(missing)} pair(s) unanswered: {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}")
    hits = {p: given[p] == sides[p] for p in sides}

    def summary(ids: Sequence[str]) -> dict[str, Any]:
        c, n = sum(hits[p] for p in ids), len(ids)
        return {"correct": c, "n": n, "accuracy": c / n, **_binomial(c, n)}

    out = summary(list(sides))
    groups: dict[str, list[str]] = {}
    for p, a in attacks.items():
        groups.setdefault(a, []).append(p)
    out["by_attack"] = {a: summary(ids) for a, ids in groups.items()}
    return out


# --- report section -------------------------------------------------------------------------------------------------
def _draw_reader_study(study: StudyLike, class_names: Sequence[str] | None) -> Section:
    meta = study.meta if isinstance(study.meta, Mapping) else {}
    shown = "explanation maps" if meta.get("show") == "map" else "images"
    intro = (f"{len(study.rows)} pairs of clean and adversarial {shown} for a two-alternative forced-choice "
             "reading (Zhang et al.), order randomised with seed "
             f"{escape(meta.get('seed'))}. Write the readers' folder with medadv.studies.reader.export_reader_study "
             "and score the filled answer sheet with score_reader_study (exact binomial test against chance). "
             "The table below is the key: do not show it to the readers.")
    return Section("study-reader", "Reader study (2AFC)", intro,
                   [raw_table(study.rows, "pairs and key (adversarial side)")])


# --- config entry ---------------------------------------------------------------------------------------------------
@register_study("reader_study", draw=_draw_reader_study, spatial_dims=(2,), check_options={"pairs": 2})
class ReaderStudySpec(StudySpec):
    """A 2AFC reader study (Zhang et al.): ``pairs`` randomised (clean, adversarial) pairs of images (``show:
    image``) or of one explanation's maps (``show: map``, ``explanation:``); ``attack`` picks one attack of the
    config (default: all, in turn). The PNGs are in the study JSON; write the readers' folder with
    :func:`medadv.studies.reader.export_reader_study`."""

    study: Literal["reader_study"]
    pairs: Annotated[int, Strict(), Field(ge=1)] = 20
    seed: Annotated[int, Strict()] = 0
    show: Literal["image", "map"] = "image"
    explanation: str | dict[str, Any] = "gradient"
    label: Annotated[int, Strict(), Field(ge=0)] | None = None
    attack: str | None = Field(None, min_length=1)

    def run(self, models: dict[str, nn.Module], task: Task, data: Any, attacks: AttackSpec | None,
            target_fn: TargetFn | None) -> StudyResult:
        return reader_study(one_model(models, self), task, data, attacks if attacks is not None else {}, pairs=self.pairs,
                            seed=self.seed, show=self.show, explanation=self.explanation, label=self.label,
                            attack=self.attack, target_fn=target_fn)
