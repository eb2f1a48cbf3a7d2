"""Many processes as one job: the launcher, the process group, Horovod, shards, and how the model is split.

- :mod:`~dlscale.distributed.launch_variables`: which launcher started this process and where it sits
  (:func:`detect`, :class:`DistEnv`), from torchrun's, Slurm's, MPI's or Horovod's variables;
- :mod:`~dlscale.distributed.process_group`: joining the job (:func:`init`), the rank helpers
  (:func:`rank`, :func:`group_size`, :func:`is_main`) and the collectives, on torch.distributed
  or Horovod behind the same calls;
- :mod:`~dlscale.distributed.ports`: free ports for a master or a daemon, outside the range outgoing connections
  take their source ports from;
- :mod:`~dlscale.distributed.horovod_backend`: Horovod's optimizer and first broadcast;
- :mod:`~dlscale.distributed.dtensors`: tensors that FSDP or tensor parallelism split (DTensors),
  their whole-tensor norms and clipping;
- :mod:`~dlscale.distributed.parallelize`: the parallel plan (DDP, Horovod, FSDP2, tensor
  parallelism on a 2-D mesh, a pipeline on a 3-D one) and the functions that apply it to the model;
- :mod:`~dlscale.distributed.pipeline`: the model cut into pipeline stages, and the schedule that runs them;
- :mod:`~dlscale.distributed.grad_sync`: the one object the training step asks to keep inner
  micro-batches local, synchronize, clip and step.

The names below are the ones callers use most (``from dlscale import distributed``;
``distributed.all_reduce_sum(t)``). Lessons 00, 05, 06 and 10 use them.
"""

from dlscale.distributed.launch_variables import (
    DEFAULT_PORT,
    DistEnv,
    DistributedError,
    PeerFailedError,
    detect,
    detect_launcher,
    expand_nodelist,
)
from dlscale.distributed.ports import free_port, free_ports
from dlscale.distributed.process_group import (
    all_gather,
    all_gather_object,
    all_reduce_max,
    all_reduce_max_flag,
    all_reduce_mean,
    all_reduce_sum,
    barrier,
    broadcast_object,
    collective_device,
    group_is_up,
    group_size,
    init,
    is_main,
    is_peer_failure,
    print0,
    rank,
    resolve_data_parallel,
    setup_waits,
    shutdown,
    uses_horovod,
)

__all__ = [
    "DEFAULT_PORT",
    "DistEnv",
    "DistributedError",
    "PeerFailedError",
    "all_gather",
    "all_gather_object",
    "all_reduce_max",
    "all_reduce_max_flag",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "collective_device",
    "detect",
    "detect_launcher",
    "expand_nodelist",
    "free_port",
    "free_ports",
    "group_is_up",
    "group_size",
    "init",
    "is_main",
    "is_peer_failure",
    "print0",
    "rank",
    "resolve_data_parallel",
    "setup_waits",
    "shutdown",
    "uses_horovod",
]
