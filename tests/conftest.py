import pytest

from chainoffload.examples import tiny


@pytest.fixture
def chain3():
    """The tests' three-stage chain (see chainoffload.examples.tiny): keep-all peak 192 B at t=4, makespan 12 s."""
    return tiny()
