"""gpt2_48, PCIe4, 50 % (best_optimum.md's widest open gap): the cpsat rung's question, asked long.

    python benchmarks/gpt2_48_gap.py WORK WALL     # deterministic seconds, wall seconds

``cpsat_bound`` (NOTE [ cpsat bound rung ]) on the whole 50-stage model, best's makespan the target
and the ladder's fluid-LP bound stated: does any schedule end before best's? One worker, seed 0.
Prints what it proved. benchmarks/results/cpsat_rung.md, section 5, has what it gave.
"""

import json
import os
import sys
import time

import chainoffload as co
from chainoffload.bounds import offload_memory_floor
from chainoffload.bounds.cpsat_bound import cpsat_bound
from chainoffload.networks import network

chain = network("gpt2_48")
lo, hi = offload_memory_floor(chain), co.keep_all_peak(chain)
platform = co.Platform(memory=int(lo + 0.5 * (hi - lo)), bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=10e-6)
best = 0.4501025049601338  # best_optimum.json
floor = 0.42739354914815453  # the fluid LP's bound there
work, limit = float(sys.argv[1]), float(sys.argv[2])
print("memory", platform.memory, "L", chain.length, "load", os.getloadavg(), time.strftime("%H:%M:%S"), flush=True)
c, w = time.process_time(), time.perf_counter()
r = cpsat_bound(chain, platform, best, floor=floor, work=work, time_limit=limit)
print(json.dumps({"status": r.status, "value": r.value, "ratio": r.value / chain.compute_time, "best_ratio": best / chain.compute_time,
  "used": r.used if hasattr(r, "used") else None, "found": getattr(r, "makespan", None), "wall": time.perf_counter() - w, "cpu": time.process_time() - c,
  "load_after": os.getloadavg(), "end": time.strftime("%H:%M:%S")}, default=str), flush=True)
print(r)
