"""The unit tier spawns nothing: tests/conftest.py refuses a process to any test not marked `slow`."""
import subprocess
import sys

import pytest


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(AssertionError, match=r"started a process \(.*-c pass\): mark the test @pytest.mark.slow"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.slow
def test_a_slow_test_can():
    assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\n"
