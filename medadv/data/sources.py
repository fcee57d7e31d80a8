"""Cases read from files through MONAI: image lists and globs, Decathlon datalists, CSVs of labels.

A config's ``data`` section names the cases in one of three ways (paths are relative to the config's
folder; image paths inside a datalist or a CSV are relative to that file's folder)::

    data: {source: files, images: "images/*.nii.gz", labels: "labels/*.nii.gz"}   # NIfTI, DICOM series
                                                                                   # folders, PNG/JPEG, .npy;
                                                                                   # paired by file name
    data: {source: datalist, path: dataset.json, key: validation}                  # MONAI / Decathlon JSON
    data: {source: csv, path: labels.csv, image_column: image,                     # multi-label: 0/1 columns
           label_columns: [frontal, occipital]}

and declares the MONAI transforms that prepare them, by class name with their arguments::

    transforms:
      - {name: LoadImaged, keys: [image, label]}
      - {name: EnsureChannelFirstd, keys: [image, label]}
      - {name: Orientationd, keys: [image, label], axcodes: RAS}
      - {name: Spacingd, keys: [image, label], pixdim: [2, 2, 2], mode: [bilinear, nearest]}
      - {name: ScaleIntensityRanged, keys: [image], a_min: 0, a_max: 255, b_min: 0, b_max: 1, clip: true}

Conveniences, all documented here and nowhere implicit beyond them:

* no ``LoadImaged`` in the list: ``LoadImaged`` + ``EnsureChannelFirstd`` on the file keys go first;
* a transform without ``keys`` gets ``[image]`` for intensity transforms and every file key (``image`` and,
  for label maps, ``label``) otherwise; a transform with a ``mode`` argument that then applies to the label
  map gets ``mode: [<its default>, nearest]``, so label maps are never interpolated into fractional labels.

PNG, JPEG and BMP files reach the model as PIL and torchvision give them (``ToTensor``): an image of ``H`` rows
and ``W`` columns is a ``(C, H, W)`` array, the orientation 2-D models are trained in. MONAI's own PIL reader
returns the transpose ``(C, W, H)`` (its first spatial axis is x: ``reverse_indexing=True``), so every
``LoadImaged`` here, the implicit one and one the config names without ``reader`` or ``reverse_indexing``,
reads these formats with ``reverse_indexing=False``; the images are marked height-first in their metadata
(:func:`width_first`), which the adversarial examples saved from them follow. A model trained on MONAI's
layout says ``{name: LoadImaged, keys: [image], reverse_indexing: true}``. NIfTI, DICOM and NumPy files are
read as MONAI reads them (world-oriented through their affine; NumPy as stored).

Cases stream through a MONAI ``Dataset`` (no cache) and ``DataLoader`` in order: only one batch is in memory.
Each batch is a dict: ``image`` a float :class:`monai.data.MetaTensor` ``(N, C, *spatial)`` whose ``affine``
(after every transform) gives each case's voxel spacing, ``label`` ``(N, *spatial)`` int64 label maps
(segmentation), ``(N, L)`` float 0/1 (multi-label) or ``(N,)`` int64 (multi-class), and ``case_id`` the
case names (the image file name, or the datalist entry's ``id`` / the CSV's ``id_column``), ``path_image`` the
image files and, for label maps, ``path_label`` the label files (:data:`PATH_KEYS`; relative to the config's
folder when inside it): :func:`medadv.evaluation.evaluate` records both in every row.

**Pairing** (issue 28). A ``files`` source pairs each image with its label by a declared rule, never by sorted
order (one missing label and one extra would shift every later pair): by default the same file name, suffixes
aside (``images/case3.nii.gz`` with ``labels/case3.nii.gz`` or ``labels/case3.nii``); ``pair: {image: T,
label: T}`` gives templates with one ``{id}`` matched against the end of each path, suffixes removed
(``{image: "{id}_0000", label: "{id}"}``, ``{image: "{id}/imaging", label: "{id}/segmentation"}``). Images
without a label, labels without an image, files the rule does not match and two files of one id are refused,
naming them. A datalist pairs by its entries, a CSV by its rows.

**Geometry** (issue 28). Before any case is read, each case's headers are checked
(:func:`check_geometry`, :mod:`medadv.data.geometry`): a label map has its image's shape and affine (spacing,
orientation and origin, within :data:`~medadv.data.geometry.GEOMETRY_TOLERANCE` of a voxel), it holds integers,
a DICOM series is complete (equally spaced slices), nothing is complex-valued; after the transforms the same
holds for the tensors (:class:`ToSample`). Each refusal is one line naming the case and its files.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import glob
import inspect
import json
import logging
import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..params import closest
from ..schema_base import (  # below medadv.data (medadv.config_schema re-exports them)
    ConfigError,
    CsvData,
    DatalistData,
    FilesData,
    TransformEntry,
    monai_transforms,
    transform_name_error,
)
from .save import strip_suffix

__all__ = ["DataError", "monai_transforms", "transform_name_error", "list_cases",
           "build_transforms", "check_source", "make_loader", "data_identity", "case_spacing", "width_first",
           "HEIGHT_FIRST", "PATH_KEYS", "check_geometry"]

FileSource = FilesData | DatalistData | CsvData

#: the kinds of labels a file source gives (a task kind's ``label_source``): label images, 0/1 label columns, one
#: class index per case, numbers per case
LABEL_SOURCES = ("map", "vector", "index", "values")

#: the keys of a case (and of a batch) recording the files it came from, as the config names them (relative to
#: the config's folder when inside it): the image, and the label map file; each with its column in the result
#: rows. (Not ``image_...``: MONAI's dictionary transforms take keys starting with ``<key>_`` for its metadata.)
PATH_KEYS = {"path_image": "image_path", "path_label": "label_path"}

#: image metadata key set on the 2-D images medadv's loader read height-first, ``(C, H, W)`` (:func:`width_first`)
HEIGHT_FIRST = "medadv_height_first"


class DataError(ValueError):
    """A case that cannot be read or does not fit the task: one line naming the case."""


def _short(e: BaseException) -> str:
    # MONAI wraps a failing transform in "applying transform ..." RuntimeErrors: report the innermost cause
    while e.__cause__ is not None:
        e = e.__cause__
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


def _hint(name: str, options: Sequence[str]) -> str:
    c = closest(name, options)
    return f"; did you mean {c!r}?" if c and c != name else ""


# --- transforms by name: monai_transforms, transform_name_error (medadv.schema_base, re-exported) ---------------
@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence MONAI's notices, while a transform is built, that its optional GPU DICOM decoder
    (nvImageCodec) is absent (the CPU decoders read the same files) and that defaults will change."""
    logger = logging.getLogger("monai.data.nvimgcodec_pydicom_plugin")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Nn]v[Ii]mg[Cc]odec.*")
            # MONAI's notices of future changes of defaults (Orientationd's `labels`): not the user's concern
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


