"""Bad-input and hostile-config suite (issue 19): hundreds of broken configs, each either works or is
refused with one clear line.

Every case starts from one small valid config (a tiny CNN on four random 8x8 images in an .npz) and breaks
it in one way: a key deleted, misspelt or given a value of the wrong type, an attack with an unknown name or
parameter or a value its declaration refuses, budgets in the wrong units, code outside the allow-list, or a
file that is not a YAML mapping at all. ``medadv validate`` must then either accept it (**OK**: exit 0) or
refuse it with exit 2 and exactly one ``medadv: error: ...`` line naming what is wrong, and no traceback
(**CLEAR**). A few cases that validate are also evaluated.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import yaml

from medadv.attacks.base import attack_class
from medadv.cli import main

OK, CLEAR = "OK", "CLEAR"
DELETE = object()

BASE: dict[str, Any] = {
    "model": {"builder": "small_cnn", "kwargs": {"in_channels": 1, "num_outputs": 3, "width": 4}},
    "task": {"type": "multiclass"},
    "data": {"source": "npz", "path": "data.npz"},
    "threat": {"norm": "linf", "bounds": [0.0, 1.0]},
    "budgets": [0.05],
    "attacks": [{"name": "fgsm"}],
    "batch_size": 2,
    "output": "out",
}


def _deep(levels: int = 60) -> dict[str, Any]:
    d: dict[str, Any] = {"leaf": 1}
    for i in range(levels):
        d = {f"k{i}": d}
    return d


BIG = "a" * 100_000
#: a family of values of the wrong type or range for most keys
VALUES: dict[str, Any] = {"none": None, "emptylist": [], "emptydict": {}, "text": "x", "neg": -1, "zero": 0,
                          "huge": 1e308, "nan": math.nan, "inf": math.inf, "true": True, "bigtext": BIG,
                          "nested": _deep()}


@dataclass(frozen=True, eq=False)
class Case:
    id: str
    expected: str  # OK or CLEAR
    cfg: Any = None  # a mapping (or any YAML value) to dump, or
    text: str | bytes | None = None  # the file's raw content
    needle: str | None = None  # text the one error line must contain (the offending key or value)
    argv: tuple[str, ...] = ()  # extra command-line arguments
    lines: int = 1  # error lines expected (a case with two mistakes has two)


def _mutate(path: tuple[Any, ...], value: Any = DELETE, rename: str | None = None,
            base: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = copy.deepcopy(BASE if base is None else base)
    node = cfg
    for p in path[:-1]:
        node = node[p]
    last = path[-1]
    if rename is not None:
        node[rename] = node.pop(last)
    elif value is DELETE:
        del node[last]
    else:
        node[last] = value
    return cfg


def _misspell(key: str) -> str:
    """``key`` with one letter changed (never a valid spelling)."""
    i = len(key) // 2
    return key[:i] + ("q" if key[i] != "q" else "z") + key[i + 1:]


def _name(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


# which (key, value) pairs of the family are valid configs; every other pair must be refused
_OK_VALUES: dict[str, set[str]] = {
    "output": {"text"},
    "model.kwargs": {"emptydict"},
    "budgets": set(),
    "seed": {"neg", "zero"},
    "hd95": {"true"},
    "cases": {"zero"},
    "allow_code": {"true"},
    "allow_large_budgets": {"true"},
    "save_adversarial": {"true"},
    "spacing": {"huge", "none"},
    "target": {"none"},
    "inference": {"none"},
    "studies": {"none"},
    "model.seed": {"neg", "zero", "none"},
    "data.n": {"none"},
    "threat.eps": {"zero", "none"},
    "threat.bounds": {"none"},  # unbounded data: no box, no budget-scale check
    "task.class_names": {"none"},
}

#: optional keys the valid config does not set: each is added with every value of the family
OPTIONAL = {("seed",): 0, ("hd95",): False, ("cases",): 2, ("allow_code",): False, ("allow_large_budgets",): False,
            ("save_adversarial",): False, ("spacing",): 1.0, ("target",): "least_likely", ("inference",): None,
            ("studies",): None, ("model", "seed"): 0, ("data", "n"): 2, ("threat", "eps"): 0.05,
            ("task", "class_names"): ["a", "b", "c"]}


def _key_cases() -> list[Case]:
    cases: list[Case] = []
    paths = [("model",), ("model", "builder"), ("model", "kwargs"), ("task",), ("task", "type"), ("data",),
             ("data", "source"), ("data", "path"), ("threat",), ("threat", "norm"), ("threat", "bounds"),
             ("budgets",), ("attacks",), ("attacks", 0, "name"), ("batch_size",), ("output",)]
    deletable = {"model.kwargs", "threat.norm", "batch_size", "output"}  # they have defaults
    for path in paths:
        name = _name(path)
        leaf = str(path[-1]) if not isinstance(path[-1], int) else str(path[-2])
        cases.append(Case(f"delete-{name}", OK if name in deletable else CLEAR, _mutate(path),
                          needle=None if name in deletable else leaf))
        if not isinstance(path[-1], int):
            wrong = _misspell(leaf)
            cases.append(Case(f"misspell-{name}-as-{wrong}", CLEAR, _mutate(path, rename=wrong), needle=wrong))
        for vname, value in VALUES.items():
            expected = OK if vname in _OK_VALUES.get(name, set()) else CLEAR
            if name == "output" and vname in ("neg", "zero", "huge", "nan", "inf", "true"):
                continue  # YAML scalars that some would read as a folder name; not a mistake to insist on
            needle = None if expected == OK else leaf
            if name in ("data.path", "output", "attacks.0.name") and vname in ("text", "bigtext"):
                needle = str(value)[:20]  # the message names the value (a file, an attack)
            cases.append(Case(f"value-{name}-{vname}", expected, _mutate(path, value), needle=needle,
                              lines=2 if vname == "nested" and name in ("threat",) else 1))
    for path, good in OPTIONAL.items():
        name = _name(path)
        leaf = str(path[-1])
        base = _mutate(path, good) if good is not None else None
        if base is not None:
            wrong = _misspell(leaf)
            cases.append(Case(f"misspell-{name}-as-{wrong}", CLEAR, _mutate(path, rename=wrong, base=base),
                              needle=wrong))
        for vname, value in VALUES.items():
            expected = OK if vname in _OK_VALUES.get(name, set()) else CLEAR
            cases.append(Case(f"value-{name}-{vname}", expected, _mutate(path, value),
                              needle=None if expected == OK else leaf,
                              lines=2 if vname == "nested" and name == "inference" else 1))
    # unknown keys at every level
    for path in [("evil",), ("model", "evil"), ("task", "evil"), ("data", "evil"), ("threat", "evil"),
                 ("attacks", 0, "evil")]:
        cases.append(Case(f"unknown-key-{_name(path)}", CLEAR, _mutate(path, 1), needle="evil"))
    return cases


# --- attacks --------------------------------------------------------------------------------------------------------
_REFUSABLE = ["zz", [], {"a": 1}, True, -1, 0, -0.5, 1.5, 2, math.nan, math.inf, None]
PARAM_ATTACKS = ("pgd", "bim", "apgd", "square", "autoattack", "auto")


def _refused(constraint: Any) -> list[Any]:
    """Up to two values ``constraint`` refuses: the first text-or-container one and the first number."""
    out: list[Any] = []
    for kinds in ((str, list, dict, type(None)), (bool, int, float)):
        for v in _REFUSABLE:
            if isinstance(v, kinds) and (kinds[0] is not bool or isinstance(v, bool) or v is not None):
                try:
                    ok = constraint.accepts(v)
                except Exception:  # noqa: BLE001 - a constraint that cannot judge a value refuses it
                    ok = False
                if not ok:
                    out.append(v)
                    break
    return out


def _attack_cases() -> list[Case]:
    cases: list[Case] = []
    for atk in PARAM_ATTACKS:
        for pname, constraint in attack_class(atk).declared_params().items():
            for v in _refused(constraint):
                cases.append(Case(f"attack-{atk}-{pname}-{v!r}"[:90], CLEAR,
                                  _mutate(("attacks",), [{"name": atk, pname: v}]), needle=pname))
        cases.append(Case(f"attack-{atk}-unknown-param", CLEAR, _mutate(("attacks",), [{"name": atk, "evilparam": 1}]),
                          needle="evilparam"))
        wrong = _misspell(atk)
        cases.append(Case(f"attack-misspelt-{atk}-as-{wrong}", CLEAR, _mutate(("attacks",), [{"name": wrong}]),
                          needle=wrong))
    for atk in ("fgsm", "pgd", "bim"):
        cases.append(Case(f"attack-duplicate-{atk}", CLEAR, _mutate(("attacks",), [{"name": atk}, {"name": atk}]),
                          needle=atk))
        cases.append(Case(f"attack-duplicate-bare-{atk}", CLEAR, _mutate(("attacks",), [atk, atk]), needle=atk))
    for name in ("evil", "os:system", "medadv.attacks.pgd:PGD", "../pgd", "PGD!", ""):
        cases.append(Case(f"attack-name-{name!r}", CLEAR, _mutate(("attacks",), [{"name": name}])))
    for entry_name, entry in [("int", 3), ("list", [["pgd"]]), ("none", [None]), ("nested", [_deep()])]:
        cases.append(Case(f"attack-entry-{entry_name}", CLEAR, _mutate(("attacks",), entry), needle="attacks"))
    # attacks for another task
    for atk in ("dag", "vafa", "vafa2d"):
        cases.append(Case(f"attack-wrong-task-{atk}", CLEAR, _mutate(("attacks",), [{"name": atk}]), needle=atk))
    # valid variations (must stay OK)
    cases.append(Case("attack-ok-segpgd-any-task", OK, _mutate(("attacks",), ["segpgd"])))  # declares no task
    cases.append(Case("attack-ok-pgd-steps", OK, _mutate(("attacks",), [{"name": "pgd", "steps": 2}])))
    cases.append(Case("attack-ok-two", OK, _mutate(("attacks",), ["fgsm", {"name": "bim", "steps": 2}])))
    return cases


# --- budgets, threat, model, data ---------------------------------------------------------------------------------
def _semantic_cases() -> list[Case]:
    c: list[Case] = []
    for b in (8, 16, 255, 0.6, 1, "8", "255/1"):
        c.append(Case(f"budgets-wrong-units-{b!r}", CLEAR, _mutate(("budgets",), [b]), needle="budget"))
    for b in ("8/0", "x/255", "-8/255", "1e400", -0.01, "nan", "inf", [0.1], {"eps": 0.1}):
        c.append(Case(f"budgets-bad-{b!r}", CLEAR, _mutate(("budgets",), [b]), needle="budget"))
    c.append(Case("budgets-255-with-255-bounds", OK,
                  _mutate(("budgets",), [8], base=_mutate(("threat", "bounds"), [0, 255]))))
    c.append(Case("budgets-large-allowed", OK, _mutate(("budgets",), [0.6], base=_mutate(("allow_large_budgets",), True))))
    c.append(Case("budgets-fraction", OK, _mutate(("budgets",), ["8/255", "4/255"])))
    for bounds in ([1, 0], [0, 0], [0], [0, 1, 2], [0, "x"], [math.nan, 1], [0, math.inf], ["0", 1]):
        c.append(Case(f"bounds-{bounds!r}", CLEAR, _mutate(("threat", "bounds"), bounds), needle="bounds"))
    for builder in ("evilpkg.sub:X", "os:system", "subprocess:run", "builtins:eval", "torch.nn:Identity",
                    "small_cnnn", "nofile.py:Net", "/etc/passwd:x", "../../x.py:Net", "medadv.models:nope", ":", "a:b:c"):
        c.append(Case(f"builder-{builder}", CLEAR, _mutate(("model", "builder"), builder), needle="builder"))
    c.append(Case("builder-allowlist-with-allow-code-missing-module", CLEAR,
                  _mutate(("model", "builder"), "evilpkg.sub:X"), needle="evilpkg", argv=("--allow-code",)))
    for net, extra in [("torchvision", {"weights": "DEFAULT"}), ("torchvision", {"pretrained": True}),
                       ("monai", {"pretrained": True})]:
        name = {"torchvision": "resnet18", "monai": "DenseNet121"}[net]
        model = {net: name, "kwargs": extra}
        c.append(Case(f"download-{net}-{next(iter(extra))}", CLEAR, _mutate(("model",), model),
                      needle=next(iter(extra))))
    c.append(Case("model-two-networks", CLEAR, _mutate(("model", "monai"), "UNet"), needle="builder"))
    c.append(Case("model-kwargs-unknown", CLEAR, _mutate(("model", "kwargs", "evil"), 1), needle="evil"))
    c.append(Case("model-checkpoint-missing", CLEAR, _mutate(("model", "checkpoint"), "missing.pt"), needle="checkpoint"))
    c.append(Case("model-strip-prefix-without-checkpoint", CLEAR, _mutate(("model", "strip_prefix"), "module."),
                  needle="strip_prefix"))
    c.append(Case("model-torchscript-missing", CLEAR, _mutate(("model",), {"torchscript": "nope.pt"}),
                  needle="torchscript"))
    for path in ("missing.npz", "/nonexistent/dir/data.npz", "../../../../etc/passwd"):
        c.append(Case(f"data-path-{path!r}", CLEAR, _mutate(("data", "path"), path), needle=path.split("/")[-1]))
    c.append(Case("data-path-a-folder", CLEAR, _mutate(("data", "path"), "."), needle="data file not found"))
    c.append(Case("data-path-nul", CLEAR, _mutate(("data", "path"), "data.npz\x00x"), needle="data.path"))
    c.append(Case("output-nul", CLEAR, _mutate(("output",), "o\x00ut"), needle="output"))
    c.append(Case("key-nul", CLEAR, _mutate(("ev\x00il",), 1), needle="NUL"))
    c.append(Case("data-files-missing-glob", CLEAR, _mutate(("data",), {"source": "files", "images": "nope/*.nii.gz"}),
                  needle="images"))
    c.append(Case("data-datalist-missing", CLEAR, _mutate(("data",), {"source": "datalist", "path": "nope.json"}),
                  needle="path"))
    c.append(Case("data-csv-missing", CLEAR, _mutate(("data",), {"source": "csv", "path": "nope.csv"}), needle="path"))
    for t in ("segmentation", "multilabel", "regression"):
        c.append(Case(f"task-type-{t}", CLEAR, _mutate(("task", "type"), t), needle=None))
    c.append(Case("task-multiclass-threshold", CLEAR, _mutate(("task", "threshold"), 0.5), needle="threshold"))
    c.append(Case("task-class-names-duplicate", CLEAR, _mutate(("task", "class_names"), ["a", "a", "b"]),
                  needle="class_names"))
    c.append(Case("target-code-not-allowed", CLEAR, _mutate(("target",), "os:system"), needle="target"))
    c.append(Case("target-unknown-word", CLEAR, _mutate(("target",), "backgrond"), needle="target"))
    c.append(Case("target-background-multiclass", OK, _mutate(("target",), "background"), needle="target"))
    c.append(Case("output-a-file", CLEAR, _mutate(("output",), "data.npz"), needle="data.npz"))
    c.append(Case("studies-unknown", CLEAR, _mutate(("studies",), [{"study": "evil"}]), needle="evil"))
    return c


# --- the file itself ------------------------------------------------------------------------------------------------
def _file_cases() -> list[Case]:
    good = yaml.safe_dump(BASE)
    return [
        Case("file-empty", CLEAR, text=""),
        Case("file-only-comment", CLEAR, text="# nothing\n"),
        Case("file-null", CLEAR, text="~\n"),
        Case("file-list", CLEAR, cfg=[BASE]),
        Case("file-scalar-int", CLEAR, text="42\n"),
        Case("file-scalar-text", CLEAR, text="hello\n"),
        Case("file-invalid-yaml", CLEAR, text="model: {builder: small_cnn\ntask: [\n", needle="YAML"),
        Case("file-tabs", CLEAR, text="model:\n\tbuilder: small_cnn\n", needle="YAML"),
        Case("file-binary", CLEAR, text=bytes(range(256)) * 4),
        Case("file-nul-bytes", CLEAR, text=b"model: \x00\x00\n"),
        Case("file-latin1", CLEAR, text="output: caf\xe9\n".encode("latin-1")),
        Case("file-python-tag", CLEAR, text="!!python/object/apply:os.system ['echo hi']\n", needle="YAML"),
        Case("file-python-tag-in-key", CLEAR, text=good + "seed: !!python/object/apply:os.getpid []\n", needle="YAML"),
        Case("file-two-documents", CLEAR, text=good + "---\n" + good),
        Case("file-duplicate-key", CLEAR, text=good + "batch_size: 3\n", needle="batch_size"),
        Case("file-non-string-keys", CLEAR, cfg={**BASE, 1: 2}),
        Case("file-null-key", CLEAR, text=good + "~: 1\n"),
        Case("file-huge-key", CLEAR, cfg={**BASE, BIG: 1}),
        Case("file-huge-value-list", CLEAR, cfg={**BASE, "budgets": [0.01] * 10_000 + ["x"]}, needle="budgets"),
        Case("file-deep-nesting", CLEAR, cfg={**BASE, "junk": _deep(200)}, needle="junk"),
        Case("file-deep-flow-lists", CLEAR, text=good + "junk: " + "[" * 500 + "]" * 500 + "\n"),
        Case("file-alias-bomb", CLEAR, text=good + "junk:\n a: &a [x, x, x, x, x, x, x, x, x]\n b: &b [*a, *a, *a, *a, *a, *a, *a, "
             "*a, *a]\n c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n d: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"),
        Case("file-bom", OK, text="\ufeff" + good),
        Case("file-crlf", OK, text=good.replace("\n", "\r\n")),
        Case("file-valid", OK, text=good),
    ]


# --- issue 28: config tracebacks made one line ---------------------------------------------------------------------
#: checkpoint files the fixture writes beside the config: (name, what it holds)
CHECKPOINTS = ("state_dict.pt", "pickled_call.pt", "plain_pickle.pt", "gap_mismatch.pt", "garbage.pt", "empty.pt")


def _issue28_cases() -> list[Case]:
    c: list[Case] = []
    allowed = _mutate(("allow_large_budgets",), True)
    for b in (1e308, 3.5e38, "1e308", "1e300/1e-10"):
        c.append(Case(f"budgets-beyond-float32-allowed-{b!r}", CLEAR, _mutate(("budgets",), [b], base=allowed),
                      needle="budget"))
    c.append(Case("budgets-float32-max-allowed", OK, _mutate(("budgets",), [3.0e38], base=allowed)))
    for bounds in ([0, 1e308], [-1e308, 0], [-1e39, 1e39]):
        c.append(Case(f"bounds-beyond-float32-{bounds!r}", CLEAR, _mutate(("threat", "bounds"), bounds),
                      needle="bounds"))
    good = yaml.safe_dump(BASE)
    merged = good.replace("attacks:\n- name: fgsm\n", "attacks:\n- &pgd {name: pgd, steps: 2}\n- <<: *pgd\n  id: pgd-b\n"
                                                      "  steps: 3\n")
    assert merged != good
    c.append(Case("file-merge-key-override", OK, text=merged))
    c.append(Case("file-merge-key-list", OK, text=good.replace("model:\n", "model:\n  <<: [{seed: 1}, {seed: 2}]\n")))
    c.append(Case("file-merge-key-overridden", OK, text=good.replace("model:\n", "model:\n  <<: {seed: 1}\n  seed: 2\n")))
    c.append(Case("file-merge-key-twice-the-same-key", CLEAR, needle="seed",
                  text=good.replace("model:\n", "model:\n  <<: {seed: 1}\n  seed: 2\n  seed: 3\n")))
    c.append(Case("file-merge-key-of-a-scalar", CLEAR, text=good.replace("model:\n", "model:\n  <<: 1\n"),
                  needle="YAML"))
    c.append(Case("file-merge-key-unknown-key", CLEAR, text=good.replace("model:\n", "model:\n  <<: {evil: 1}\n"),
                  needle="evil"))
    for name, raw in [("png", b"\x89PNG\r\n\x1a\n" + bytes(range(256))), ("utf16", good.encode("utf-16")),
                      ("gzip", b"\x1f\x8b\x08\x00" + bytes(64)), ("cp1252", "output: \u201cout\u201d\n".encode("cp1252"))]:
        c.append(Case(f"file-not-utf8-{name}", CLEAR, text=raw, needle="UTF-8"))
    for ckpt in CHECKPOINTS:  # a state dict that does not fit lists missing and unexpected keys: a line each
        c.append(Case(f"gap-checkpoint-{ckpt}", CLEAR, _mutate(("attacks",), [{"name": "gap", "generator":
                                                                               {"checkpoint": ckpt}}]), needle=ckpt,
                      lines=3 if ckpt == "gap_mismatch.pt" else 1))
    c.append(Case("gap-checkpoint-missing", CLEAR, _mutate(("attacks",), [{"name": "gap", "generator":
                                                                          {"checkpoint": "nope.pt"}}]), needle="nope.pt"))
    return c


CASES = _key_cases() + _attack_cases() + _semantic_cases() + _file_cases() + _issue28_cases()

# cases that reveal a known, not yet fixed, problem: id -> what is wrong
XFAIL: dict[str, str] = {
    "misspell-task.type-as-tyqe": "a misspelt `task.type` is reported as '`task` needs `type`', not naming `tyqe`",
    "misspell-data.source-as-souqce": "a misspelt `data.source` is reported as '`data` needs `source`', not naming "
                                      "`souqce`",
    "task-type-multilabel": "validate does not check the labels against the task: class indices y of shape (N,) "
                            "pass for a multilabel task (which needs one 0/1 column per label)",
    "task-type-regression": "validate does not check the labels against the task: integer class indices of shape "
                            "(N,) pass for a regression task (evaluate refuses them: targets must be floats shaped "
                            "like the output)",
}

#: cases that validate OK and are also evaluated (exit 0 or one clear line)
EVALUATE = ("file-valid", "attack-ok-two", "budgets-fraction", "value-seed-neg", "value-hd95-true",
            "budgets-255-with-255-bounds", "value-model.kwargs-emptydict", "delete-threat.norm")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    np.savez(d / "data.npz", x=rng.random((4, 1, 8, 8), dtype=np.float32), y=rng.integers(0, 3, 4))
    _write_checkpoints(d)
    return d


class _CallsPrint:
    """Pickled as a call of ``print``: code that ``torch.load(weights_only=True)`` refuses to run."""

    def __reduce__(self):
        return (print, ("this checkpoint ran code",))


def _write_checkpoints(d) -> None:
    import pickle

    import torch

    torch.save({"w": torch.zeros(2)}, d / "state_dict.pt")
    torch.save({"state_dict": {"w": torch.zeros(2)}, "extra": _CallsPrint()}, d / "pickled_call.pt")
    with open(d / "plain_pickle.pt", "wb") as fh:
        pickle.dump({"w": [1.0, 2.0]}, fh, protocol=4)
    torch.save({"generator_config": {"kind": "unet", "in_channels": 1, "ngf": 4}, "gap": {},
                "state_dict": {"w": torch.zeros(1)}}, d / "gap_mismatch.pt")
    (d / "garbage.pt").write_bytes(b"not a checkpoint at all" * 4)
    (d / "empty.pt").write_bytes(b"")


def _write(case: Case, directory) -> Any:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in case.id)[:60]
    path = directory / f"{safe}-{[c.id for c in CASES].index(case.id)}.yaml"
    if case.text is not None:
        if isinstance(case.text, bytes):
            path.write_bytes(case.text)
        else:
            path.write_text(case.text, newline="")
    else:
        path.write_text(yaml.safe_dump(case.cfg, width=1 << 30))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().err


def _classify(rc: int, err: str, needle: str | None, n_lines: int = 1) -> str:
    if rc == 0 and not err.strip():
        return OK
    lines = err.splitlines()
    if (rc == 2 and "Traceback" not in err and len(lines) == n_lines
            and all(line.startswith("medadv: error: ") for line in lines)
            and (needle is None or needle.lower() in err.lower())):
        return CLEAR
    return f"BAD(rc={rc}, {len(lines)} lines)"


def _params() -> list[Any]:
    out = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[case.id])] if case.id in XFAIL else []
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_hostile_config_is_ok_or_one_clear_line(case: Case, data_dir, capsys):
    path = _write(case, data_dir)
    rc, err = _run(["validate", str(path), *case.argv], capsys)
    got = _classify(rc, err, case.needle, case.lines)
    assert got == case.expected, f"{case.id}: expected {case.expected}, got {got}: rc={rc} err={err[:2000]!r}"


@pytest.mark.parametrize("case_id", EVALUATE)
def test_some_valid_cases_also_evaluate(case_id, tmp_path, data_dir, capsys):
    case = next(c for c in CASES if c.id == case_id)
    assert case.expected == OK
    (tmp_path / "data.npz").write_bytes((data_dir / "data.npz").read_bytes())
    path = _write(case, tmp_path)
    rc, err = _run(["evaluate", str(path), "--no-progress", *case.argv], capsys)
    assert rc == 0 or _classify(rc, err, None) == CLEAR, (rc, err[-3000:])
    if rc == 0:
        assert (tmp_path / "out" / "results.json").is_file()


def test_the_suite_has_at_least_250_distinct_cases_each_with_an_expected_class():
    ids = [c.id for c in CASES]
    assert len(ids) >= 250, len(ids)
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    assert all(c.expected in (OK, CLEAR) for c in CASES)
    assert all((c.cfg is None) != (c.text is None) for c in CASES)


# --- issue 28: what a run finds in its output folder, and checkpoints it loads ---------------------------------------
def _foreign_line(out) -> None:
    with open(out / "log.jsonl", "a") as fh:
        fh.write('{"note": "a line another tool appended"}\n')


def _list_line(out) -> None:
    with open(out / "log.jsonl", "a") as fh:
        fh.write("[1, 2, 3]\n")


def _row_without_sample(out) -> None:
    import json

    rows = (out / "log.jsonl").read_text().splitlines()
    row = json.loads(rows[0])
    del row["sample"]
    (out / "log.jsonl").write_text("\n".join([json.dumps(row), *rows[1:]]) + "\n")


def _corrupt_run_record(out) -> None:
    (out / "run.json").write_text("{not json")


def _run_record_without_fingerprint(out) -> None:
    (out / "run.json").write_text("[]")


#: (id, how the first run's folder is damaged, text the one error line must contain)
RUN_CASES = [("log-foreign-line", _foreign_line, "log.jsonl, line"), ("log-a-list-line", _list_line, "log.jsonl, line"),
             ("log-row-without-sample", _row_without_sample, "sample"),
             ("run-json-corrupt", _corrupt_run_record, "run.json"),
             ("run-json-not-a-record", _run_record_without_fingerprint, "run.json")]


@pytest.mark.parametrize(("case_id", "damage", "needle"), RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_damaged_output_folder_is_one_clear_line_on_resume(case_id, damage, needle, tmp_path, data_dir, capsys):
    (tmp_path / "data.npz").write_bytes((data_dir / "data.npz").read_bytes())
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(BASE))
    rc, err = _run(["evaluate", str(path), "--no-progress"], capsys)
    assert rc == 0, err
    damage(tmp_path / "out")
    rc, err = _run(["evaluate", str(path), "--no-progress"], capsys)
    assert _classify(rc, err, needle) == CLEAR, (rc, err[-3000:])


@pytest.mark.parametrize("ckpt", ["pickled_call.pt", "plain_pickle.pt", "garbage.pt", "empty.pt", "state_dict.pt"])
def test_a_checkpoint_that_cannot_be_loaded_is_one_clear_line(ckpt, tmp_path, data_dir, capsys):
    for name in ("data.npz", ckpt):
        (tmp_path / name).write_bytes((data_dir / name).read_bytes())
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(_mutate(("model", "checkpoint"), ckpt)))
    rc, err = _run(["evaluate", str(path), "--no-progress"], capsys)
    # a state dict of other keys lists the missing and the unexpected ones, a line each
    assert _classify(rc, err, ckpt, 3 if ckpt == "state_dict.pt" else 1) == CLEAR, (rc, err[-3000:])
    assert "this checkpoint ran code" not in capsys.readouterr().out
    if ckpt in ("pickled_call.pt", "plain_pickle.pt"):  # objects, not damage: say so, and how to re-save
        assert "corrupt" not in err and "torch.save(model.state_dict(), path)" in err, err
        assert "weights_only" in err, err


def test_a_results_file_that_is_not_one_is_named():
    import tempfile
    from pathlib import Path

    from medadv.results import Results

    with tempfile.TemporaryDirectory() as d:
        for name, text in [("corrupt.json", "{not json"), ("list.json", "[1, 2]"), ("norows.json", "{}")]:
            (Path(d) / name).write_text(text)
            with pytest.raises(ValueError, match=name):
                Results.from_json(Path(d) / name)
