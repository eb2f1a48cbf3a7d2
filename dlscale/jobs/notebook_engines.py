"""Notebook-driven ranks: run one data-parallel job on ipyparallel engines and gather the results.

In a notebook there is no ``torchrun`` in front of the kernel. :func:`run_on_engines`
starts N ipyparallel engines (local processes on a laptop or a login node; MPI engines with
``engines="mpi"``; Slurm engines on compute nodes with ``engines="slurm"``), gives each the
environment of one rank — the same variables torchrun sets — calls the function on all of
them at once, and returns the per-rank results in rank order. Lesson 05 uses it::

    from dlscale.jobs.notebook_engines import run_on_engines
    from dlscale.train import train
    results = run_on_engines(train, 2, "tiny", epochs=1)     # results[0] is rank 0's Result

The engines stay up for the next call of the same shape (or fewer engines) from the same folder (a lesson's
next cell starts at once instead of after the seconds that starting a controller and N
Pythons with torch take); each call gets a fresh port and leaves no process group behind.
They stop when the kernel exits, with :func:`stop_engines`, when a call of another shape or
from another folder starts its own, and at once when a call fails (the error names the
rank): a rank that failed may have left its peers inside a collective. Kept engines that do not answer a call
within :data:`KEPT_ANSWER_S` are stopped and a fresh set runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dlscale.errors import DlscaleError, import_optional
from dlscale.jobs.engine_watchdog import watch

_RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DLSCALE_LAUNCHER",
    "DLSCALE_SPARE_PORTS",
)

#: Ports besides MASTER_PORT that the ranks of one call share: for the further process groups a call makes (a stage
#: run again at its other settings: on the first one's port, a store that the first group left alive would serve
#: stale keys) and, the last, for the ranks to agree without a group (dlscale.lessons.stage_probes)
SPARE_PORTS = 8


class _NoCleanupRace(logging.Filter):
    """Drop ipyparallel's "Failed to remove <engine log>" errors.

    When a cluster stops, two of ipyparallel's threads may both delete an engine's log file; the
    second finds it gone and logs an ERROR into the notebook although nothing went wrong.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to remove")


class EngineError(DlscaleError):
    """The engines could not start, or a rank failed; the message names the rank and its error."""


def _engine_facts() -> tuple[str, list[int], int]:
    """Run on an engine: its hostname, free TCP ports there (the master's and :data:`SPARE_PORTS` more), which it
    holds until the call ends (:func:`dlscale.distributed.ports.hold_ports`: the last of them listens up to a
    minute later), and its process id (which names the file of its stacks, :data:`STACKS`)."""
    from dlscale.distributed.ports import hold_ports, release_ports  # (this runs on the engine, which imports it)

    release_ports()  # (those of a call that never came)
    return socket.gethostname(), hold_ports(1 + SPARE_PORTS, ""), os.getpid()


#: Where an engine writes the stacks of its threads when a call outlasts its time (the caller's folder's runs/)
STACKS = "runs/engines/engine-{id}-stacks.txt"