@functools.cache
def _height_first_reader() -> type:
    """MONAI's ``PILReader`` reading height-first (``reverse_indexing=False``), marking what it read
    (:data:`HEIGHT_FIRST`). Built on first use: this module does not import MONAI at import time."""
    from monai.data import PILReader

    class HeightFirstPILReader(PILReader):
        """PNG / JPEG / BMP as PIL and torchvision give them: ``(H, W)`` or ``(H, W, C)``, not MONAI's
        transpose ``(W, H)``; the metadata say so (:data:`HEIGHT_FIRST`) for whoever writes the image back."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(reverse_indexing=False, **kwargs)

        def get_data(self, img: Any) -> tuple[Any, dict]:
            data, header = super().get_data(img)
            header[HEIGHT_FIRST] = True
            return data, header

    return HeightFirstPILReader


def _read_height_first(loader: Any) -> Any:
    """``loader`` (a ``LoadImaged``) with the height-first PIL reader registered: MONAI tries the last registered
    reader first among those that take a file's suffix, so PNG/JPEG/BMP files go to it and every other format
    to MONAI's own readers, unchanged."""
    loader.register(_height_first_reader()())
    return loader


def width_first(meta: Mapping[str, Any] | None) -> bool:
    """Whether a batch's 2-D images, with this (collated) MONAI metadata, are in MONAI's layout ``(C, W, H)``
    (what ``save_example(..., width_first=...)`` undoes when it writes a PNG): images read by MONAI's
    ``LoadImage`` defaults are, those medadv's file sources read height-first (:data:`HEIGHT_FIRST`) are not,
    and a batch without MONAI metadata is not."""
    if meta is None:
        return False
    mark = meta.get(HEIGHT_FIRST) if isinstance(meta, Mapping) else None
    if mark is None:
        return True
    return not bool(torch.as_tensor(mark).all()) if isinstance(mark, Tensor | list | tuple) else not mark


