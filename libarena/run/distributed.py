"""Multi-process (multi-host) JAX for the executor: one process per host, joined by
``jax.distributed.initialize`` into one runtime whose ``jax.devices()`` are every host's devices
(sorted by process, so host h holds the job's devices [h*d, (h+1)*d)).

Every process runs the same executor code over the global device list (multi-controller SPMD):
a stage's jitted functions execute on the processes owning the stage's devices and are no-ops
elsewhere; collectives inside a stage that spans hosts go through XLA's CPU collectives (gloo on
CPU, NCCL on GPUs). What needs help is data that crosses processes outside a jitted function:

* host arrays onto a sharding: ``make_array_from_callback`` (each process places its own shards;
  ``device_put`` would add a cross-process equality check per call);
* activations and their gradients between stage meshes on different processes: ``device_put`` only
  moves arrays between equally sized, process-disjoint device lists with the same layout, so
  :func:`transfer` relays through single-device copies (replicate inside the source stage, one
  cross-process copy per destination process, replicate locally, re-shard inside the destination);
  the cross-process copies need JAX's socket transfer server (``cross_host_transfer_socket_address``);
* values every process needs (the loss, checkpointed state, per-stage measurements): broadcast or
  gathered with ``jax.experimental.multihost_utils``.

In a single process every helper reduces to the plain ``jax.device_put`` / ``device_get``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ProcessGroup:
    """Where one host process joins the job's JAX runtime (plain data: built by the Ray driver)."""

    coordinator_address: str
    num_processes: int
    process_id: int
    #: host:port this process's cross-host transfer server listens on.
    transfer_address: str
    initialization_timeout_s: int = 120


def initialize(group: ProcessGroup) -> None:
    """Join the multi-process runtime (before any other JAX call in this process)."""
    import jax

    host = group.transfer_address.rsplit(":", 1)[0]
    jax.config.update("jax_cross_host_transfer_socket_address", group.transfer_address)
    jax.config.update("jax_cross_host_transport_addresses", f"{host}:0")
    jax.distributed.initialize(group.coordinator_address, num_processes=group.num_processes, process_id=group.process_id,
                               initialization_timeout=group.initialization_timeout_s)


def free_port(host: str = "") -> int:
    """A TCP port free on this host now (the coordinator and transfer servers bind it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def multi_process() -> bool:
    import jax

    return jax.process_count() > 1


def processes_of(devices: Sequence[Any]) -> tuple[int, ...]:
    return tuple(sorted({d.process_index for d in devices}))


def _placeholder(shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
    """This process's handle of an array living only on other processes' devices."""
    import jax

    return jax.make_array_from_callback(shape, sharding, lambda index: np.zeros(shape, dtype)[index], dtype=dtype)


def place(value: Any, sharding: Any) -> Any:
    """A host value (every process holds the same one) as a global array with ``sharding``."""
    import jax

    if not multi_process():
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index], dtype=host.dtype)


def place_tree(tree: Any, shardings: Any) -> Any:
    import jax

    if not multi_process():
        return jax.device_put(tree, shardings)
    return jax.tree.map(place, tree, shardings)


_RESHARD: dict[Any, Any] = {}


def reshard(x: Any, sharding: Any) -> Any:
    """``x`` re-laid out as ``sharding`` over the same devices (a jitted identity; collective where
    the devices span processes, a no-op on processes owning none of them)."""
    import jax

    fn = _RESHARD.get(sharding)
    if fn is None:
        fn = _RESHARD[sharding] = jax.jit(lambda a: a, out_shardings=sharding)
    return fn(x)


def transfer(x: Any, source_mesh: Any, target: Any) -> Any:
    """Move ``x`` (laid out on ``source_mesh``) to the NamedSharding ``target`` of another stage."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    source_devices = list(source_mesh.devices.flat)
    target_devices = list(target.mesh.devices.flat)
    involved = set(processes_of(source_devices)) | set(processes_of(target_devices))
    me = jax.process_index()
    if len(involved) == 1:  # both stages on one process: an ordinary device-to-device copy there
        return jax.device_put(x, target) if me in involved else _placeholder(x.shape, x.dtype, target)
    replicated = reshard(x, NamedSharding(source_mesh, PartitionSpec()))
    source_processes = processes_of(source_devices)
    local: list[Any] = []
    relayed = 0
    for p in processes_of(target_devices):
        mine = [d for d in target_devices if d.process_index == p]
        if p in source_processes:
            if me == p:  # the full value is already on one of this process's source devices
                base = replicated.addressable_shards[0].data
                local = [jax.device_put(base, d) for d in mine]
            continue
        # One cross-process copy per destination process, spread over the source devices.
        sender = source_devices[relayed % len(source_devices)]
        relayed += 1
        if me == sender.process_index:
            one = next(s.data for s in replicated.addressable_shards if s.device == sender)
            jax.device_put(one, SingleDeviceSharding(mine[0]))
        elif me == p:
            one = _placeholder(x.shape, x.dtype, SingleDeviceSharding(sender))
            received = jax.device_put(one, SingleDeviceSharding(mine[0]))
            local = [received] + [jax.device_put(received, d) for d in mine[1:]]
    target_replicated = NamedSharding(target.mesh, PartitionSpec())
    if me in processes_of(target_devices):
        arrived = jax.make_array_from_single_device_arrays(x.shape, target_replicated, local)
    else:
        arrived = _placeholder(x.shape, x.dtype, target_replicated)
    return reshard(arrived, target)


def fetch_tree(tree: Any, mesh: Any) -> Any:
    """Host (numpy) copy of a tree of arrays laid out on ``mesh``, on every process."""
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    if not multi_process():
        return jax.device_get(tree)
    replicated = reshard(tree, NamedSharding(mesh, PartitionSpec()))
    owner = min(processes_of(list(mesh.devices.flat)))
    me = jax.process_index()
    local = jax.tree.map(lambda a: np.asarray(a.addressable_shards[0].data) if me == owner else np.zeros(a.shape, a.dtype), replicated)
    return multihost_utils.broadcast_one_to_all(local, is_source=me == owner)


def fetch_scalars(values: Sequence[Any], mesh: Any) -> list[float]:
    """Python floats of scalar arrays replicated on ``mesh`` (broadcast from the mesh's owner)."""
    import jax

    if not multi_process():
        # one device_get starts every copy before waiting on any: one transfer latency, not one per value
        return [float(v) for v in jax.device_get(list(values))]
    from jax.experimental import multihost_utils

    owner = min(processes_of(list(mesh.devices.flat)))
    me = jax.process_index()
    local = np.array([float(v.addressable_shards[0].data) if me == owner else 0.0 for v in values], np.float64)
    return [float(v) for v in multihost_utils.broadcast_one_to_all(local, is_source=me == owner)]


def max_over_processes(values: Sequence[float], dtype: Any = np.float64) -> list:
    """Element-wise maximum of a per-process vector over all processes (identity in one process)."""
    if not multi_process():
        return list(values)
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(values, dtype))
    return np.max(np.asarray(gathered).reshape(-1, len(values)), axis=0).tolist()


def gather_over_processes(value: int) -> list[int]:
    """Every process's ``value``, in process order (``[value]`` in one process): what a job's processes must agree
    on, compared by each of them (a collective: every process calls it)."""
    if not multi_process():
        return [int(value)]
    from jax.experimental import multihost_utils

    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.asarray([value], np.int64))).reshape(-1)]


def process_index() -> int:
    import jax

    return jax.process_index()
