"""Prices as data: ``models/prices.toml`` (each price with its source and date) and
the user's overrides, resolved into one :class:`Prices` record.

Money is never assumed silently: every price the economics use is a :class:`Price`
carrying where it came from (the catalog's source and date, the user's file, or a
flag), and the report lists them all. A GPU without a catalog price and without
``--gpu-hour-usd`` has ``gpu_hour`` = ``None``: the report then shows no money for
GPUs and says so, rather than inventing a figure.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from analyzer import limits
from analyzer.cost.catalog import models_dir, recognize_gpu
from analyzer.errors import InputError, Location

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True, slots=True)
class Price:
    """One price: ``usd`` per ``unit``, and where it came from."""

    usd: float
    unit: str  # "GPU-hour", "GB-month", "TB-month", "node-month", "month"
    source: str
    date: str = ""  # when the source was read (YYYY-MM-DD); "" for the user's own

    def to_json(self) -> dict[str, object]:
        return {"usd": self.usd, "unit": self.unit, "source": self.source, "date": self.date}


@dataclass(frozen=True, slots=True)
class Prices:
    """The prices one analysis uses; ``gpu_hour`` is for the analysed GPU."""

    gpu: str
    gpu_hour: Price | None
    dram_gb_month: Price
    nvme_tb_month: Price
    nic_node_month: Price
    store_month: Price
    hours_per_month: float = HOURS_PER_MONTH
    gpu_hours_by_gpu: tuple[tuple[str, Price], ...] = ()  # every catalog GPU (side by side)

    def gpu_hour_for(self, gpu: str) -> Price | None:
        """The price of ``gpu`` (any name the catalog recognizes for it)."""
        gpu = _gpu_id(gpu)
        if gpu == self.gpu:
            return self.gpu_hour
        for name, p in self.gpu_hours_by_gpu:
            if name == gpu:
                return p
        return None

    def gpu_month_usd(self, gpu: str | None = None) -> float | None:
        p = self.gpu_hour if gpu is None else self.gpu_hour_for(gpu)
        return None if p is None else p.usd * self.hours_per_month

    def scaled(self, *, gpu: float = 1.0, dram: float = 1.0) -> Prices:
        """The same prices with the GPU and/or DRAM price multiplied (sensitivity)."""

        def mul(p: Price | None, f: float) -> Price | None:
            if p is None or f == 1.0:
                return p
            return replace(p, usd=p.usd * f, source=f"{p.source} x{f:g}")

        return replace(
            self,
            gpu_hour=mul(self.gpu_hour, gpu),
            dram_gb_month=mul(self.dram_gb_month, dram) or self.dram_gb_month,
            gpu_hours_by_gpu=tuple((g, mul(p, gpu) or p) for g, p in self.gpu_hours_by_gpu),
        )

    def used(self) -> tuple[PriceUsed, ...]:
        """Every price this analysis used, for the report (the GPU's even when missing)."""
        gpu = f"GPU ({self.gpu})"
        first = (
            PriceUsed(gpu, None, "GPU-hour", "no catalog price for this GPU: pass --gpu-hour-usd")
            if self.gpu_hour is None
            else PriceUsed.of(gpu, self.gpu_hour)
        )
        return (
            first,
            *(
                PriceUsed.of(what, p)
                for what, p in (
                    ("Host DRAM", self.dram_gb_month),
                    ("NVMe", self.nvme_tb_month),
                    ("Pool NIC", self.nic_node_month),
                    ("KV store servers (master, metadata)", self.store_month),
                )
            ),
        )


@dataclass(frozen=True, slots=True)
class PriceUsed:
    """One line of the report's price list: what was priced, at ``usd`` per ``unit``
    (``None``: not priced), and where the price came from."""

    what: str
    usd: float | None
    unit: str
    source: str
    date: str = ""

    @classmethod
    def of(cls, what: str, p: Price) -> PriceUsed:
        return cls(what, p.usd, p.unit, p.source, p.date)

    def to_json(self) -> dict[str, object]:
        return {
            "what": self.what,
            "usd": self.usd,
            "unit": self.unit,
            "source": self.source,
            "date": self.date,
        }


@dataclass(frozen=True, slots=True)
class PriceOverrides:
    """What the user set on the command line (``None``: keep the catalog's)."""

    prices_file: str | None = None
    gpu_hour_usd: float | None = None
    dram_gb_month_usd: float | None = None
    nvme_tb_month_usd: float | None = None
    nic_node_month_usd: float | None = None
    store_month_usd: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "gpu_hour_usd",
            "dram_gb_month_usd",
            "nvme_tb_month_usd",
            "nic_node_month_usd",
            "store_month_usd",
        ):
            v = getattr(self, name)
            if v is not None:
                # 1e308 x 730 hours is infinite: every figure would silently go unpriced
                limits.check(v, "price_usd", "--" + name.replace("_", "-"))


