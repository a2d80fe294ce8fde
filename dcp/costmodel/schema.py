"""Versions of the hardware profile file, and the migration of older ones.

Schema 2 (this one) prices every collective from bus-bandwidth curves keyed by group shape
(`collectives`) and attention per direction with a short-sequence term. A schema 1 profile (one
all-to-all table by group size, one all-reduce bandwidth, one attention rate) migrates: its
numbers become alpha-beta curves and equal forward/backward rates, so it prices exactly what it
priced before, and its fits are kept. Anything else fails with one line saying to re-run
`dcp profile`.
"""

from __future__ import annotations

import math
from typing import Any

from dcp.costmodel.spec import CostModelError

PROFILE_SCHEMA_VERSION = 2

_V1_COMM = ("a2a_latency_intra_s", "a2a_latency_inter_s", "a2a_bw_intra_bytes_per_s", "a2a_bw_inter_bytes_per_s",
            "allreduce_bw_bytes_per_s")


def migrate(d: dict[str, Any]) -> dict[str, Any]:
    """The profile dict in the current schema (a copy when migrated)."""
    version = d.get("schema_version")
    if version == PROFILE_SCHEMA_VERSION:
        return d
    if version == 1:
        return _from_v1(d)
    raise CostModelError(f"hardware profile schema_version {version!r} is not supported "
                         f"(expected {PROFILE_SCHEMA_VERSION}); re-run `dcp profile`")


def _from_v1(d: dict[str, Any]) -> dict[str, Any]:
    try:
        d = dict(d)
        g = int(d["gpus_per_node"])
        lat_intra, lat_inter = float(d.pop("a2a_latency_intra_s")), float(d.pop("a2a_latency_inter_s"))
        intra, inter = d.pop("a2a_bw_intra_bytes_per_s"), d.pop("a2a_bw_inter_bytes_per_s")
        allreduce = float(d.pop("allreduce_bw_bytes_per_s"))
        attention = float(d.pop("attention_flops"))
    except (KeyError, TypeError, ValueError) as e:
        raise CostModelError(f"hardware profile {d.get('name', '?')!r} (schema 1): malformed field ({e}); "
                             "re-run `dcp profile`") from e
    note = "migrated from a schema 1 profile"
    curves: list[dict[str, Any]] = []
    for p, bw in sorted((int(k), float(v)) for k, v in intra.items()):
        if 2 <= p <= g:
            curves.append({"op": "all_to_all", "gpus_per_node": p, "nodes": 1, "latency_s": lat_intra,
                           "bus_bw_bytes_per_s": bw, "source": f"{note}: a2a_bw_intra_bytes_per_s[{p}]"})
    for p, bw in sorted((int(k), float(v)) for k, v in inter.items()):
        if p > g:
            curves.append({"op": "all_to_all", "gpus_per_node": g, "nodes": math.ceil(p / g), "latency_s": lat_inter,
                           "bus_bw_bytes_per_s": bw, "source": f"{note}: a2a_bw_inter_bytes_per_s[{p}]"})
    if not any(c["op"] == "all_to_all" for c in curves):  # one-GPU nodes: the inter table is all there is
        curves += [{"op": "all_to_all", "gpus_per_node": max(g, 2), "nodes": 1, "latency_s": lat_intra,
                    "bus_bw_bytes_per_s": float(min(inter.values(), default=allreduce)), "source": note}]
    # Schema 1 priced the gradient all-reduce and ZeRO-3's gathers at one bandwidth.
    for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        for nodes, lat in ((1, lat_intra), (2, lat_inter)):
            if g * nodes >= 2:
                curves.append({"op": op, "gpus_per_node": g, "nodes": nodes, "latency_s": lat,
                               "bus_bw_bytes_per_s": allreduce, "source": f"{note}: allreduce_bw_bytes_per_s"})
    sources = {k: v for k, v in d.get("sources", {}).items() if k not in (*_V1_COMM, "attention_flops")}
    sources["collectives"] = f"{note} (all-to-all table and all-reduce bandwidth as alpha-beta curves)"
    sources["attention_fwd_flops"] = sources["attention_bwd_flops"] = f"{note}: its one attention_flops"
    sources["kernel_launch_s"] = f"{note}: not measured (0)"
    meta = dict(d.get("meta", {}))
    meta["migrated_from_schema"] = 1
    return {**d, "schema_version": PROFILE_SCHEMA_VERSION, "collectives": curves, "attention_fwd_flops": attention,
            "attention_bwd_flops": attention, "attention_backend": meta.get("attention_kernel") or "",
            "kernel_launch_s": 0.0, "sources": sources, "meta": meta}