def _run_as_rank(
    environment: dict[str, str], function: Callable, args: tuple, kwargs: dict, stacks_after: float | None = None
) -> Any:
    """Run on an engine: ``function(*args, **kwargs)`` with the rank's variables set for the call only. After
    ``stacks_after`` seconds the engine writes where each of its threads is to :data:`STACKS` (the call goes on:
    the caller, about to give up, reads the file and names the line it waits in)."""
    import faulthandler
    import threading

    saved = {name: os.environ.get(name) for name in _RANK_VARIABLES}
    os.environ.update(environment)
    stacks = None
    if stacks_after is not None:
        path = STACKS.format(id=os.getpid())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        stacks = open(path, "w")  # noqa: SIM115 - open while faulthandler may write to it; closed below
        stacks.write(f"call thread 0x{threading.get_ident():x}\n")
        stacks.flush()
        faulthandler.dump_traceback_later(stacks_after, file=stacks)
    try:
        return function(*args, **kwargs)
    finally:
        from dlscale.distributed.ports import release_ports

        release_ports()  # (the ports :func:`_engine_facts` chose for this call)
        if stacks is not None:  # (the call ended: no one will read where it waited)
            faulthandler.cancel_dump_traceback_later()
            stacks.close()
            with contextlib.suppress(OSError):
                os.remove(stacks.name)
                os.rmdir(os.path.dirname(stacks.name))  # (only when no other engine's file is there)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _where_it_waits(path: str, frames: int = 3) -> str:
    """From a stacks file an engine wrote (:func:`_run_as_rank`): the innermost ``frames`` lines of the call's
    thread, innermost first ("" when the file is missing or holds no dump)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ""
    if not lines or not lines[0].startswith("call thread 0x"):
        return ""
    ident = int(lines[0].split("0x")[1], 16)
    found, frames_seen = False, []
    for line in lines[1:]:
        header = re.match(r"(?:Current thread|Thread) 0x([0-9a-f]+)", line)
        if header:
            found = int(header[1], 16) == ident
        elif found and line.strip().startswith("File "):
            frames_seen.append(line.strip())
    return " < ".join(frames_seen[:frames])


def run_file(path: str, function: str = "main", /, **kwargs: Any) -> Any:
    """``function(**kwargs)`` of the Python file at ``path``, loaded afresh: a recipe script on the engines,
    as in ``run_on_engines(run_file, 2, "recipes/05_ddp.py", epochs=1)`` (its ``__main__`` block does not run)."""
    return load_file(path)[function](**kwargs)


def load_file(path: str) -> dict[str, Any]:
    """The names a Python file defines, loaded afresh with its folder importable, as python does for a script (the
    stages import training_tools beside them); its ``__main__`` block does not run."""
    import runpy
    import sys

    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return runpy.run_path(str(path), run_name="recipe")


def train_rank(config: Any, **overrides: Any) -> dict[str, Any]:
    """``dlscale.train`` on an engine, returning what travels back: the run folder, the final validation
    metrics and the applied settings (a sharded model does not: read its checkpoint with ``load_model``)."""
    from dlscale.training.loop import train

    result = train(config, **overrides)
    return {"run_dir": str(result.run_dir), "r2": result.final.get("r2"), "applied": result.applied}


def rank_environments(hosts: list[str], master_port: int, spare_ports: Sequence[int] = ()) -> list[dict[str, str]]:
    """torchrun's variables for each engine, given the host each engine runs on (engine order = rank order), and
    ``DLSCALE_SPARE_PORTS``: ports on rank 0's host for the call's further groups (:data:`SPARE_PORTS`)."""
    environments = []
    for rank, host in enumerate(hosts):
        same_host = [i for i, h in enumerate(hosts) if h == host]
        environments.append(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(len(hosts)),
                "LOCAL_RANK": str(same_host.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(same_host)),
                "MASTER_ADDR": hosts[0] if len(set(hosts)) > 1 else "127.0.0.1",
                "MASTER_PORT": str(master_port),
                "DLSCALE_LAUNCHER": "ipyparallel",
                "DLSCALE_SPARE_PORTS": ",".join(map(str, spare_ports)),
            }
        )
    return environments


#: The one set of engines kept up between calls: its key (n, engines, cluster options, folder), the
#: ipyparallel cluster and its client. The folder is part of the key because an engine resolves the
#: caller's modules (a function defined in a test or a notebook's package) from the folder it started in.
_kept: tuple[str, Any, Any] | None = None


def _start(ipp: Any, n: int, options: dict) -> tuple[Any, Any]:
    cluster = ipp.Cluster(**options)
    cluster.log.addFilter(_NoCleanupRace())
    try:
        client = cluster.start_and_connect_sync(n=n)
        if len(client.ids) < n:
            raise EngineError(f"only {len(client.ids)} of {n} engines came up")
    except BaseException:
        _stop(cluster)
        raise
    if options["engines"] == "local":  # (processes here: a kernel killed instead of exiting would leave them)
        watch(os.getpid(), _local_sessions(cluster), cluster.cluster_file)
    return cluster, client


def _local_sessions(cluster: Any) -> list[int]:
    """The process sessions of a local cluster's controller and engines (ipyparallel starts each in its own)."""
    launchers = [
        cluster.controller,
        *(
            engine
            for engine_set in cluster.engines.values()
            for engine in getattr(engine_set, "launchers", {}).values()
        ),
    ]
    return [
        launcher.pid for launcher in launchers if isinstance(getattr(launcher, "pid", None), int) and launcher.pid > 0
    ]


