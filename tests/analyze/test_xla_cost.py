"""The one wrapper around XLA's cost analysis: known FLOPs and bytes, probe modules, clear failures."""

from __future__ import annotations

import pytest

from libarena.analyze import xla_cost
from libarena.errors import ArenaError


def _lowered_matmul(m: int, k: int, n: int):
    import jax
    import jax.numpy as jnp

    spec = (jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((k, n), jnp.float32))
    return jax.jit(lambda a, b: a @ b).lower(*spec)


def test_matmul_has_two_m_n_k_flops_and_its_operand_bytes():
    m, k, n = 48, 32, 24
    lowered = _lowered_matmul(m, k, n)
    cost = xla_cost.module_cost(xla_cost.hlo_module_of(lowered))
    assert cost.flops == 2 * m * n * k
    assert cost.bytes_read == 4 * (m * k + k * n)
    assert cost.bytes_written == 4 * m * n
    assert cost.transcendentals == 0
    # The same numbers as JAX's public Lowered.cost_analysis() (which calls the same binding).
    public = lowered.cost_analysis()
    assert public["flops"] == cost.flops and public["bytes accessed"] == cost.bytes_accessed


def test_a_probe_module_gives_one_instructions_cost():
    probe = """HloModule probe

ENTRY %e {
  %p.0 = bf16[16,64]{1,0} parameter(0)
  %p.1 = bf16[64,8]{1,0} parameter(1)
  ROOT %d = bf16[16,8]{1,0} dot(bf16[16,64]{1,0} %p.0, bf16[64,8]{1,0} %p.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    cost = xla_cost.text_cost(probe)
    assert cost.flops == 2 * 16 * 64 * 8
    assert cost.bytes_read == 2 * (16 * 64 + 64 * 8) and cost.bytes_written == 2 * 16 * 8


def test_transcendentals_are_counted():
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(jnp.tanh).lower(jax.ShapeDtypeStruct((10, 10), jnp.float32))
    assert xla_cost.module_cost(xla_cost.hlo_module_of(lowered)).transcendentals == 100


def test_constants_and_parameters_cost_nothing_whatever_their_size():
    # Elided large constants are probed as scalars of their type; this is why that is exact.
    for root in ("f32[4]{0} constant({1, 2, 3, 4})", "f32[] constant(1)", "f32[1000]{0} parameter(0)"):
        cost = xla_cost.text_cost(f"HloModule m\n\nENTRY %e {{\n  ROOT %c = {root}\n}}\n")
        assert cost == xla_cost.InstructionCost()


def test_unparsable_hlo_is_a_one_line_arena_error():
    with pytest.raises(ArenaError, match="could not parse"):
        xla_cost.text_cost("HloModule m\n\nENTRY %e {\n  ROOT %c = f32[] nonsense(\n}\n")


def test_a_moved_private_api_is_a_clear_error(monkeypatch):
    from jax._src.lib import _jax

    monkeypatch.setattr(_jax, "hlo_module_cost_analysis", None, raising=False)
    xla_cost._private.cache_clear()
    try:
        with pytest.raises(ArenaError, match="hlo_module_cost_analysis"):
            xla_cost.text_cost("HloModule m\n\nENTRY %e {\n  ROOT %c = f32[] constant(1)\n}\n")
    finally:
        monkeypatch.undo()
        xla_cost._private.cache_clear()
    assert xla_cost.text_cost("HloModule m\n\nENTRY %e {\n  ROOT %c = f32[] constant(1)\n}\n").flops == 0