def _param_default(cls: type, name: str) -> Any:
    p = inspect.signature(cls).parameters.get(name)
    d = None if p is None or p.default is inspect.Parameter.empty else p.default
    return getattr(d, "value", d)  # MONAI's string enums -> their text


def _takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls).parameters


def build_transforms(entries: Sequence[TransformEntry] | None, file_keys: Sequence[str], case_keys: Sequence[str],
                     *, where: str = "data.transforms") -> list[Any]:
    """The MONAI transforms of a config's ``transforms`` list, built and checked (names, arguments, keys).

    See the module docstring for the defaults filled in (a leading loader, ``keys``, the label's ``mode``).
    """
    from monai.transforms import EnsureChannelFirstd, LoadImaged

    from ..models.loading import check_kwargs

    table = monai_transforms()
    entries = list(entries or [])
    out: list[Any] = []
    if not any(issubclass(table[e.name], LoadImaged) for e in entries):
        with _quiet():
            out += [_read_height_first(LoadImaged(keys=list(file_keys))),
                    EnsureChannelFirstd(keys=list(file_keys))]
    for i, entry in enumerate(entries):
        cls, args, here = table[entry.name], entry.args(), f"{where}[{i}]"
        if "keys" not in args and _takes(cls, "keys"):
            intensity = ".intensity." in cls.__module__
            args["keys"] = ["image"] if intensity else list(file_keys)
            if "label" in args["keys"] and _takes(cls, "mode") and "mode" not in args:
                args["mode"] = [_param_default(cls, "mode"), "nearest"]  # never interpolate a label map
        keys = args.get("keys")
        for key in [keys] if isinstance(keys, str) else keys if isinstance(keys, list | tuple) else []:
            if key not in case_keys:
                raise ConfigError([f"`{here}.keys`: {entry.name} names the key {key!r}, which the cases do not "
                                   f"have{_hint(str(key), list(case_keys))} (they have {', '.join(case_keys)})"])
        check_kwargs(cls, args, here)
        try:
            with _quiet():
                built = cls(**args)
        except Exception as e:
            raise ConfigError([f"`{here}` ({entry.name}): {_short(e)}"]) from None
        if issubclass(cls, LoadImaged) and "reader" not in args and "reverse_indexing" not in args:
            built = _read_height_first(built)  # as the implicit loader: PNG/JPEG height-first
        out.append(built)
    return out


