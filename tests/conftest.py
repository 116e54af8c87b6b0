import signal

import pytest

from chainoffload.examples import tiny


@pytest.fixture
def chain3():
    """The tests' three-stage chain (see chainoffload.examples.tiny): keep-all peak 192 B at t=4, makespan 12 s."""
    return tiny()


@pytest.fixture(scope="module")
def torch_one_thread():
    """One intra-op thread for the torch tests' tiny models: several times faster than two on a
    shared 2-core machine, and it changes no result (every comparison is within one process)."""
    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def ctrl_c_child():
    """Popen's ``preexec_fn`` for a child a test sends SIGINT to: SIGINT at its default, so Python
    in the child turns it into KeyboardInterrupt as at a terminal. Without it a test run started
    as a shell's background job (`cmd &`, which ignores SIGINT, and children inherit that) would
    see every child ignore the Ctrl-C."""
    return lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def python_sigint():
    """SIGINT at Python's own handler (KeyboardInterrupt) for the test, whatever the run inherited:
    started as a shell's background job (`cmd &`), Python finds SIGINT ignored and leaves it so, and
    a test that sends itself a Ctrl-C then never sees it (2 of 7 runs of
    test_ctrl_c_in_a_library_caller_raises "did not raise", the search run to its end)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