def prices_path() -> Path:
    return models_dir() / "prices.toml"


def _read(path: Path) -> dict[str, object]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(
            f"cannot read price file: {exc.strerror or exc}", Location(str(path))
        ) from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"invalid TOML: {exc}", Location(str(path))) from None


def _price(
    doc: dict[str, object], table: str, key: str, unit: str, path: Path, *, where: str | None = None
) -> Price | None:
    section = doc if where is None else doc.get("gpus")
    entry = section.get(table) if isinstance(section, dict) else None
    field = where or table
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise InputError("expected a table", Location(str(path), field=field))
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(
            f"expected a number in '{key}'", Location(str(path), field=f"{field}.{key}")
        )
    if why := limits.reason(value, "price_usd"):
        raise InputError(f"{value!r}: {why}", Location(str(path), field=f"{field}.{key}"))
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise InputError(
            "every price needs a 'source'", Location(str(path), field=f"{field}.source")
        )
    date = entry.get("date", "")
    return Price(float(value), unit, source.strip(), str(date))


def _load(path: Path) -> tuple[float, dict[str, Price], dict[str, Price | None]]:
    doc = _read(path)
    hours = doc.get("hours_per_month", HOURS_PER_MONTH)
    if why := limits.reason(hours, "hours_per_month"):
        raise InputError(f"{hours!r}: {why}", Location(str(path), field="hours_per_month"))
    assert isinstance(hours, int | float)  # in range, so a number
    gpus_doc = doc.get("gpus") or {}
    if not isinstance(gpus_doc, dict):
        raise InputError("expected a table", Location(str(path), field="gpus"))
    gpus: dict[str, Price] = {}
    for name in sorted(gpus_doc):
        p = _price(doc, name, "usd_per_gpu_hour", "GPU-hour", path, where=f"gpus.{name}")
        if p is not None:
            gpus[_gpu_id(name)] = p
    items = {
        "dram": _price(doc, "dram", "usd_per_gb_month", "GB-month", path),
        "nvme": _price(doc, "nvme", "usd_per_tb_month", "TB-month", path),
        "nic": _price(doc, "nic", "usd_per_node_month", "node-month", path),
        "store": _price(doc, "store", "usd_per_month", "month", path),
    }
    return float(hours), gpus, items


def _gpu_id(gpu: str) -> str:
    """The catalog's id of a GPU named as vendors and clouds write it (``H100-SXM``,
    ``NVIDIA H100 80GB HBM3`` -> ``h100``), so it finds its price; the name as given
    when the catalog does not know it."""

    return recognize_gpu(gpu) or gpu


def resolve_prices(gpu: str, overrides: PriceOverrides | None = None) -> Prices:
    """The catalog's prices, then the user's price file over them, then the flags."""
    o = overrides or PriceOverrides()
    gpu = _gpu_id(gpu)
    hours, gpus, items = _load(prices_path())
    if o.prices_file is not None:
        path = Path(o.prices_file)
        u_hours, u_gpus, u_items = _load(path)
        doc_hours = _read(path).get("hours_per_month")
        hours = u_hours if doc_hours is not None else hours
        gpus = {**gpus, **u_gpus}
        items = {k: (u_items[k] if u_items[k] is not None else v) for k, v in items.items()}
    missing = [k for k, v in items.items() if v is None]
    if missing:
        raise InputError(
            f"no price for {', '.join(missing)}", Location(str(o.prices_file or prices_path()))
        )

    def flag(value: float | None, unit: str, name: str, current: Price | None) -> Price | None:
        if value is None:
            return current
        return Price(float(value), unit, f"set by {name}", "")

    gpu_hour = flag(o.gpu_hour_usd, "GPU-hour", "--gpu-hour-usd", gpus.get(gpu))
    return Prices(
        gpu=gpu,
        gpu_hour=gpu_hour,
        dram_gb_month=flag(o.dram_gb_month_usd, "GB-month", "--dram-gb-month-usd", items["dram"]),  # type: ignore[arg-type]
        nvme_tb_month=flag(o.nvme_tb_month_usd, "TB-month", "--nvme-tb-month-usd", items["nvme"]),  # type: ignore[arg-type]
        nic_node_month=flag(
            o.nic_node_month_usd, "node-month", "--nic-node-month-usd", items["nic"]
        ),  # type: ignore[arg-type]
        store_month=flag(o.store_month_usd, "month", "--store-month-usd", items["store"]),  # type: ignore[arg-type]
        hours_per_month=hours,
        gpu_hours_by_gpu=tuple(sorted(gpus.items())),
    )