# --- cases ---------------------------------------------------------------------------------------------------------
def _relative(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _paths(spec: str | Sequence[str], base: Path, where: str) -> list[Path]:
    """Files (or DICOM series folders) named by a path, a glob, or a list of them, in sorted glob order."""
    out: list[Path] = []
    for item in [spec] if isinstance(spec, str) else spec:
        path = _relative(item, base)
        if glob.has_magic(item):
            matches = sorted(Path(m) for m in glob.glob(str(path), recursive=True))
            if not matches:
                raise FileNotFoundError(f"`{where}`: no file matches {item!r} (in {path.parent.resolve()})")
            out += matches
        elif not path.exists():
            rel = f" ({item!r} is relative to {base.resolve()})" if not Path(item).is_absolute() else ""
            raise FileNotFoundError(f"`{where}`: file not found: {path.resolve()}{rel}")
        else:
            out.append(path)
    return out


def _case_ids(paths: Sequence[Path]) -> list[str]:
    """File names (the folder name of a DICOM series); unique paths relative to their common folder when
    two cases share a name."""
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    root = Path(os.path.commonpath([str(p.resolve()) for p in paths]))
    return [str(p.resolve().relative_to(root)) for p in paths]


def _shown(path: Path, base: Path) -> str:
    """A case's file as the rows record it: relative to the config's folder when inside it, else absolute."""
    full = path.resolve()
    try:
        return full.relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(full)


def _template(template: str) -> re.Pattern[str]:
    """The end of a path (suffixes removed) that ``template`` matches, ``{id}`` one path component's part."""
    head, tail = template.split("{id}")
    return re.compile("(?:^|/)" + re.escape(head) + "(?P<id>[^/]+?)" + re.escape(tail) + "$")


def _pair_keys(paths: Sequence[Path], template: str, what: str, base: Path) -> dict[str, Path]:
    """``{id: path}`` of the files a pair template matches; files it does not match, or two files of one id,
    are refused naming them."""
    pattern = _template(template)
    keys: dict[str, Path] = {}
    unmatched = []
    for p in paths:
        m = pattern.search(strip_suffix(p.as_posix()))
        if m is None:
            unmatched.append(p)
        elif m["id"] in keys:
            folder = f"'{{id}}/{strip_suffix(p.name)}'"
            raise ConfigError([f"`data.pair`: the {what} files {_shown(keys[m['id']], base)} and {_shown(p, base)} "
                               f"have the same id {m['id']!r} under the rule {template!r}; make the rule tell them "
                               f"apart (a folder per case: `pair: {{{what}: {folder}}}`) or list the cases in a "
                               "datalist"])
        else:
            keys[m["id"]] = p
    if unmatched:
        raise ConfigError([f"`data.pair.{what}`: {len(unmatched)} {what} file(s) do not match the rule "
                           f"{template!r}, e.g. {_shown(unmatched[0], base)}"])
    return keys


def _suggest_rule(images: Sequence[Path], labels: Sequence[Path]) -> str | None:
    """A ``pair`` rule that would pair these unpaired files one to one, when their names differ by one common
    ending (``case1`` / ``case1_label``: ``{label: '{id}_label'}``); None when there is none."""
    stems = [sorted(strip_suffix(p.name) for p in side) for side in (images, labels)]
    if not stems[0] or len(stems[0]) != len(stems[1]):
        return None
    for longer, shorter, key in ((1, 0, "label"), (0, 1, "image")):
        tails = {a[len(b):] for a, b in zip(stems[longer], stems[shorter], strict=True) if a.startswith(b)}
        if len(tails) == 1 and all(a.startswith(b) for a, b in zip(stems[longer], stems[shorter], strict=True)):
            tail = tails.pop()
            if tail:
                return f"`pair: {{{key}: '{{id}}{tail}'}}` would pair them"
    return None


def _files_cases(conf: FilesData, base: Path) -> list[dict[str, Any]]:
    images = _paths(conf.images, base, "data.images")
    ids = _case_ids(images)
    if conf.labels is None:
        return [{"image": str(p), "case_id": c, "path_image": _shown(p, base)} for p, c in zip(images, ids, strict=True)]
    labels = _paths(conf.labels, base, "data.labels")
    # pairing is declared, never positional: a missing label and an extra one would shift every later pair
    rule = conf.pair
    by_image = _pair_keys(images, rule.image, "image", base)
    by_label = _pair_keys(labels, rule.label, "label", base)
    lonely = [p for k, p in by_image.items() if k not in by_label]
    extra = [p for k, p in by_label.items() if k not in by_image]
    if lonely or extra:
        said = "same file name, suffixes aside" if (rule.image, rule.label) == ("{id}", "{id}") else \
            f"image {rule.image!r}, label {rule.label!r}"
        parts = ([f"{len(lonely)} image(s) without a label ({', '.join(_shown(p, base) for p in lonely[:3])}"
                  + (", ..." if len(lonely) > 3 else "") + ")"] if lonely else []) + \
                ([f"{len(extra)} label(s) without an image ({', '.join(_shown(p, base) for p in extra[:3])}"
                  + (", ..." if len(extra) > 3 else "") + ")"] if extra else [])
        rule_hint = _suggest_rule(lonely, extra) or "`pair: {image: '{id}_0000', label: '{id}'}`"
        raise ConfigError([f"`data.labels`: {' and '.join(parts)} under the pairing rule `data.pair` ({said}); "
                           f"give every image its label, or declare the rule: {rule_hint}, or list the pairs in a "
                           "datalist"])
    keys = {p: k for k, p in by_image.items()}
    return [{"image": str(p), "label": str(by_label[keys[p]]), "case_id": c, "path_image": _shown(p, base),
             "path_label": _shown(by_label[keys[p]], base)} for p, c in zip(images, ids, strict=True)]


def _datalist_cases(conf: DatalistData, base: Path) -> list[dict[str, Any]]:
    from monai.data import load_decathlon_datalist

    path = _relative(conf.path, base)
    if not path.is_file():
        raise FileNotFoundError(f"`data.path`: datalist not found: {path.resolve()}")
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError([f"`data.path`: {path.name} is not a readable JSON datalist ({_short(e)})"]) from None
    if not isinstance(content, dict) or not isinstance(content.get(conf.key), list) or not content[conf.key]:
        lists = [k for k, v in content.items() if isinstance(v, list)] if isinstance(content, dict) else []
        raise ConfigError([f"`data.key`: {path.name} has no non-empty list {conf.key!r}{_hint(conf.key, lists)} "
                           f"(its lists: {', '.join(lists) or 'none'})"])
    entries = content[conf.key]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "image" not in entry or "label" not in entry:
            raise ConfigError([f"`data.path`: entry {i} of {conf.key!r} in {path.name} needs `image` and `label` "
                               f"(attacks and metrics need labels); got {str(entry)[:80]}"])
    seg = all(isinstance(entry["label"], str) for entry in entries)
    data_dir = _relative(conf.base_dir, base) if conf.base_dir else path.parent
    cases = load_decathlon_datalist(str(path), is_segmentation=seg, data_list_key=conf.key, base_dir=str(data_dir))
    missing = [p for c in cases for p in ([c["image"]] + ([c["label"]] if seg else [])) if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"`data.path`: {len(missing)} file(s) listed in {path.name} not found, e.g. "
                                f"{Path(missing[0]).resolve()} (paths are relative to {data_dir.resolve()})")
    ids = _case_ids([Path(c["image"]) for c in cases])
    for c, default in zip(cases, ids, strict=True):
        c["case_id"] = str(c["id"]) if isinstance(c.get("id"), str | int) else default
        c["path_image"] = _shown(Path(c["image"]), base)
        if seg:
            c["path_label"] = _shown(Path(c["label"]), base)
    return cases


def _number(text: str | None, where: str) -> float:
    if text is None:  # csv.DictReader's value for a cell a short row lacks
        raise ConfigError([f"{where} is missing (the row has fewer cells than the header)"])
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ConfigError([f"{where} is {text!r}, not a number"]) from None


def _csv_cases(conf: CsvData, base: Path, label_source: str | None = None) -> list[dict[str, Any]]:
    path = _relative(conf.path, base)
    if not path.is_file():
        raise FileNotFoundError(f"`data.path`: CSV file not found: {path.resolve()}")
    try:
        # utf-8-sig: a byte-order mark (as spreadsheet programs write) is not part of the first column's name
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), list(reader.fieldnames or [])
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError([f"`data.path`: {path.name} is not a UTF-8 CSV file ({_short(e)})"]) from None
    if not rows:
        raise ConfigError([f"`data.path`: {path.name} has no rows"])
    named = [("image_column", conf.image_column), ("id_column", conf.id_column), ("label_column", conf.label_column)]
    named += [("label_columns", c) for c in conf.label_columns or []]
    for field, col in named:
        if col is not None and col not in columns:
            raise ConfigError([f"`data.{field}`: {path.name} has no column {col!r}{_hint(col, columns)} "
                               f"(its columns: {', '.join(columns)})"])
    labels = conf.label_columns
    if labels is None and conf.label_column is None:
        labels = [c for c in columns if c not in (conf.image_column, conf.id_column)]
        if not labels:
            raise ConfigError([f"`data.path`: {path.name} has no label columns besides {conf.image_column!r}"])
    empty = next((i for i, r in enumerate(rows) if not r.get(conf.image_column)), None)
    if empty is not None:
        raise ConfigError([f"`data.path`: {path.name} row {empty + 2} has no image in column {conf.image_column!r}"])
    images = [_relative(r[conf.image_column], path.parent) for r in rows]
    missing = [p for p in images if not p.exists()]
    if missing:
        raise FileNotFoundError(f"`data.path`: {len(missing)} image(s) listed in {path.name} not found, e.g. "
                                f"{missing[0].resolve()} (paths are relative to {path.parent.resolve()})")
    ids = [r[conf.id_column] for r in rows] if conf.id_column else _case_ids(images)
    cases = []
    for i, (r, img, cid) in enumerate(zip(rows, images, ids, strict=True)):
        at = f"`data.path`: {path.name} row {i + 2}"
        if label_source == "values":  # numbers per case (regression): any finite real, one or several columns
            cols = labels if labels is not None else [str(conf.label_column)]
            values = [_number(r[c], f"{at} column {c!r}") for c in cols]
            bad = [c for c, v in zip(cols, values, strict=True) if not math.isfinite(v)]
            if bad:
                raise ConfigError([f"{at} column {bad[0]!r} is {r[bad[0]]!r}; target values must be finite numbers"])
            label: Any = values
        elif labels is not None:
            values = [_number(r[c], f"{at} column {c!r}") for c in labels]
            bad = [c for c, v in zip(labels, values, strict=True) if v not in (0.0, 1.0)]
            if bad:
                raise ConfigError([f"{at} column {bad[0]!r} is {r[bad[0]]!r}; multi-label columns hold 0 or 1"])
            label = values
        else:
            v = _number(r[str(conf.label_column)], f"{at} column {conf.label_column!r}")
            if v != int(v) or v < 0:
                raise ConfigError([f"{at} column {conf.label_column!r} is {r[str(conf.label_column)]!r}; a class "
                                   "index is an integer >= 0"])
            label = int(v)
        cases.append({"image": str(img), "label": label, "case_id": str(cid), "path_image": _shown(img, base)})
    return cases


