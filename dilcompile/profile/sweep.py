"""Sweep specs: a TOML file or CLI flags expanded into :class:`Point` s.

The standard sweeps ship with the package (``dilcompile/profile/sweeps/``)
and are named without a path: ``--sweep quick`` (:func:`standard_sweeps`
lists them); anything with a ``/`` or a ``.toml`` suffix is a file.

A sweep file::

    name = "quick"
    warmup = 2          # untimed calls per point (after the compile call)
    repeats = 20        # timed calls per point, at most ...
    max_time_s = 1.5    # ... and no more than this much timed work per point
    tag = "optional label"

    [defaults]          # applies to every [[grid]] entry
    batch = 1
    heads = 8
    head_dim = 64
    dtype = "float32"
    causal = false
    pass = "fwd"
    compile = false
    device = "auto"
    impl = "auto"       # the variant's implementation (dilated: sdpa, triton, ...; sdpa: flash, cudnn, ...)
    layout = ""         # "": B rows of N; packed | docs | padded | padded-dense: documents filling N
    segments = [512, 1024]
    rates = [1, 2]

    [[grid]]            # the cartesian product of list-valued keys
    variant = ["sdpa", "dilated"]
    seq_len = [1024, 2048]
    compile = [false, true]

``segments``/``rates``: a list of ints is one value; a list of lists is a
choice, and the two choices are zipped (one rate list per segment list).
Variants without branches (``sdpa``, ``block-sparse:…``) ignore them.
"""

from __future__ import annotations

import itertools
import math
import tomllib
from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import check_int
from .documents import LAYOUTS
from .env import resolve_device
from .point import Point
from .variants import check_point, resolve

KEYS = ("variant", "seq_len", "batch", "heads", "head_dim", "dtype", "causal", "pass", "compile", "device",
        "impl", "layout", "segments", "rates")
DEFAULTS = {"batch": 1, "heads": 8, "head_dim": 64, "dtype": "float32", "causal": False, "pass": "fwd",
            "compile": False, "device": "auto", "impl": "auto", "layout": "", "segments": [], "rates": []}


@dataclass(frozen=True)
class SweepSpec:
    name: str
    points: tuple[Point, ...]
    warmup: int = 2
    repeats: int = 20
    max_time_s: float = 2.0  # cap on a point's timed work; repeats shrink to fit (at least 3)
    tag: str | None = None
    source: dict = field(default_factory=dict)  # the spec as asked (stored as JSON)

    def __post_init__(self):
        if not self.points:
            raise ValueError(f"sweep {self.name!r} has no points; give at least one variant and one seq_len")
        if self.warmup < 0 or self.repeats < 1 or not 0 < self.max_time_s < math.inf:
            raise ValueError(f"need warmup ≥ 0, repeats ≥ 1, 0 < max_time_s < inf; got {self.warmup}, "
                             f"{self.repeats}, {self.max_time_s}")


def _choices(key: str, value) -> list:
    if key in ("segments", "rates"):
        if isinstance(value, list) and value and all(isinstance(v, (list, tuple)) for v in value):
            return value
        return [value]
    return value if isinstance(value, list) else [value]


