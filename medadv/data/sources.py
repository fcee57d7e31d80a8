"""Cases read from files through MONAI: image lists and globs, Decathlon datalists, CSVs of labels.

A config's ``data`` section names the cases in one of three ways (paths are relative to the config's
folder; image paths inside a datalist or a CSV are relative to that file's folder)::

    data: {source: files, images: "images/*.nii.gz", labels: "labels/*.nii.gz"}   # NIfTI, DICOM series
                                                                                   # folders, PNG/JPEG, .npy
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
case names (the image file name, or the datalist entry's ``id`` / the CSV's ``id_column``).
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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config_schema import ConfigError, CsvData, DatalistData, FilesData, TransformEntry
from ..params import closest

__all__ = ["DataError", "monai_transforms", "transform_name_error", "list_cases",
           "build_transforms", "check_source", "make_loader", "data_identity", "case_spacing", "width_first",
           "HEIGHT_FIRST"]

FileSource = FilesData | DatalistData | CsvData

#: the kinds of labels a file source gives (a task kind's ``label_source``): label images, 0/1 label columns, one
#: class index per case, numbers per case
LABEL_SOURCES = ("map", "vector", "index", "values")

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


# --- transforms by name --------------------------------------------------------------------------------------------
@functools.cache
def monai_transforms() -> dict[str, type]:
    """Every transform class of :mod:`monai.transforms` by name."""
    import monai.transforms as T

    return {n: o for n in dir(T) if not n.startswith("_") and isinstance(o := getattr(T, n), type)
            and issubclass(o, T.Transform)}


def transform_name_error(name: str) -> str | None:
    """Why ``name`` is not a MONAI dictionary transform (``None`` when it is one)."""
    from monai.transforms import MapTransform

    table = monai_transforms()
    if name not in table:
        return (f"unknown MONAI transform {name!r}{_hint(name, list(table))} (monai.transforms lists them; "
                "dictionary transforms end in 'd')")
    if not issubclass(table[name], MapTransform):
        alt = next((n for n in (name + "d", name + "D") if n in table), None)
        use = f"name its dictionary version {alt!r}" if alt else "name a dictionary transform (a MapTransform)"
        return f"{name!r} is an array transform: {use}; the cases are dictionaries with keys image, label"
    return None


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
    import os

    root = Path(os.path.commonpath([str(p.resolve()) for p in paths]))
    return [str(p.resolve().relative_to(root)) for p in paths]


def _files_cases(conf: FilesData, base: Path) -> list[dict[str, Any]]:
    images = _paths(conf.images, base, "data.images")
    ids = _case_ids(images)
    if conf.labels is None:
        return [{"image": str(p), "case_id": c} for p, c in zip(images, ids, strict=True)]
    labels = _paths(conf.labels, base, "data.labels")
    by_name = {p.name: p for p in labels}
    if len(by_name) == len(labels) and set(by_name) == {p.name for p in images}:
        paired = [by_name[p.name] for p in images]  # same file names in two folders
    elif len(labels) == len(images):
        paired = labels  # else in sorted order
    else:
        raise ConfigError([f"`data.labels`: {len(labels)} label file(s) for {len(images)} image(s); give one label "
                           "map per image (paired by file name, else in sorted order)"])
    return [{"image": str(p), "label": str(lab), "case_id": c} for p, lab, c in zip(images, paired, ids, strict=True)]


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
    return cases


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ConfigError([f"{where} is {text!r}, not a number"]) from None


def _csv_cases(conf: CsvData, base: Path, label_source: str | None = None) -> list[dict[str, Any]]:
    path = _relative(conf.path, base)
    if not path.is_file():
        raise FileNotFoundError(f"`data.path`: CSV file not found: {path.resolve()}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), list(reader.fieldnames or [])
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
        cases.append({"image": str(img), "label": label, "case_id": str(cid)})
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
class ToSample:
    """The last transform: ``image`` as a float32 MetaTensor, ``label`` in the task's form, ``case_id`` kept.

    Segmentation labels ``(1, *spatial)`` become an int64 ``(*spatial)`` label map (a plain tensor) of the
    image's spatial shape; multi-label labels a float ``(L,)`` 0/1 vector; multi-class an int64 scalar.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, d: Mapping[str, Any]) -> dict[str, Any]:
        from monai.data import MetaTensor

        out = dict(d)
        cid = out.get("case_id")
        img = out["image"]
        if not isinstance(img, Tensor):
            img = torch.as_tensor(img)
        if not isinstance(img, MetaTensor):  # an array transform dropped the geometry: unit spacing
            img = MetaTensor(img)
        out["image"] = img.float()
        lab = out["label"]
        if self.kind == "map":
            t = lab.as_tensor() if isinstance(lab, MetaTensor) else torch.as_tensor(lab)
            if t.ndim == img.ndim and t.shape[0] == 1:
                t = t[0]
            if tuple(t.shape) != tuple(img.shape[1:]):
                raise DataError(f"case {cid}: label map {tuple(t.shape)} does not match the image "
                                f"{tuple(img.shape)} (channels first): give the label the same spatial transforms")
            out["label"] = t.round().long() if t.is_floating_point() else t.long()
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
            except DataError:
                raise
            except Exception as e:
                case = self.data[index]
                raise DataError(f"case {case.get('case_id')} ({case.get('image')}): {_short(e)}") from e

    return CaseDataset


def _file_keys(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    return ["image"] + (["label"] if cases and isinstance(cases[0].get("label"), str) else [])


def check_source(conf: FileSource, base_dir: str | Path | None, label_source: str | None = None) -> list[Any]:
    """Everything that can be checked without reading an image: the files exist, the labels fit the task,
    the transforms' names, arguments and keys. Returns the built transforms."""
    cases = list_cases(conf, base_dir, label_source)
    kind = _check_task(cases, label_source)
    return build_transforms(conf.transforms, _file_keys(cases), sorted(cases[0])) \
        + [ToSample(kind)]


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
    transforms = build_transforms(conf.transforms, _file_keys(cases), sorted(cases[0]))
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