def list_cases(conf: FileSource, base_dir: str | Path | None, label_source: str | None = None
               ) -> list[dict[str, Any]]:
    """The cases of a file source: ``{"image": path, "label": path or value, "case_id": name}`` each, in
    order, the first ``n``. Files are checked to exist; nothing is read but the datalist or CSV.

    ``label_source``: the task kind's (:attr:`~medadv.tasks.Task.label_source`); with ``"values"`` a CSV's label
    columns are read as real numbers (a list per case) instead of 0/1 labels or a class index."""
    base = Path(base_dir) if base_dir else Path.cwd()
    if isinstance(conf, FilesData):
        cases = _files_cases(conf, base)
    elif isinstance(conf, DatalistData):
        cases = _datalist_cases(conf, base)
    else:
        cases = _csv_cases(conf, base, label_source)
    return cases[: conf.n] if conf.n is not None else cases


def _label_kind(cases: Sequence[Mapping[str, Any]], label_source: str | None = None) -> str | None:
    label = cases[0].get("label") if cases else None
    if label is None:
        return None
    if isinstance(label, str):
        return "map"
    if label_source == "values":  # numbers (a datalist's or a CSV's): read as values
        return "values"
    return "vector" if isinstance(label, list) else "index"


_LABEL_TEXT = {"map": "label maps (image files)", "vector": "0/1 label columns", "index": "one class index per case",
               "values": "numbers per case"}


