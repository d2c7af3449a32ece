"""Progress: a bar on a terminal, coarse lines through the ``microdreamer.progress`` logger elsewhere."""

from __future__ import annotations

import io

import pytest

from microdreamer import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore():
    yield
    progress.reset()


def test_lines_when_not_a_terminal():
    stream = io.StringIO()
    progress.configure("auto", stream=stream, delay=0.0, interval=0.0)
    with progress.reporter("reading big.ply") as report:
        for i in range(1, 21):
            report(i / 20)
    lines = stream.getvalue().splitlines()
    # every 10 % once (the 100 % step is the closing line), then "done"
    assert [line.split(":")[1].split("(")[0].strip() for line in lines[:-1]] == [
        f"{p}%" for p in range(10, 100, 10)
    ]
    assert lines[-1].startswith("reading big.ply: done in")
    assert "\r" not in stream.getvalue()


def test_short_steps_stay_quiet():
    stream = io.StringIO()
    progress.configure("auto", stream=stream, delay=60.0, interval=0.0)
    with progress.reporter("field") as report:
        for i in range(11):
            report(i / 10)
    with progress.stage("marching cubes"):
        pass
    assert stream.getvalue() == ""


def test_stage_lines_once_the_run_is_long():
    stream = io.StringIO()
    progress.configure("lines", stream=stream, delay=0.0)
    with progress.stage("marching cubes of the 256^3 grid"):
        pass
    lines = stream.getvalue().splitlines()
    assert lines[0] == "marching cubes of the 256^3 grid ..."
    assert lines[1].startswith("marching cubes of the 256^3 grid: done in")


def test_bar_on_a_terminal():
    stream = _Tty()
    progress.configure("auto", stream=stream, delay=0.0, interval=0.0)
    with progress.reporter("density field") as report:
        report(0.5)
        report(1.0)
    text = stream.getvalue()
    assert "density field" in text and "\r" in text  # tqdm redraws in place
    assert "done in" not in text and "50%" in text  # a bar, not lines


def test_off_shows_nothing():
    stream = io.StringIO()
    progress.configure("off", stream=stream, delay=0.0, interval=0.0)
    with progress.reporter("x") as report:
        report(0.5)
    with progress.stage("y"):
        pass
    assert stream.getvalue() == ""
    with pytest.raises(ValueError):
        progress.configure("loud")


def test_subscribers_hear_every_update_and_stage_in_any_mode():
    heard = []
    progress.configure("off")
    stop = progress.subscribe(lambda desc, fraction: heard.append((desc, fraction)))
    try:
        with progress.reporter("density field") as update:
            update(0.5)
            update(1.0)
        with progress.stage("marching cubes"):
            pass
    finally:
        stop()
        progress.reset()
    assert heard == [("density field", 0.5), ("density field", 1.0), ("marching cubes", None)]
    stop()  # twice: harmless
    with progress.reporter("later") as update:
        update(0.5)
    assert len(heard) == 3  # unsubscribed


def test_a_subscriber_can_stop_the_step():
    class Stop(BaseException):
        pass

    def listener(desc, fraction):
        if fraction is not None and fraction >= 0.5:
            raise Stop()

    stop = progress.subscribe(listener)
    try:
        with pytest.raises(Stop), progress.reporter("step") as update:
            update(0.25)
            update(0.5)
    finally:
        stop()
