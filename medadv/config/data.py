"""The ``data:`` section of a config made into batches: :func:`build_loader`, :func:`build_data`, :func:`check_data`
(what building would refuse, without reading an image) and :func:`data_identity` (what a resume fingerprint hashes).

Each function takes the typed section of :mod:`medadv.config_schema` (``Mni152Data``, ``FilesData``, ...), as a
:class:`medadv.run.Plan` holds it, or a plain mapping, which is validated once here at the boundary. Relative paths
start at ``base_dir`` (a config's folder). These were ``medadv.config``'s; it re-exports them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config_schema import (
    FILE_SOURCES,
    ConfigError,
    CsvData,
    DatalistData,
    DataSection,
    FilesData,
    Mni152Data,
    NpzData,
    SyntheticData,
    validate_section,
)
from ..params import closest
from .trust import OPT_IN, CodeNotAllowedError

if TYPE_CHECKING:
    from torch import Tensor

    from ..tasks import Task

__all__ = ["CODE_TRANSFORM_ARGS", "DATA_SECTIONS", "DataSpec", "data_section", "build_data", "build_loader",
           "check_data", "data_identity"]

#: the typed ``data:`` sections, one per source
DATA_SECTIONS = (Mni152Data, SyntheticData, NpzData, FilesData, DatalistData, CsvData)
#: what the builders here take: a typed section or a mapping (validated once, here)
DataSpec = Mni152Data | SyntheticData | NpzData | FilesData | DatalistData | CsvData | Mapping[str, Any]

#: arguments of MONAI transforms that run code or write files (``Lambdad(func=...)``, ``SaveImaged(output_dir=...)``,
#: ``WriteFileMappingd(mapping_file_path=...)``): a transform taking one is named only with ``allow_code``
CODE_TRANSFORM_ARGS = ("func", "inv_func", "post_func", "saver", "writer", "output_dir", "data_root_dir",
                       "savepath_in_metadict", "mapping_file_path", "logger_handler")


def data_section(spec: DataSpec, where: str = "data") -> Mni152Data | SyntheticData | NpzData | FilesData | \
        DatalistData | CsvData:
    """``spec`` as its typed section: a typed section as it is, a mapping checked against the schema (errors under
    ``where``)."""
    if isinstance(spec, DATA_SECTIONS):
        return spec
    if not isinstance(spec, Mapping):
        raise ConfigError([f"`{where}` must be a mapping or a data section of medadv.config_schema; got "
                           f"{type(spec).__name__}"])
    return validate_section(DataSection, spec, tuple(where.split(".")))  # type: ignore[no-any-return]


def _relative(value: str, base_dir: str | None) -> Path:
    """``value`` as a path, relative to ``base_dir`` (a config's folder) unless absolute."""
    path = Path(value)
    return Path(base_dir) / path if base_dir and not path.is_absolute() else path


def _check_call(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str, skip: tuple[str, ...] = ()) -> None:
    """Refuse keyword arguments ``fn`` does not take, naming the closest one it does."""
    from ..models.loading import check_kwargs

    check_kwargs(fn, kwargs, where, required=False, skip=skip)


def _reader_class(value: Any) -> bool:
    """Whether a ``reader`` value names one of MONAI's image readers (a key of ``SUPPORTED_READERS`` or an
    ``ImageReader`` subclass of ``monai.data``): anything else, a dotted path above all, is code that MONAI would
    locate and call with the transform's arguments."""
    import monai.data
    from monai.transforms.io.array import SUPPORTED_READERS

    if value is None:
        return True
    if isinstance(value, list | tuple):
        return all(_reader_class(v) for v in value)
    if not isinstance(value, str):
        return False
    if value.lower() in SUPPORTED_READERS:
        return True
    obj = getattr(monai.data, value, None) if value.isidentifier() else None
    return isinstance(obj, type) and issubclass(obj, monai.data.ImageReader)


def _allow_transforms(conf: Any, allow_code: bool) -> None:
    """Without ``allow_code``, the data transforms a config names neither run code nor write files: no transform
    taking one of :data:`CODE_TRANSFORM_ARGS`, and a loader's ``reader`` one of MONAI's readers by name."""
    if allow_code or not isinstance(conf, FilesData | DatalistData | CsvData) or not conf.transforms:
        return
    from ..data.sources import monai_transforms

    table = monai_transforms()
    for i, entry in enumerate(conf.transforms):
        cls = table.get(entry.name)
        if cls is None:
            continue
        try:
            params: Mapping[str, Any] = inspect.signature(cls).parameters
        except (TypeError, ValueError):
            params = {}
        code = [a for a in CODE_TRANSFORM_ARGS if a in params]
        if code:
            raise CodeNotAllowedError([f"`data.transforms[{i}]` {entry.name} takes `{code[0]}`: it runs code or writes "
                                       f"files, and a config does so only with --allow-code; {OPT_IN}"])
        reader = entry.args().get("reader")
        if not _reader_class(reader):
            raise CodeNotAllowedError([f"`data.transforms[{i}].reader` {str(reader)[:80]!r} is not one of MONAI's "
                                       "image readers (ITKReader, NibabelReader, PILReader, PydicomReader, NumpyReader"
                                       f", ...): MONAI would import and call it; {OPT_IN}"])


def _data_loader(spec: DataSpec, base_dir: str | None) -> Callable[[], tuple[Tensor, Tensor]]:
    """Check a built-in ``data`` section (names, files, arrays present) and return what loads it."""
    conf = data_section(spec)
    if isinstance(conf, FilesData | DatalistData | CsvData):
        raise ConfigError([f"`data.source: {conf.source}` streams cases from files: use build_loader(), which "
                           "returns a DataLoader of dict batches"])
    if isinstance(conf, NpzData):
        from ..data.npz import npz_loader

        # every check of the archive (0 cases, damaged, complex) lives with the data sources
        return npz_loader(_relative(conf.path, base_dir), conf.n)
    kw = dict(conf.kwargs)
    fn: Callable[..., tuple[Tensor, Tensor]]
    if isinstance(conf, SyntheticData):
        from ..data import synthetic

        kinds = ("segmentation_blobs", "multiclass_blobs", "multilabel_blobs")
        kind = kw.pop("kind", "segmentation_blobs")
        if kind not in kinds:
            c = closest(str(kind), kinds)
            raise ConfigError([f"`data.kwargs.kind` must be one of {', '.join(map(repr, kinds))}; got {kind!r}"
                               + (f"; did you mean {c!r}?" if c else "")])
        fn = getattr(synthetic, kind)
    else:
        from ..data import mni152

        kind = kw.pop("kind", "patches")
        if kind not in mni152.KINDS:
            c = closest(str(kind), list(mni152.KINDS))
            raise ConfigError([f"`data.kwargs.kind` must be one of {', '.join(map(repr, mni152.KINDS))}; got {kind!r}"
                               + (f"; did you mean {c!r}?" if c else "")])
        fn = mni152.KINDS[kind]
    _check_call(fn, kw, "data.kwargs", skip=("n",))
    n = conf.n
    return lambda: fn(n=n, **kw)


def _file_source(spec: DataSpec) -> FilesData | DatalistData | CsvData | None:
    """The typed section of a file source (``files``, ``datalist``, ``csv``), else ``None``."""
    conf = data_section(spec)
    return conf if conf.source in FILE_SOURCES else None  # type: ignore[return-value]


def check_data(spec: DataSpec, base_dir: str | None = None, task: Task | None = None, *,
               allow_code: bool = True) -> None:
    """What :func:`build_loader` would refuse, without reading an image or an array.

    Built-in sources: the names, keyword arguments and files. File sources (``files``, ``datalist``,
    ``csv``): the files exist, the labels fit ``task``, and the MONAI transforms resolve, take the
    arguments given and name keys the cases have (:func:`medadv.data.sources.check_source`); with
    ``allow_code`` false, no transform runs code or writes files (:data:`CODE_TRANSFORM_ARGS`, a ``reader``
    that is not one of MONAI's by name).
    """
    conf = data_section(spec)
    _allow_transforms(conf, allow_code)  # before any transform is built: building one may import and call code
    if not isinstance(conf, FilesData | DatalistData | CsvData):
        _data_loader(conf, base_dir)
        return
    from ..data.sources import check_source

    check_source(conf, base_dir, task.label_source if task is not None else None)


def build_data(spec: DataSpec, base_dir: str | None = None) -> tuple[Tensor, Tensor]:
    """The ``(x, y)`` tensors of a built-in source (``mni152``, ``synthetic``, ``npz``); for any source,
    :func:`build_loader` streams batches."""
    return _data_loader(spec, base_dir)()


def build_loader(spec: DataSpec, base_dir: str | None = None, *, batch_size: int = 8,
                 task: Task | None = None, seed: int = 0, allow_code: bool = True) -> Iterable[Any]:
    """The configured data as an iterable of batches, in a fixed order.

    File sources stream MONAI-collated dict batches (``image``, ``label``, ``case_id``; see
    :mod:`medadv.data.sources`) through a ``DataLoader``: only one batch is read at a time. Built-in
    sources give ``(x, y)`` tensor batches. ``allow_code`` false refuses transforms that run code or write
    files (:func:`check_data`).
    """
    conf = data_section(spec)
    _allow_transforms(conf, allow_code)
    if isinstance(conf, FilesData | DatalistData | CsvData):
        from ..data.sources import make_loader

        return make_loader(conf, base_dir, batch_size=batch_size, label_source=task.label_source if task is not None else None,
                           seed=seed)
    x, y = build_data(conf, base_dir)
    if task is not None:  # class indices and label maps are integers: refused before any batch is attacked
        from ..data.npz import check_integer_labels

        check_integer_labels(y, {"path": getattr(conf, "path", None)}, task.label_source)
    return [(x[i: i + batch_size], y[i: i + batch_size]) for i in range(0, x.shape[0], batch_size)]


def data_identity(spec: DataSpec, base_dir: str | None = None) -> Any:
    """What identifies the data beyond the config: ``[path, size, mtime_ns]`` of every file read (the
    cases of a file source and their datalist/CSV, an ``.npz``); built-in sources are their settings."""
    conf = data_section(spec)
    if isinstance(conf, FilesData | DatalistData | CsvData):
        from ..data.sources import data_identity as files_identity

        return files_identity(conf, base_dir)
    if isinstance(conf, NpzData):
        path = _relative(conf.path, base_dir)
        if path.is_file():
            st = path.stat()
            return [[str(path.resolve()), st.st_size, st.st_mtime_ns]]
    return []
