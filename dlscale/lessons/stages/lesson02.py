"""Stage 02, data loading (lesson 02): the loaders' workers and pinned memory, and the non-blocking copy."""

from __future__ import annotations

from typing import Any

from dlscale.lessons.stage_record import Gap, Stage, Variant, device_kind, steps_of


def _train_loader(seen: dict[str, Any]) -> dict[str, Any] | None:
    training = [loader for loader in seen["loaders"] if loader["drop_last"]]
    return training[-1] if training else (seen["loaders"][-1] if seen["loaders"] else None)


def loader_settings(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Both loaders read with ``workers`` processes, into pinned memory on a GPU only."""
    if not seen["loaders"]:
        return "no DataLoader was made"
    want = {"num_workers": args.get("workers", 0), "pin_memory": device_kind(args) == "cuda"}
    for loader in seen["loaders"]:
        got = {key: loader[key] for key in want}
        if got != want:
            return (
                f"a loader ran with {got}, but this run asked for workers={args.get('workers')} on "
                f"{device_kind(args)}: want {want} (pinned memory helps a copy to a GPU only)"
            )
    return None


def non_blocking_copies(seen: dict[str, Any], args: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Each step's inputs and targets reach the device by a non-blocking copy, whatever its spelling, and the model
    reads the copy."""
    needed = 2 * steps_of(result)
    if seen["non_blocking_copies"] < needed:
        return (
            f"{seen['non_blocking_copies']} non-blocking copies to the device in {steps_of(result)} steps (and "
            f"{seen['copies']} copies in all): each batch's inputs and targets are copied so that the host does "
            f"not wait for the copy"
        )
    if seen["uncopied_inputs"]:
        return (
            f"the model read the loader's batch itself, not its copy on the device, in {seen['uncopied_inputs']} "
            f"call(s): `.to()` returns the copy and leaves the tensor where it was, so the step must use what it "
            f"returns (the check copies as a GPU would, to a new tensor)"
        )
    return None


STAGE = Stage(
    lesson="02",
    file="02_data_loading.py",
    runs_on="kernel",
    twin={
        "warmup_steps": 0,
        "decay": "none",
        "precision": "fp32",
        "norm": "group",
        "channels_last": False,
    },  # (a constant LR, fp32, the recipe's group norm)
    by_numbers=((), ("02.a", "02.b")),
    # (on a GPU host, the CPU as well: pinned memory there is a mistake only a CPU run shows)
    switches=({"workers": 0}, {"device": "cpu"}),
    gaps=(
        Gap(
            id="02.a",
            title="the loaders' settings",
            first="loading = dict(",
            last="loading = dict(",
            asks="`loading`, the settings both loaders take: batches read by `workers` background processes, and "
            "held in page-locked host memory on a GPU only (on a CPU it only costs)",
            question="Which two settings of a loader decide who reads the batches and where they wait for the "
            "copy, and which of them depends on the device?",
            api="dict(num_workers=..., pin_memory=...), the DataLoader's two arguments; device.type",
            probe=loader_settings,
            mistakes=(
                Variant(
                    "the loader's defaults",
                    (('loading = dict(num_workers=workers, pin_memory=device.type == "cuda")', "loading = dict()"),),
                ),
                Variant(
                    "pinned memory on a CPU",
                    (
                        (
                            'loading = dict(num_workers=workers, pin_memory=device.type == "cuda")',
                            "loading = dict(num_workers=workers, pin_memory=True)",
                        ),
                    ),
                ),
                Variant(
                    "a fixed number of workers",
                    (
                        (
                            'loading = dict(num_workers=workers, pin_memory=device.type == "cuda")',
                            'loading = dict(num_workers=1, pin_memory=device.type == "cuda")',
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "a dict literal",
                    (
                        (
                            'loading = dict(num_workers=workers, pin_memory=device.type == "cuda")',
                            'loading = {"num_workers": workers, "pin_memory": device.type != "cpu"}',
                        ),
                    ),
                ),
                Variant(
                    "a name for the choice",
                    (
                        (
                            'loading = dict(num_workers=workers, pin_memory=device.type == "cuda")',
                            'pin = device.type == "cuda"\nloading = dict(pin_memory=pin, num_workers=workers)',
                        ),
                    ),
                ),
            ),
        ),
        Gap(
            id="02.b",
            title="the non-blocking copy",
            first="x, y = x.to(device, non_blocking=True)",
            last="x, y = x.to(device, non_blocking=True)",
            asks="the batch on the training device, copied so that the host goes on while the copy runs",
            question="A copy to the GPU can run while the host prepares the next step: what does a copy need to "
            "be told so that the host does not wait for it?",
            api="tensor.to(device, non_blocking=True)",
            probe=non_blocking_copies,
            mistakes=(
                Variant(
                    "the batch left where it is",
                    (("x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)", "pass"),),
                ),
                Variant(
                    "a blocking copy",
                    (
                        (
                            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                            "x, y = x.to(device), y.to(device)",
                        ),
                    ),
                ),
                Variant(
                    "the targets copied blocking",
                    (
                        (
                            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                            "x, y = x.to(device, non_blocking=True), y.to(device)",
                        ),
                    ),
                ),
                Variant(
                    "the copy's result dropped",
                    (
                        (
                            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                            "x.to(device, non_blocking=True)\ny.to(device, non_blocking=True)",
                        ),
                    ),
                ),
            ),
            alternatives=(
                Variant(
                    "device= by keyword",
                    (
                        (
                            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                            "x = x.to(device=device, non_blocking=True)\ny = y.to(device=device, non_blocking=True)",
                        ),
                    ),
                ),
                Variant(
                    "a comprehension",
                    (
                        (
                            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
                            "x, y = [t.to(device, non_blocking=True) for t in (x, y)]",
                        ),
                    ),
                ),
            ),
        ),
    ),
)
