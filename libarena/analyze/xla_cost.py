"""The one wrapper around XLA's HLO cost analysis (and the few private jaxlib HLO helpers it needs).

XLA's ``HloCostAnalysis`` computes FLOPs, transcendentals and bytes accessed for every instruction, but
jaxlib 0.10 exposes it only as ``jax._src.lib._jax.hlo_module_cost_analysis(client, HloModule) -> dict``:
module-level totals (the same function ``jax.stages.Lowered.cost_analysis()`` calls). The dict holds
``flops``, ``transcendentals``, ``bytes accessed``, ``bytes accessedout{}`` (bytes written: outputs),
``bytes accessed{i}{}`` / ``utilization{i}{}`` (per operand position, summed over the module); keys whose
value is zero are left out (a parameter or a constant costs ``{}``).

Per-instruction costs therefore come from *probe modules*: one instruction whose operands become entry
parameters (which XLA charges nothing), plus the computations it calls (reduce bodies and the like,
which XLA charges to the calling instruction). The module-level cost of a probe is exactly XLA's cost of
that instruction, so the per-instruction numbers sum to the module's ``cost_analysis()`` (to within about
1e-6: the module's own count of a called body varies slightly between its call sites).

Everything private is reached from this module only; if jaxlib moves it, callers get one clear
:class:`ArenaError` naming what is missing instead of an AttributeError deep in a stack.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from libarena.errors import ArenaError

FLOPS = "flops"
TRANSCENDENTALS = "transcendentals"
BYTES_ACCESSED = "bytes accessed"
BYTES_WRITTEN = "bytes accessedout{}"


@dataclass(frozen=True)
class InstructionCost:
    """XLA's cost of one instruction (or a whole module)."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0

    @property
    def bytes_accessed(self) -> float:
        return self.bytes_read + self.bytes_written

    @classmethod
    def from_properties(cls, props: dict[str, float]) -> InstructionCost:
        accessed = float(props.get(BYTES_ACCESSED, 0.0))
        written = float(props.get(BYTES_WRITTEN, 0.0))
        return cls(
            flops=float(props.get(FLOPS, 0.0)),
            transcendentals=float(props.get(TRANSCENDENTALS, 0.0)),
            bytes_read=max(accessed - written, 0.0),
            bytes_written=written,
        )


def _api_changed(what: str, exc: BaseException | None = None) -> ArenaError:
    detail = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
    return ArenaError(
        f"this jax/jaxlib no longer provides {what}, which arena-analyze needs for XLA's cost analysis "
        f"(tested with jax 0.10.2){detail}"
    )


@functools.lru_cache(maxsize=1)
def _private() -> tuple[Any, Any, Any]:
    """(hlo_module_cost_analysis, jaxlib._hlo module, CPU client), resolved once."""
    try:
        from jax._src.lib import _jax  # private: the binding Lowered.cost_analysis() uses
    except ImportError as exc:
        raise _api_changed("jax._src.lib._jax", exc) from None
    analysis = getattr(_jax, "hlo_module_cost_analysis", None)
    if not callable(analysis):
        raise _api_changed("jax._src.lib._jax.hlo_module_cost_analysis")
    try:
        from jaxlib import _hlo
    except ImportError as exc:
        raise _api_changed("jaxlib._hlo", exc) from None
    for name in ("hlo_module_from_text", "HloPrintOptions", "HloModule"):
        if not hasattr(_hlo, name):
            raise _api_changed(f"jaxlib._hlo.{name}")
    try:
        import jax.extend as jex

        # Costs are a property of the HLO, not of the device; the CPU client is always there.
        client = jex.backend.get_backend("cpu")
    except Exception as exc:  # noqa: BLE001 - any failure here means the API moved
        raise _api_changed("jax.extend.backend.get_backend('cpu')", exc) from None
    return analysis, _hlo, client


def module_properties(hlo_module: Any) -> dict[str, float]:
    """XLA's raw cost-analysis dict of an ``HloModule`` (module-level totals)."""
    analysis, _, client = _private()
    try:
        props = analysis(client, hlo_module)
    except TypeError as exc:  # signature changed
        raise _api_changed("hlo_module_cost_analysis(client, HloModule)", exc) from None
    if not isinstance(props, dict):
        raise _api_changed("a dict from hlo_module_cost_analysis")
    return {str(k): float(v) for k, v in props.items()}


def module_cost(hlo_module: Any) -> InstructionCost:
    return InstructionCost.from_properties(module_properties(hlo_module))


def parse_hlo_text(text: str) -> Any:
    """HLO text -> ``HloModule`` (XLA's own parser)."""
    _, hlo, _ = _private()
    try:
        return hlo.hlo_module_from_text(text)
    except Exception as exc:  # noqa: BLE001 - XLA raises JaxRuntimeError/XlaRuntimeError by version
        first = str(exc).strip().splitlines()
        raise ArenaError(f"XLA could not parse an HLO module: {first[0] if first else type(exc).__name__}") from None


def text_cost(text: str) -> InstructionCost:
    """Module-level cost of an HLO module given as text (a probe module: one instruction's cost)."""
    return module_cost(parse_hlo_text(text))


def hlo_module_of(lowered: Any) -> Any:
    """The unoptimized ``HloModule`` of a ``jax.stages.Lowered`` (StableHLO converted by XLA)."""
    try:
        return lowered.compiler_ir("hlo").as_hlo_module()
    except AttributeError as exc:
        raise _api_changed("Lowered.compiler_ir('hlo').as_hlo_module()", exc) from None


def module_text(hlo_module: Any) -> str:
    """Text of a module with what the operator table needs: operand shapes inline and op metadata
    (named scopes); large constants are elided (``{...}``) so their values are never printed."""
    _, hlo, _ = _private()
    options = hlo.HloPrintOptions()
    try:
        options.print_operand_shape = True
        options.print_metadata = True
        options.print_large_constants = False
        options.print_backend_config = True
        options.include_layout_in_shapes = True
    except AttributeError as exc:
        raise _api_changed("HloPrintOptions fields", exc) from None
    return hlo_module.to_string(options)
