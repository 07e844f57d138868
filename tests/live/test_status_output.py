"""``arena-schedule logs JOB``'s run output: the last lines of a log that may be gigabytes long, read from its end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from libarena.schedule.live import status


@settings(max_examples=200, deadline=None)
@given(text=hs.text(alphabet="ab\né\r", max_size=80), lines=hs.integers(1, 12), block=hs.integers(1, 9))
def test_the_last_lines_are_those_of_the_whole_file(tmp_path_factory, text, lines, block):
    """Whatever the block size (here a few bytes, so lines and a two-byte character straddle blocks), the lines
    are those of the whole file read at once."""
    path = tmp_path_factory.mktemp("log") / "output.log"
    path.write_bytes(text.encode())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(status, "_TAIL_BLOCK", block)
        whole = [line.decode(errors="replace") for line in path.read_bytes().splitlines()]
        assert status.last_lines(path, lines) == whole[-lines:]


def test_a_long_log_is_read_only_at_its_end(tmp_path):
    """A log far larger than the cap gives its last lines from at most the cap's bytes."""
    path = tmp_path / "output.log"
    with path.open("wb") as f:
        f.write(b"x" * (1 << 20) + b"\n")  # one megabyte-long line first
        f.write(b"".join(b"step %d\n" % i for i in range(10_000)))
    reads = []
    real_open = type(path).open

    class Counted:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def seek(self, *args):
            return self.handle.seek(*args)

        def read(self, n=-1):
            reads.append(n)
            return self.handle.read(n)

    def counting_open(self, *args, **kwargs):
        return Counted(real_open(self, *args, **kwargs))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(path), "open", counting_open)
        assert status.last_lines(path, 3) == ["step 9997", "step 9998", "step 9999"]
        assert sum(reads) <= status._TAIL_BLOCK + 1 and -1 not in reads  # one block, and the byte before it
        # a cap shorter than the lines wanted gives what it holds, whole lines only
        assert status.last_lines(path, 100, max_bytes=40) == [f"step {i}" for i in range(9996, 10_000)]
