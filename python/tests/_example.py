"""Where the example script is, and its module for computing the expected answer."""

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "memoize.py"


def load():
    spec = importlib.util.spec_from_file_location("memoize_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed_answer(stdout):
    for line in stdout.splitlines():
        if line.startswith("answer "):
            return int(line.split()[1], 16)
    return None