def _check_task(cases: Sequence[Mapping[str, Any]], label_source: str | None) -> str:
    """The kind of labels the cases have, checked against the task's."""
    kind = _label_kind(cases, label_source)
    if kind is None:
        raise ConfigError(["`data.labels`: the cases have no labels; attacks and metrics need them (give label "
                           "maps as `labels:`, a datalist with `label`, or a CSV with label columns)"])
    if label_source is not None and label_source != kind:
        raise ConfigError([f"`data`: the task reads {_LABEL_TEXT.get(label_source, label_source)} but the data's labels are "
                           f"{_LABEL_TEXT[kind]}"])
    return kind


# --- from a case dict to a sample ----------------------------------------------------------------------------------
def _files(d: Mapping[str, Any]) -> str:
    """The files of a case, for an error line: ``image.nii.gz`` or ``image.nii.gz with label labels/x.nii.gz``."""
    image = d.get("path_image") or (d["image"] if isinstance(d.get("image"), str) else None)
    label = d.get("path_label")
    return f" ({image}" + (f" with label {label}" if label else "") + ")" if image else ""


_SAME_TRANSFORMS = ("give image and label the same spatial transforms (a label stored in another axis order: "
                    "Orientationd on both)")


class ToSample:
    """The last transform: ``image`` as a float32 MetaTensor, ``label`` in the task's form, ``case_id`` kept.

    Segmentation labels ``(1, *spatial)`` become an int64 ``(*spatial)`` label map (a plain tensor) of the
    image's spatial shape; multi-label labels a float ``(L,)`` 0/1 vector; multi-class an int64 scalar.
    What the transforms made of the case is checked here (a :class:`DataError` naming the case and its files):
    a complex image (its imaginary part would be lost), a label map whose shape or affine (MONAI's, after every
    transform) is not the image's (:func:`medadv.data.geometry.affine_mismatch`), or whose values are not
    integers (never rounded: an interpolated label map is refused).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, d: Mapping[str, Any]) -> dict[str, Any]:
        from monai.data import MetaTensor

        from .geometry import affine_mismatch, non_integer_values

        out = dict(d)
        cid = out.get("case_id")
        img = out["image"]
        if not isinstance(img, Tensor):
            img = torch.as_tensor(img)
        if img.is_complex():
            raise DataError(f"case {cid}{_files(d)}: the image is complex ({img.dtype}); medadv reads real values "
                            "and would drop the imaginary part: store the magnitude, or the real and imaginary "
                            "parts as two channels")
        if not isinstance(img, MetaTensor):  # an array transform dropped the geometry: unit spacing
            img = MetaTensor(img)
        out["image"] = img.float()
        lab = out["label"]
        if self.kind == "map":
            t = lab.as_tensor() if isinstance(lab, MetaTensor) else torch.as_tensor(lab)
            if t.ndim == img.ndim and t.shape[0] == 1:
                t = t[0]
            if tuple(t.shape) != tuple(img.shape[1:]):
                raise DataError(f"case {cid}{_files(d)}: label map {tuple(t.shape)} does not match the image "
                                f"{tuple(img.shape)} (channels first): {_SAME_TRANSFORMS}")
            if isinstance(lab, MetaTensor) and (why := affine_mismatch(img.affine, lab.affine)):
                raise DataError(f"case {cid}{_files(d)}: after the transforms the label map is on another grid "
                                f"than the image: {why}; {_SAME_TRANSFORMS}")
            if t.is_floating_point() or t.is_complex():
                why = non_integer_values(t)
                if why:
                    raise DataError(f"case {cid}{_files(d)}: the label map holds {why}; label maps hold integer "
                                    "class indices (resample them with mode 'nearest')")
            out["label"] = t.long()
        elif self.kind in ("vector", "values"):
            out["label"] = torch.as_tensor(lab, dtype=torch.float32)
        else:
            out["label"] = torch.as_tensor(lab, dtype=torch.int64)
        return out


def _collate(batch: Sequence[Mapping[str, Any]]) -> Any:
    from monai.data import list_data_collate

    shapes = [tuple(b["image"].shape) for b in batch]
    if len(set(shapes)) > 1:
        sizes = ", ".join(f"{b.get('case_id')} {s}" for b, s in zip(batch, shapes, strict=True))
        raise DataError(f"the cases of one batch differ in size ({sizes}): set `batch_size: 1`, or give them one "
                        "size with a transform (Resized, ResizeWithPadOrCropd, SpatialPadd)")
    return list_data_collate(list(batch))


@functools.cache
def _dataset_class() -> type:
    from monai.data import Dataset
    from monai.transforms import Randomizable

    class CaseDataset(Dataset):
        """A MONAI Dataset (no cache: each case is read when its batch is) whose errors name the case.

        Random transforms are re-seeded per case from ``(seed, index)``: a case gets the same random draws
        whatever the batch order, the number of DataLoader workers or the rank that reads it in a sharded
        run, so a distributed or resumed run sees exactly the data of a single-process run."""

        seed = 0

        def _transform(self, index: int) -> Any:
            if isinstance(self.transform, Randomizable):
                self.transform.set_random_state(seed=(self.seed * 1_000_003 + index) % (2**32))
            try:
                return super()._transform(index)
            except Exception as e:
                inner: BaseException | None = e
                while inner is not None and not isinstance(inner, DataError):
                    inner = inner.__cause__  # MONAI's Compose wraps what a transform raises in a RuntimeError
                if inner is not None:
                    raise inner from None
                case = self.data[index]
                raise DataError(f"case {case.get('case_id')} ({case.get('image')}): {_short(e)}") from e

    return CaseDataset


def _file_keys(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    return ["image"] + (["label"] if cases and isinstance(cases[0].get("label"), str) else [])


def _case_keys(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys a transform may name: the case's, but the recorded paths (:data:`PATH_KEYS`)."""
    return sorted(k for k in cases[0] if k not in PATH_KEYS)


