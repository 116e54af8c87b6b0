"""chainoffload: decide which activations to offload to host memory, and when, to train a deep
network in less GPU memory at the least cost in time; verify the plan; carry it out.

The framework-independent core: the chain model (:class:`Chain`, :class:`Platform`), the one
schedule format (:class:`Schedule`, :class:`Transfer`; :class:`ScheduleFile` adds what a saved
schedule was made for), the one simulator (:func:`simulate`),
and solvers behind one front door (:func:`solve`).
"""

from .chain import Chain, ChainError
from .platform import Platform, PlatformError
from .result import Result, Status
from .schedule import Schedule, ScheduleError, Transfer, fixed_order
from .schedule_file import ScheduleFile
from .simulate import Timeline, Violation, keep_all_peak, simulate
from .solvers import methods, minimum_memory, register, solve
from .stalls import Stall, stalls
from .tradeoff import Tradeoff, tradeoff

__version__ = "0.1.0"

__all__ = [
    "Chain",
    "ChainError",
    "Platform",
    "PlatformError",
    "Schedule",
    "ScheduleError",
    "Transfer",
    "ScheduleFile",
    "fixed_order",
    "Timeline",
    "Violation",
    "simulate",
    "keep_all_peak",
    "Stall",
    "stalls",
    "Result",
    "Status",
    "solve",
    "methods",
    "register",
    "minimum_memory",
    "Tradeoff",
    "tradeoff",
]
