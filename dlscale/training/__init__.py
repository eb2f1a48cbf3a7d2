"""The one training loop: ``train(cfg) -> Result``.

- :mod:`~dlscale.training.setup`: the checks, then the :class:`~dlscale.training.setup.Run`
  (data, model, parallel plan, optimizer, schedule, precision, resume);
- :mod:`~dlscale.training.step`: ``train_step``, one optimizer step over its micro-batches;
- :mod:`~dlscale.training.passes`: one micro-batch's forward and backward, through the whole model or a
  pipeline's schedule (what the step calls, ``run.forward_backward``);
- :mod:`~dlscale.training.loop`: ``train`` and ``train_quietly``: setup, a short loop around the
  step (log, validate, checkpoint, stop on a signal), finish;
- :mod:`~dlscale.training.result`: what a run returns; :mod:`~dlscale.training.preemption`: the
  stop on SIGTERM/SIGUSR1.

Users import it as ``from dlscale.train import train`` (see :mod:`dlscale.train`).
"""