def check_geometry(cases: Sequence[Mapping[str, Any]]) -> None:
    """Each case's files from their headers (:mod:`medadv.data.geometry`): readable, a DICOM series complete,
    no complex image, and a label map on its image's grid (shape, spacing, orientation, origin) holding integers.
    A :class:`DataError` names the case and the files; nothing but headers is read (and float label maps)."""
    from .geometry import GeometryError, check_label_values, geometry_mismatch, read_geometry

    for c in cases:
        at = f"case {c.get('case_id')}"
        try:
            image = read_geometry(c["image"])
            label = read_geometry(c["label"]) if isinstance(c.get("label"), str) else None
        except GeometryError as e:
            raise DataError(f"{at} ({e.path}): {e.reason}") from None
        if image is not None and image.dtype is not None and image.dtype.kind == "c":
            raise DataError(f"{at}{_files(c)}: the image is complex ({image.dtype}); medadv reads real values and "
                            "would drop the imaginary part: store the magnitude, or the real and imaginary parts "
                            "as two channels")
        if image is None or label is None:
            continue
        why = geometry_mismatch(image, label)
        if why:
            raise DataError(f"{at}{_files(c)}: the label is not on the image's grid: {why}; a label map shares its "
                            "image's shape and affine (resample it onto the image, e.g. with MONAI "
                            "ResampleToMatch, and save it with the image's affine)")
        why = check_label_values(c["label"], label)
        if why:
            raise DataError(f"{at}{_files(c)}: the label map holds {why}; label maps hold integer class indices")


