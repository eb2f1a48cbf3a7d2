"""Checkpoints that are never half-written and resume a run exactly, in whichever format the layout needs.

- :mod:`~dlscale.checkpoint.store`: names, listing, clearing, fsynced writes renamed into place;
- :mod:`~dlscale.checkpoint.state`: what a training checkpoint holds beside the weights
  (schedule, scaler, every random generator, the position in the data, the config);
- :mod:`~dlscale.checkpoint.whole`: one file with the whole model (one process, DDP, Horovod);
- :mod:`~dlscale.checkpoint.sharded`: a folder of every rank's shards through
  ``torch.distributed.checkpoint`` (FSDP, tensor parallelism), loadable into any layout;
- :mod:`~dlscale.checkpoint.formats`: the one place that chooses between the two, to save,
  resume (:func:`load_latest_checkpoint`) or read a whole model (:func:`load_model`);
- :mod:`~dlscale.checkpoint.export`: ``dlscale export``, that whole model as one file, written as a checkpoint is.

Lessons 09 (requeue) and 10 (sharded checkpoints) use them; the training loop calls them.
"""

from dlscale.checkpoint.formats import load_latest_checkpoint, load_model, save_training_checkpoint
from dlscale.checkpoint.state import restore_training, rng_state, set_rng_state, training_extras, training_state
from dlscale.checkpoint.store import (
    CheckpointError,
    check_writable,
    checkpoint_dir,
    clear_checkpoints,
    list_checkpoints,
    remove_checkpoint,
    step_of,
)
from dlscale.checkpoint.whole import save_checkpoint

__all__ = [
    "CheckpointError",
    "check_writable",
    "checkpoint_dir",
    "clear_checkpoints",
    "list_checkpoints",
    "load_latest_checkpoint",
    "load_model",
    "remove_checkpoint",
    "restore_training",
    "rng_state",
    "save_checkpoint",
    "save_training_checkpoint",
    "set_rng_state",
    "step_of",
    "training_extras",
    "training_state",
]
