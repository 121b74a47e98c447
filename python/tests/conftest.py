import pytest

import tidepool

# Values of 512 KiB: a 2 MiB segment holds three, so shrinking the budget to one segment
# really drops most of a dict's values.
BIG = 512 << 10


ROOM = 256 << 20


@pytest.fixture(autouse=True)
def fixed_budget():
    """Each test starts and ends with a fixed budget of 256 MiB.

    The automatic budget follows the memory pressure of the whole machine, which other processes
    (another test's antagonist, a build next door) can raise at any moment, and grows back only
    on demand: tests that count what stayed in memory need a budget that holds still.
    """
    tidepool.configure(budget=ROOM)
    yield
    tidepool.configure(budget=ROOM)


def squeeze():
    """Drops what soft memory holds (all but the newest segment), then leaves room again."""
    tidepool.configure(budget=0)
    tidepool.configure(budget=ROOM)
