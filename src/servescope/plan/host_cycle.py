"""The host's cycle across batches, from the server's own steps at the batches ``servescope profile
--unprofiled-batches`` timed beside a capture.

Under async scheduling a step is the longer of the host's cycle (schedule, prepare, launch, take the outputs) and
the device's work, and the cycle moves with the batch in ways one capture cannot show: on the lent H100 the dense
server's cycle grew by 0.75 ms from 1 to 32 requests while its device work moved by 0.16 ms, and one H200 MoE server
stepped 15% slower at 1 request than at 16 (docs/measurements.md). The steps timed at other batches are that
cycle where it is the longer part, and an upper bound on it where the device is: :func:`host_steps` makes them the
step's floor at each batch (``Factors.host_steps``); without async scheduling the host's time adds to the
device's, and :func:`corrections` make the plan's step at each timed batch the server's own
(``Factors.step_corrections``). :func:`check_notes` sets the model's steps at those batches beside the server's.
"""

from __future__ import annotations

from collections.abc import Mapping

from servescope.core.analysis import StepReference
from servescope.plan.captured import ProductionHost

__all__ = ["check_notes", "corrections", "host_steps", "steps_note", "timed_steps"]

# A timed step this much above the model's device work is the host's cycle's, and one at most DEVICE_SETS times it
# the device's; between, the two lie within the device model's error (within 7% on the H100 pairs:
# docs/measurements.md)
HOST_SETS = 1.10
DEVICE_SETS = 1.02


def timed_steps(host: ProductionHost | None, batch: int) -> tuple[tuple[int, float], ...]:
    """``(batch, µs)``, ascending, of the server's step without the profiler at the capture's ``batch`` and at
    each other batch timed; empty unless another batch was timed."""
    if host is None or not host.reference.other_batches:
        return ()
    steps = {s.batch: s.step_us for s in host.reference.other_batches if s.step_us > 0}
    steps[batch] = host.unprofiled_us
    return tuple(sorted(steps.items()))


def host_steps(host: ProductionHost | None, batch: int) -> tuple[tuple[int, float], ...]:
    """:func:`timed_steps` where async scheduling overlaps the host (they are the step's floor); else empty."""
    return timed_steps(host, batch) if host is not None and host.overlapped else ()


def corrections(timed: tuple[tuple[int, float], ...],
                predicted_ms: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    """Without async scheduling, what each timed step adds to the model's at its batch (µs; negative where the model
    is the longer): the plan's step there becomes the server's own (``Factors.step_corrections``)."""
    return tuple((b, us - predicted_ms[b] * 1e3) for b, us in timed if b in predicted_ms)


def steps_note(steps: tuple[tuple[int, float], ...]) -> str:
    """What the plan takes from the steps timed at several batches."""
    shown = ", ".join(f"{b} → {us / 1e3:.2f} ms" for b, us in steps)
    return (f"host's cycle across batches: this server's own step without the profiler at {shown} is the async step's "
            f"floor at each batch (host_step_us_b<batch>), linear between them and the nearest one's beyond "
            f"{steps[0][0]}..{steps[-1][0]} requests (the cycle is not extrapolated); where the device's work is "
            f"the longer, the step is that work")


def check_notes(reference: StepReference, predicted_ms: Mapping[int, float], *, layout: str, context: int,
                corrected: bool = False, overlapped: bool = False) -> list[str]:
    """The calibrated model for the captured layout at each other batch the server was timed at, against the
    server's own step there (its runs' median, and their spread where several were timed). ``overlapped`` (async
    scheduling): ``predicted_ms`` is the model's device work, and each batch says which of it and the host's cycle
    sets the step; ``corrected`` (serial): the plan then takes the server's own steps."""
    cells = []
    for other in reference.other_batches:
        plan = predicted_ms.get(other.batch)
        if plan is None or other.step_us <= 0:
            continue
        measured = other.step_us / 1e3
        spread = ""
        if len(other.runs_us) > 1:
            spread = f", runs {min(other.runs_us) / 1e3:.2f}–{max(other.runs_us) / 1e3:.2f}"
        if overlapped:
            bound = ("the host's cycle sets it" if measured > HOST_SETS * plan else "the device's work sets it"
                     if measured <= DEVICE_SETS * plan else "the two lie within the model's error")
            cells.append(f"{other.batch} → device {plan:.2f} ms, server {measured:.2f} ms{spread}: {bound}")
        else:
            cells.append(f"{other.batch} → plan {plan:.2f} ms, server {measured:.2f} ms{spread} "
                         f"({plan / measured - 1:+.1%})".replace("(-", "(−"))
    if not cells:
        return []
    what = "the model's device work" if overlapped else "the model's step"
    tail = ("; the plan takes the server's own step at each (step_correction_us_b<batch>), linear between them and "
            "the nearest one's beyond" if corrected else "")
    return [f"checked against this server's own steps without the profiler ({layout}, {context} tokens a request), "
            f"{what} at each: " + "; ".join(cells) + tail]
