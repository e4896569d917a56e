"""The README's first example, verbatim, in a process started by `mpirun -n 2`; then its losses.

The job is joined with explicit `kdist.initialize()` arguments taken from Open
MPI's rank variables and a coordinator address the test chooses (until
`kdist.initialize()` detects Open MPI itself); the example's own
`kdist.initialize()` then finds the job joined.
"""

import os
import runpy

import kdist

kdist.initialize(
    os.environ["KDIST_TEST_COORDINATOR"],
    num_processes=int(os.environ["OMPI_COMM_WORLD_SIZE"]),
    process_id=int(os.environ["OMPI_COMM_WORLD_RANK"]),
)
namespace = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "readme.py"), run_name="__main__")
print("LOSSES", namespace["model"].history.history["loss"], flush=True)