def _stop(cluster: Any) -> None:
    """Stop the cluster's controller and engines, and remove its file (``cluster-<id>.json`` in the profile's
    security folder), even when the stop fails: a file left there names a "running" cluster that is gone."""
    try:
        cluster.stop_cluster_sync()
    finally:
        cluster.remove_cluster_file()


def stop_engines() -> None:
    """Stop the engines that :func:`run_on_engines` keeps up (the kernel's exit stops them too)."""
    global _kept
    if _kept is not None:
        cluster, _kept = _kept[1], None
        _stop(cluster)


#: Seconds the engines get to leave a process group the call left up (a barrier and a destroy: well under a second)
LEAVE_TIMEOUT_S = 60


def _leave_no_group() -> None:
    """Run on an engine after each call: a process group the function left up would refuse the next call's.

    Left by the engine's own :func:`dlscale.distributed.shutdown` (a barrier and a pause before destroying it):
    destroyed at once, just after its set-up or its last collective, gloo's teardown once hung an engine (CI,
    docs/benchmarks.md).
    """
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        from dlscale.distributed import shutdown

        shutdown()


def run_on_engines(
    function: Callable,
    n: int = 2,
    *args: Any,
    engines: str = "local",
    timeout: float | None = 900,
    cluster_options: dict | None = None,
    as_ranks: bool = True,
    show: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Call ``function(*args, **kwargs)`` on ``n`` engines as ranks 0..n-1 of one job; return the results.

    With ``show``, what rank 0 prints appears here as it comes (a cell that trains on the engines shows its
    lines: the loss and samples/s of each block, each epoch's validation), not only when every rank is done.

    ``as_ranks=False`` calls it on each engine as a process of its own (no rank variables): workers
    of a search, each training its own trials.
    ``engines`` is ipyparallel's engine launcher: ``local``, ``mpi`` or ``slurm`` (with Slurm the
    controller listens on all interfaces so engines on compute nodes can reach it).
    ``cluster_options`` go to :class:`ipyparallel.Cluster` (e.g. Slurm's account and time).
    The engines stay up for the next call with as many engines or fewer, the same ``engines`` and options,
    from the same folder, until a call fails, another set starts, or :func:`stop_engines`.
    Each engine holds the ports it chose until the call ends (:func:`dlscale.distributed.ports.hold_ports`; rank 0's
    are the call's ``MASTER_PORT`` and spare ports): a listener on them sets ``SO_REUSEADDR``, as torch's stores do.
    """
    ipp = import_optional("ipyparallel", "notebooks", "notebook-driven ranks", EngineError)
    options = {"n": n, "engines": engines, "log_level": 40, **(cluster_options or {})}
    if engines == "slurm":
        options.setdefault("controller_ip", "*")
    global _kept
    # (a kept set of more engines serves a smaller job too: its first n engines take part, the rest wait)
    key = repr((sorted((k, v) for k, v in options.items() if k != "n"), os.getcwd()))
    cluster, client, facts = _answering_engines(ipp, n, options, key)
    try:
        results, left_their_group = _run_job(ipp, client, n, facts, function, args, kwargs, timeout, as_ranks, show)
    except BaseException:
        _stop(cluster)
        raise
    if left_their_group:
        _kept = key, cluster, client
    else:  # (engines still in the job's process group would hold the next call's first answer until it gives up)
        _stop(cluster)
    return results


def _answering_engines(ipp: Any, n: int, options: dict, key: str) -> tuple[Any, Any, list]:
    """A cluster of at least ``n`` engines, its client and the first ``n`` engines' answers (:func:`_ask_facts`):
    the kept set when it has ``key`` and answers within :data:`KEPT_ANSWER_S`, else a fresh one."""
    global _kept
    if _kept is not None and _kept[0] == key and len(_kept[2].ids) >= n:  # (fewer: an engine died since)
        (_, cluster, client), _kept = _kept, None
        facts = _ask_facts(ipp, client, n, KEPT_ANSWER_S)
        if facts is not None:
            return cluster, client, facts
        with contextlib.suppress(Exception):  # (its controller or an engine gone since: stopped as far as it can be)
            _stop(cluster)
    else:
        stop_engines()  # another shape's or another folder's: one set at a time
    cluster, client = _start(ipp, n, options)
    try:
        facts = _ask_facts(ipp, client, n, ANSWER_TIMEOUT_S)
    except BaseException:
        _stop(cluster)
        raise
    if facts is None:
        _stop(cluster)
        raise EngineError(
            f"the engines did not answer within {ANSWER_TIMEOUT_S} s (stopped: the next call starts new ones)"
        )
    return cluster, client, facts


def _relay(task: Any, deadline: float | None) -> None:
    """Print what ``task`` (one engine's call) prints while it runs, as it arrives, until it ends or ``deadline``."""
    seen = 0
    while True:
        task.wait(0.5)
        done = task.ready() or (deadline is not None and time.monotonic() > deadline)
        text = task.stdout or ""
        if len(text) > seen:
            print(text[seen:], end="", flush=True)
            seen = len(text)
        if done:
            return


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


#: Seconds before a call's time is up at which its engines write their stacks (one dump is quick; a busy engine
#: takes a moment to be scheduled)
STACKS_BEFORE_S = 5.0
#: How long fresh engines may take to answer their first call (its imports), apart from the job's own timeout.
ANSWER_TIMEOUT_S = 300
#: How long engines kept from the last call may take to answer (their imports done: a second on a busy machine).
#: A kept set that does not is stopped and a fresh one started: once in a fresh-clone run kept engines never
#: answered, and the call waited :data:`ANSWER_TIMEOUT_S` for them.
KEPT_ANSWER_S = 30


def _ask_facts(ipp: Any, client: Any, n: int, timeout: float) -> list | None:
    """Each of the first ``n`` engines' :func:`_engine_facts`, or None when they do not all answer within
    ``timeout`` seconds (or have left the controller): nothing of the job has run on them yet."""
    try:
        return client[sorted(client.ids)[:n]].apply_async(_engine_facts).get(timeout=timeout)
    except (ipp.error.TimeoutError, ipp.error.NoEnginesRegistered, OSError):
        return None


def _run_job(
    ipp: Any,
    client: Any,
    n: int,
    facts: list,
    function: Callable,
    args: tuple,
    kwargs: dict,
    timeout: float | None,
    as_ranks: bool = True,
    show: bool = False,
) -> tuple[list[Any], bool]:
    """The job on the first ``n`` engines of ``client``, whose :func:`_engine_facts` are ``facts``: the rank
    variables, the call, the results or one error; and whether the engines then left the job's process group (engines
    that did not are not kept for the next call). ``timeout`` bounds the call from when the engines have answered
    (:func:`_ask_facts`); a rank still running then is named with the line it waits in."""
    ids = sorted(client.ids)[:n]
    deadline = None if timeout is None else time.monotonic() + timeout
    if as_ranks:
        ports = facts[0][1]
        environments = rank_environments([host for host, _, _ in facts], ports[0], ports[1:])
    else:
        environments = [{"DLSCALE_LAUNCHER": "single"}] * n
    stacks_after = None if timeout is None else max(1.0, _left(deadline) - min(STACKS_BEFORE_S, timeout / 10))
    pending = [
        client[engine].apply_async(_run_as_rank, environment, function, args, kwargs, stacks_after)
        for engine, environment in zip(ids, environments)
    ]
    if show:
        _relay(pending[0], deadline)
    results, failures = [], []
    for rank, task in enumerate(pending):
        who = f"{'rank' if as_ranks else 'engine'} {rank}"
        try:
            results.append(task.get(timeout=_left(deadline)))
        except ipp.error.RemoteError as err:
            failures.append(f"{who}: {err.ename}: {err.evalue}")
            results.append(None)
        except ipp.error.TimeoutError:
            where = _where_it_waits(STACKS.format(id=facts[rank][2]))
            failures.append(f"{who}: no result after {timeout:g} s" + (f", waiting in {where}" if where else ""))
            results.append(None)
    if failures:
        raise EngineError("the job failed on " + "; ".join(failures))
    try:
        client[ids].apply_async(_leave_no_group).get(timeout=LEAVE_TIMEOUT_S)
    except (ipp.error.TimeoutError, ipp.error.RemoteError) as err:
        # Every rank has answered: keep the answers, and let the next call start engines that hold no group.
        warnings.warn(
            f"run_on_engines: the engines could not leave the job's process group ({type(err).__name__}); they are "
            "stopped and the next call starts new ones (the results are kept)",
            RuntimeWarning,
            stacklevel=3,
        )
        return results, False
    return results, True