def _whole_numbers(key: str, value) -> tuple[int, ...]:
    """One segments or rates list: a 32 or a 32.5 was an internal error or silently truncated."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{key} must be a list of whole numbers such as [2048, 4096] (or a list of such lists), "
                        f"got {value!r}")
    return tuple(value)


def _seconds(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} must be a number of seconds, got {value!r}")
    return float(value)


def with_layout(variant: str, layout) -> str:
    """The registry's name for ``variant`` on a batch ``layout`` (profile/documents.py):
    ``("block-sparse:local_window(64)", "packed")`` -> ``"block-sparse-packed:local_window(64)"``."""
    if layout == "":
        return variant
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (or \"\" for B rows of N), got {layout!r}")
    base, colon, spec = variant.partition(":")
    return f"{base}-{layout}{colon}{spec}"


def expand(entry: dict, defaults: dict, device: str) -> list[Point]:
    """All points of one grid entry (defaults filled in), validated."""
    for name, table in (("[[grid]] entry", entry), ("[defaults]", defaults)):
        if not isinstance(table, dict):
            raise ValueError(f"every {name} must be a table of keys, got {table!r}")
    merged = {**DEFAULTS, **defaults, **entry}
    unknown = set(merged) - set(KEYS)
    if unknown:
        raise ValueError(f"unknown sweep key(s) {sorted(unknown)}; allowed: {', '.join(KEYS)}")
    for key in ("variant", "seq_len"):
        if key not in merged:
            raise ValueError(f"every [[grid]] entry needs {key!r}")
    segs, rates = _choices("segments", merged.pop("segments")), _choices("rates", merged.pop("rates"))
    if len(segs) != len(rates):
        raise ValueError(f"segments has {len(segs)} choices but rates has {len(rates)}; give one rates list per "
                         "segments list")
    merged["branches"] = [(_whole_numbers("segments", s), _whole_numbers("rates", r)) for s, r in zip(segs, rates)]
    keys = list(merged)
    grids = [merged[k] if k == "branches" else _choices(k, merged[k]) for k in keys]
    points = []
    for combo in itertools.product(*grids):
        d = dict(zip(keys, combo))
        if not isinstance(d["variant"], str):
            raise ValueError(f"variant must be a name such as 'sdpa' or 'block-sparse:local_window(256)', "
                             f"got {d['variant']!r}")
        d["variant"] = with_layout(d["variant"], d["layout"])
        variant, _ = resolve(d["variant"])
        segments, rate_list = d["branches"] if variant.needs_branches else ((), ())
        dev = device if d["device"] == "auto" else str(resolve_device(str(d["device"])))
        point = Point(variant=d["variant"], seq_len=d["seq_len"], batch=d["batch"], heads=d["heads"],
                      head_dim=d["head_dim"], dtype=d["dtype"], causal=d["causal"], pass_=d["pass"],
                      segments=segments, rates=rate_list, compiled=d["compile"], device=dev, impl=d["impl"])
        check_point(point)
        if point not in points:
            points.append(point)
    return points


def from_dict(doc: dict, device: str, name: str = "adhoc", tag: str | None = None) -> SweepSpec:
    allowed = {"name", "description", "warmup", "repeats", "max_time_s", "tag", "defaults", "grid"}
    unknown = set(doc) - allowed
    if unknown:
        raise ValueError(f"unknown top-level sweep key(s) {sorted(unknown)}; allowed: {', '.join(sorted(allowed))}")
    grid = doc.get("grid") or []
    if isinstance(grid, dict):
        grid = [grid]
    points: list[Point] = []
    for entry in grid:
        for p in expand(entry, doc.get("defaults", {}), device):
            if p not in points:
                points.append(p)
    # checked, not cast: int(1.7) ran 1 warm-up call and float("x") named no key
    return SweepSpec(name=doc.get("name", name), points=tuple(points),
                     warmup=check_int("warmup", doc.get("warmup", 2)),
                     repeats=check_int("repeats", doc.get("repeats", 20), minimum=1),
                     max_time_s=_seconds("max_time_s", doc.get("max_time_s", 2.0)),
                     tag=tag if tag is not None else doc.get("tag"), source=doc)


def standard_sweeps() -> tuple[str, ...]:
    """Names of the sweeps that ship with the package (``--sweep NAME``)."""
    folder = resources.files(__package__) / "sweeps"
    return tuple(sorted(f.name.removesuffix(".toml") for f in folder.iterdir() if f.name.endswith(".toml")))


def is_sweep_name(text: str) -> bool:
    """A bare name (no folder, no ``.toml``) names a standard sweep; anything else is a path."""
    return "/" not in text and "\\" not in text and not text.endswith(".toml")


def _read_standard(name: str) -> str:
    names = standard_sweeps()
    if name not in names:
        raise ValueError(f"no standard sweep named {name!r}; the standard sweeps are {', '.join(names)} "
                         "(or pass a path to a TOML sweep file, e.g. ./my_sweep.toml)")
    return (resources.files(__package__) / "sweeps" / f"{name}.toml").read_text()


def load(sweep: str | Path, device: str, tag: str | None = None) -> SweepSpec:
    """The sweep named ``sweep`` (a standard sweep such as ``"quick"``) or the TOML file at that path."""
    if isinstance(sweep, str) and is_sweep_name(sweep):
        return from_dict(tomllib.loads(_read_standard(sweep)), device, name=sweep, tag=tag)
    path = Path(sweep)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"sweep file {str(path)!r} not found; the standard sweeps are named without a path: "
                         f"{', '.join(standard_sweeps())}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a folder, no permission, not text
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"cannot read sweep file {str(path)!r} ({reason}); pass a TOML file, or the name of "
                         f"a standard sweep ({', '.join(standard_sweeps())})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"sweep file {str(path)!r} is not valid TOML: {exc}") from None
    return from_dict(doc, device, name=path.stem, tag=tag)


def order_for_baseline(points: tuple[Point, ...]) -> list[Point]:
    """Shape by shape, with the dense ``sdpa`` point first, so η can be computed
    as each row is written. Order is otherwise kept."""
    first_seen: dict[tuple, int] = {}
    for i, p in enumerate(points):
        first_seen.setdefault(p.shape_key(), i)
    return sorted(points, key=lambda p: (first_seen[p.shape_key()], p.variant != "sdpa", p.compiled))