def check_source(conf: FileSource, base_dir: str | Path | None, label_source: str | None = None) -> list[Any]:
    """Everything that can be checked from the config and the files' headers: the files exist and pair, the
    labels fit the task, each case's geometry (:func:`check_geometry`), the transforms' names, arguments and
    keys. Returns the built transforms."""
    cases = list_cases(conf, base_dir, label_source)
    kind = _check_task(cases, label_source)
    transforms = build_transforms(conf.transforms, _file_keys(cases), _case_keys(cases))
    check_geometry(cases)
    return transforms + [ToSample(kind)]


class _Batches:
    """The DataLoader over the cases, re-iterable, with ``len`` (batches) and ``cases``."""

    def __init__(self, loader: Any, cases: list[dict[str, Any]]) -> None:
        self.loader, self.cases = loader, cases

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


def make_loader(conf: FileSource, base_dir: str | Path | None, *, batch_size: int = 1, label_source: str | None = None,
                seed: int = 0) -> Any:
    """A MONAI ``DataLoader`` streaming the cases in order as dict batches (module docstring).

    Random transforms draw per case from ``(seed, case index)``: the same cases every run, in any batch order,
    with any number of workers or processes (a resumed or sharded run sees the same data).
    """
    from monai.data import DataLoader
    from monai.transforms import Compose

    cases = list_cases(conf, base_dir, label_source)
    kind = _check_task(cases, label_source)
    transforms = build_transforms(conf.transforms, _file_keys(cases), _case_keys(cases))
    check_geometry(cases)  # before any case is read: refused before any work, as `medadv validate` does
    pipeline = Compose([*transforms, ToSample(kind)])
    dataset = _dataset_class()(data=cases, transform=pipeline)
    dataset.seed = seed  # random transforms draw per case from (seed, case index): see CaseDataset
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=conf.num_workers,
                        collate_fn=_collate)
    return _Batches(loader, cases)


def _files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def data_identity(conf: FileSource, base_dir: str | Path | None) -> list[list[Any]]:
    """``[path, size, mtime_ns]`` of every file the cases come from (a DICOM folder: each file in it), and of
    the datalist or CSV: what a resumed run compares to tell the same data from changed files."""
    base = Path(base_dir) if base_dir else Path.cwd()
    files: list[Path] = []
    if isinstance(conf, DatalistData | CsvData):
        files.append(_relative(conf.path, base))
    # the labels' values do not matter here: "values" reads any number, so no task's label check can refuse them
    for c in list_cases(conf, base_dir, "values"):
        for key in ("image", "label"):
            if isinstance(c.get(key), str):
                files += _files_of(Path(c[key]))
    out = []
    for p in files:
        st = p.stat()
        out.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return out


def case_spacing(image: Any, index: int = 0) -> tuple[float, ...]:
    """The voxel spacing (mm per spatial axis) of case ``index`` of a batch's ``image`` MetaTensor: the
    column norms of its affine's spatial block (unit spacing when it has no affine)."""
    d = image.ndim - 2
    affine = getattr(image, "affine", None)
    if affine is None:
        return (1.0,) * d
    a = torch.as_tensor(affine, dtype=torch.float64)
    a = a[index] if a.ndim == 3 else a
    return tuple(float(v) for v in a[:d, :d].norm(dim=0))

